//! The engine snapshot: sixteen little-endian `u64` words (docs/FORMAT.md,
//! "Snapshot words"), and its field list, written once ([`snapshot_fields!`]).

use bytemuck::{Pod, Zeroable};

/// Number of `u64` words in a snapshot.
pub const SNAPSHOT_WORDS: usize = 16;

/// Bit 0 of [`Snapshot::flags`]: the engine has no running and no waiting requests.
pub const FLAG_IDLE: u64 = 1 << 0;
/// Bit 1 of [`Snapshot::flags`]: the engine is shutting down.
pub const FLAG_SHUTTING_DOWN: u64 = 1 << 1;

/// The snapshot's field list: the one place the field names are written.
///
/// `snapshot_fields!(callback)` calls `callback!` with every meaningful word
/// of the snapshot, in word order, as `/// docs  name = word_index,`. This
/// module defines [`Snapshot`] from it (the struct, [`Snapshot::FIELD_NAMES`],
/// the offset asserts, the by-name accessors); code in other crates that
/// must name each field as a Rust item (a Python attribute, a C struct's
/// offset check) expands its own macro from it instead of typing the list
/// again. Everything else iterates [`Snapshot::fields`] or goes by name
/// ([`Snapshot::field`], [`Snapshot::field_mut`]). What another language
/// must spell (the C header, the Go layout, the Python stub) is checked
/// against [`Snapshot::FIELD_NAMES`] by a test (docs/ARCHITECTURE.md, "Where
/// each concept lives").
///
/// ```
/// macro_rules! names {
///     ($($(#[$doc:meta])* $field:ident = $word:literal,)*) => {
///         [$(stringify!($field)),*]
///     };
/// }
/// let names = engine_state_shm_format::snapshot_fields!(names);
/// assert_eq!(names, engine_state_shm_format::Snapshot::FIELD_NAMES);
/// ```
#[macro_export]
macro_rules! snapshot_fields {
    ($callback:ident) => {
        $callback! {
            /// `CLOCK_MONOTONIC` at capture, in ns (same-host ages).
            captured_mono_ns = 0,
            /// `CLOCK_REALTIME` at capture, in ns since the Unix epoch (display, cross-host).
            captured_unix_ns = 1,
            /// Scheduler steps seen by the hook.
            step = 2,
            /// `len(scheduler.running)`.
            num_running = 3,
            /// `len(waiting) + len(kv_holding_waiting)`.
            num_waiting = 4,
            /// Usable KV blocks (`num_gpu_blocks - 1`: the null block is excluded).
            gpu_blocks_total = 5,
            /// Free KV blocks (`block_pool.get_num_free_blocks()`, evictable cached blocks included).
            gpu_blocks_free = 6,
            /// Sum over waiting and running requests of their remaining prefill tokens.
            pending_prefill_tokens = 7,
            /// Sum of `num_tokens` over running requests whose prefill is complete.
            ongoing_decode_tokens = 8,
            /// Running requests with remaining prefill > 0.
            num_prefilling = 9,
            /// Largest remaining prefill of any waiting or running request.
            max_prefill_remaining = 10,
            /// Requests currently in state `PREEMPTED`.
            num_preempted = 11,
            /// `FLAG_IDLE` (bit 0), `FLAG_SHUTTING_DOWN` (bit 1).
            flags = 12,
            /// Entries in the engine's latest cache digest (docs/FORMAT.md, "Cache residency").
            cache_blocks = 13,
            /// Version of that digest; 0: the engine publishes no digest.
            cache_version = 14,
        }
    };
}

/// Emits `Snapshot` and what must follow its field list (from `snapshot_fields!`).
macro_rules! define_snapshot {
    ($($(#[$doc:meta])* $field:ident = $word:literal,)*) => {
        /// One engine's scheduler state at one instant.
        ///
        /// The field names are the contract: they appear the same in Rust,
        /// Python, `esdump --json` and Prometheus labels
        /// ([`Snapshot::FIELD_NAMES`]). The word index of each field is its
        /// position here and is pinned by compile-time asserts and a
        /// golden-bytes test.
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
        pub struct Snapshot {
            $($(#[$doc])* pub $field: u64,)*
            /// Zero in layout version 1.
            pub reserved: [u64; SNAPSHOT_WORDS - FIELD_COUNT],
        }

        $(const _: () = assert!(core::mem::offset_of!(Snapshot, $field) == $word * 8);)*

        impl Snapshot {
            /// The names of the meaningful words, in word order.
            pub const FIELD_NAMES: [&'static str; FIELD_COUNT] = [$(stringify!($field)),*];

            /// The value of a field by its contract name (see [`Snapshot::FIELD_NAMES`]).
            pub fn field(&self, name: &str) -> Option<u64> {
                match name {
                    $(stringify!($field) => Some(self.$field),)*
                    _ => None,
                }
            }

            /// The field of this contract name, to set it (see [`Snapshot::FIELD_NAMES`]).
            pub fn field_mut(&mut self, name: &str) -> Option<&mut u64> {
                match name {
                    $(stringify!($field) => Some(&mut self.$field),)*
                    _ => None,
                }
            }
        }
    };
}

/// Number of meaningful words (named fields) in a snapshot; the rest are reserved.
pub const FIELD_COUNT: usize = 15;

snapshot_fields!(define_snapshot);

const _: () = assert!(core::mem::size_of::<Snapshot>() == SNAPSHOT_WORDS * 8);
const _: () = assert!(core::mem::align_of::<Snapshot>() == 8);
const _: () = assert!(core::mem::offset_of!(Snapshot, reserved) == FIELD_COUNT * 8);

impl Snapshot {
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

    /// The fields a writer stamps at each publish (the capture clocks): a
    /// producer never sets them.
    pub const CAPTURE_STAMPS: [&'static str; 2] = ["captured_mono_ns", "captured_unix_ns"];

    /// The fields a publisher stamps at each publish from its last cache
    /// digest (docs/FORMAT.md, "Cache residency"): a producer never sets
    /// them; both 0 while the engine publishes no digest.
    pub const CACHE_STAMPS: [&'static str; 2] = ["cache_blocks", "cache_version"];

    /// Every named field and its value, in word order (`esdump --json`, the
    /// esdump table, the Prometheus gauges).
    #[inline]
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
        Self::FIELD_NAMES.into_iter().zip(self.to_words())
    }

    /// The engine had no running and no waiting requests at capture.
    #[inline]
    pub fn is_idle(&self) -> bool {
        self.flags & FLAG_IDLE != 0
    }

    /// The engine has requests, running or waiting (the idle flag's negation).
    #[inline]
    pub fn has_requests(&self) -> bool {
        self.num_running != 0 || self.num_waiting != 0
    }

    /// Sets [`FLAG_IDLE`] from the counts: set without running and waiting
    /// requests, clear otherwise. Other flags are kept.
    #[inline]
    pub fn set_idle_from_counts(&mut self) {
        if self.has_requests() {
            self.flags &= !FLAG_IDLE;
        } else {
            self.flags |= FLAG_IDLE;
        }
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
        let named: Vec<(&str, u64)> = snap.fields().collect();
        assert_eq!(named.len(), FIELD_COUNT);
        assert_eq!(named[3], ("num_running", 103));
        assert_eq!(named[12], ("flags", 112));
    }

    #[test]
    fn fields_are_set_by_name() {
        let mut snap = Snapshot::default();
        for (index, name) in Snapshot::FIELD_NAMES.iter().enumerate() {
            *snap.field_mut(name).unwrap() = 1000 + index as u64;
        }
        assert_eq!(snap.pending_prefill_tokens, 1007);
        assert_eq!(
            snap.to_words()[..FIELD_COUNT],
            core::array::from_fn::<u64, FIELD_COUNT, _>(|i| 1000 + i as u64)
        );
        assert!(snap.field_mut("reserved").is_none());
        assert!(snap.field_mut("num_runing").is_none());
    }

    #[test]
    fn capture_stamps_are_fields() {
        for name in Snapshot::CAPTURE_STAMPS
            .into_iter()
            .chain(Snapshot::CACHE_STAMPS)
        {
            assert!(Snapshot::FIELD_NAMES.contains(&name), "{name}");
        }
    }

    #[test]
    fn counts_at_their_limit_still_have_requests() {
        let s = Snapshot {
            num_running: u64::MAX,
            num_waiting: 1,
            ..Snapshot::default()
        };
        assert!(s.has_requests());
    }

    #[test]
    fn idle_follows_the_counts_and_keeps_other_flags() {
        let mut s = Snapshot {
            flags: FLAG_SHUTTING_DOWN,
            ..Snapshot::default()
        };
        s.set_idle_from_counts();
        assert_eq!(s.flags, FLAG_IDLE | FLAG_SHUTTING_DOWN);
        assert!(!s.has_requests());
        s.num_waiting = 1;
        s.set_idle_from_counts();
        assert_eq!(s.flags, FLAG_SHUTTING_DOWN);
        assert!(s.has_requests());
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
