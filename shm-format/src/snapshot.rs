//! The engine snapshot: sixteen little-endian `u64` words (DESIGN §3).

use bytemuck::{Pod, Zeroable};

/// Number of `u64` words in a snapshot.
pub const SNAPSHOT_WORDS: usize = 16;

/// Bit 0 of [`Snapshot::flags`]: the engine has no running and no waiting requests.
pub const FLAG_IDLE: u64 = 1 << 0;
/// Bit 1 of [`Snapshot::flags`]: the engine is shutting down.
pub const FLAG_SHUTTING_DOWN: u64 = 1 << 1;

/// One engine's scheduler state at one instant.
///
/// The field names are the contract: they appear the same in Rust, Python,
/// `esdump --json` and Prometheus labels ([`Snapshot::FIELD_NAMES`]).
/// The word index of each field is its position here and is pinned by
/// compile-time asserts and a golden-bytes test.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct Snapshot {
    /// `CLOCK_MONOTONIC` at capture, in ns (same-host ages).
    pub captured_mono_ns: u64,
    /// `CLOCK_REALTIME` at capture, in ns since the Unix epoch (display, cross-host).
    pub captured_unix_ns: u64,
    /// Scheduler steps seen by the hook.
    pub step: u64,
    /// `len(scheduler.running)`.
    pub num_running: u64,
    /// `len(waiting) + len(kv_holding_waiting)`.
    pub num_waiting: u64,
    /// Usable KV blocks (`num_gpu_blocks - 1`: the null block is excluded).
    pub gpu_blocks_total: u64,
    /// Free KV blocks (`block_pool.get_num_free_blocks()`, evictable cached blocks included).
    pub gpu_blocks_free: u64,
    /// Sum over waiting and running requests of their remaining prefill tokens.
    pub pending_prefill_tokens: u64,
    /// Sum of `num_tokens` over running requests whose prefill is complete.
    pub ongoing_decode_tokens: u64,
    /// Running requests with remaining prefill > 0.
    pub num_prefilling: u64,
    /// Largest remaining prefill of any waiting or running request.
    pub max_prefill_remaining: u64,
    /// Requests currently in state `PREEMPTED`.
    pub num_preempted: u64,
    /// [`FLAG_IDLE`], [`FLAG_SHUTTING_DOWN`].
    pub flags: u64,
    /// Zero in layout version 1.
    pub reserved: [u64; 3],
}

const _: () = assert!(core::mem::size_of::<Snapshot>() == SNAPSHOT_WORDS * 8);
const _: () = assert!(core::mem::align_of::<Snapshot>() == 8);
const _: () = assert!(core::mem::offset_of!(Snapshot, captured_mono_ns) == 0);
const _: () = assert!(core::mem::offset_of!(Snapshot, step) == 2 * 8);
const _: () = assert!(core::mem::offset_of!(Snapshot, gpu_blocks_total) == 5 * 8);
const _: () = assert!(core::mem::offset_of!(Snapshot, pending_prefill_tokens) == 7 * 8);
const _: () = assert!(core::mem::offset_of!(Snapshot, max_prefill_remaining) == 10 * 8);
const _: () = assert!(core::mem::offset_of!(Snapshot, flags) == 12 * 8);
const _: () = assert!(core::mem::offset_of!(Snapshot, reserved) == 13 * 8);

impl Snapshot {
    /// The names of the 13 meaningful words, in word order.
    pub const FIELD_NAMES: [&'static str; 13] = [
        "captured_mono_ns",
        "captured_unix_ns",
        "step",
        "num_running",
        "num_waiting",
        "gpu_blocks_total",
        "gpu_blocks_free",
        "pending_prefill_tokens",
        "ongoing_decode_tokens",
        "num_prefilling",
        "max_prefill_remaining",
        "num_preempted",
        "flags",
    ];

    /// The snapshot as its 16 words, in layout order.
    #[inline]
    pub fn to_words(&self) -> [u64; SNAPSHOT_WORDS] {
        bytemuck::cast(*self)
    }

    /// A snapshot from its 16 words, in layout order.
    #[inline]
    pub fn from_words(words: [u64; SNAPSHOT_WORDS]) -> Snapshot {
        bytemuck::cast(words)
    }

    /// The 128 little-endian bytes of the snapshot (the Redis value's payload).
    pub fn to_le_bytes(&self) -> [u8; SNAPSHOT_WORDS * 8] {
        let mut out = [0u8; SNAPSHOT_WORDS * 8];
        for (chunk, word) in out.chunks_exact_mut(8).zip(self.to_words()) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// The snapshot from its 128 little-endian bytes.
    pub fn from_le_bytes(bytes: &[u8; SNAPSHOT_WORDS * 8]) -> Snapshot {
        let mut words = [0u64; SNAPSHOT_WORDS];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            *word = u64::from_le_bytes(chunk.try_into().expect("chunks_exact(8)"));
        }
        Snapshot::from_words(words)
    }

    /// The value of a field by its contract name (see [`Snapshot::FIELD_NAMES`]).
    pub fn field(&self, name: &str) -> Option<u64> {
        let index = Self::FIELD_NAMES.iter().position(|n| *n == name)?;
        Some(self.to_words()[index])
    }

    /// The engine had no running and no waiting requests at capture.
    #[inline]
    pub fn is_idle(&self) -> bool {
        self.flags & FLAG_IDLE != 0
    }

    /// The engine was shutting down at capture.
    #[inline]
    pub fn is_shutting_down(&self) -> bool {
        self.flags & FLAG_SHUTTING_DOWN != 0
    }

    /// `1 - free / total`: the used fraction of the KV cache, derived by readers
    /// (never stored). `None` when the engine reported no blocks.
    #[inline]
    pub fn gpu_kv_used_frac(&self) -> Option<f64> {
        if self.gpu_blocks_total == 0 {
            return None;
        }
        let free = self.gpu_blocks_free.min(self.gpu_blocks_total);
        Some(1.0 - free as f64 / self.gpu_blocks_total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_follow_word_order() {
        let words: [u64; SNAPSHOT_WORDS] = core::array::from_fn(|i| 100 + i as u64);
        let snap = Snapshot::from_words(words);
        for (index, name) in Snapshot::FIELD_NAMES.iter().enumerate() {
            assert_eq!(snap.field(name), Some(100 + index as u64), "{name}");
        }
        assert_eq!(snap.num_running, 103);
        assert_eq!(snap.flags, 112);
        assert_eq!(snap.field("reserved"), None);
    }

    #[test]
    fn le_bytes_round_trip() {
        let words: [u64; SNAPSHOT_WORDS] = core::array::from_fn(|i| (i as u64) << 56 | 7);
        let snap = Snapshot::from_words(words);
        let bytes = snap.to_le_bytes();
        assert_eq!(bytes[0], 7);
        assert_eq!(bytes[15], 1);
        assert_eq!(Snapshot::from_le_bytes(&bytes), snap);
    }

    #[test]
    fn kv_used_fraction() {
        let mut snap = Snapshot {
            gpu_blocks_total: 200,
            gpu_blocks_free: 50,
            ..Snapshot::default()
        };
        assert_eq!(snap.gpu_kv_used_frac(), Some(0.75));
        snap.gpu_blocks_free = 500; // inconsistent input is clamped, never negative
        assert_eq!(snap.gpu_kv_used_frac(), Some(0.0));
        snap.gpu_blocks_total = 0;
        assert_eq!(snap.gpu_kv_used_frac(), None);
    }
}
