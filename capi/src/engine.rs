//! `EsEngine`: one engine as C sees it, a fixed-size plain struct filled
//! from the reader's `EngineState` (no pointers, nothing to free).

use std::ffi::c_char;
use std::mem::{offset_of, size_of};
use std::time::Duration;

use engine_state_reader::{EngineState, Snapshot, Status};

/// Longest engine id, in bytes (docs/FORMAT.md `MAX_ENGINE_ID_LEN`).
pub const ES_MAX_ENGINE_ID_LEN: usize = 63;
/// Size of `EsEngine.engine_id`: the longest id and its NUL.
pub const ES_ENGINE_ID_SIZE: usize = ES_MAX_ENGINE_ID_LEN + 1;

const _: () = assert!(ES_MAX_ENGINE_ID_LEN == engine_state_shm_format::MAX_ENGINE_ID_LEN);

/// Whether an engine's state may be used.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EsStatus {
    /// Alive and recent: use it.
    Fresh = 0,
    /// Heartbeat or capture too old (or the writer is unreachable), or a
    /// stamp too far ahead of the reader's clock (`ES_CODE_CLOCK_AHEAD`
    /// among the read's per-engine errors).
    Stale = 1,
    /// The writer process is gone, or the file or key was retired.
    Dead = 2,
    /// No consistent copy within the seqlock's retry bound (snapshot all zero).
    Torn = 3,
}

impl From<Status> for EsStatus {
    fn from(status: Status) -> EsStatus {
        match status {
            Status::Fresh => EsStatus::Fresh,
            Status::Stale => EsStatus::Stale,
            Status::Dead => EsStatus::Dead,
            Status::Torn => EsStatus::Torn,
        }
    }
}

/// An engine's scheduler snapshot: the 16 words of docs/FORMAT.md
/// ("Snapshot words"), same names, same order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EsSnapshot {
    /// `CLOCK_MONOTONIC` at capture, ns (same-host ages).
    pub captured_mono_ns: u64,
    /// `CLOCK_REALTIME` at capture, ns since the Unix epoch.
    pub captured_unix_ns: u64,
    /// Scheduler steps seen by the hook.
    pub step: u64,
    /// Running requests.
    pub num_running: u64,
    /// Waiting requests.
    pub num_waiting: u64,
    /// Usable KV blocks.
    pub gpu_blocks_total: u64,
    /// Free KV blocks.
    pub gpu_blocks_free: u64,
    /// Remaining prefill tokens of waiting and running requests.
    pub pending_prefill_tokens: u64,
    /// Tokens of running requests whose prefill is complete.
    pub ongoing_decode_tokens: u64,
    /// Running requests with remaining prefill.
    pub num_prefilling: u64,
    /// Largest remaining prefill of any request.
    pub max_prefill_remaining: u64,
    /// Preempted requests.
    pub num_preempted: u64,
    /// Bit 0 idle, bit 1 shutting down; ignore other bits.
    pub flags: u64,
    /// Entries in the engine's latest cache digest.
    pub cache_blocks: u64,
    /// Version of that digest; 0: the engine publishes no digest.
    pub cache_version: u64,
    /// Zero in layout version 1.
    pub reserved: [u64; 1],
}

const _: () = assert!(size_of::<EsSnapshot>() == size_of::<Snapshot>());
const _: () = assert!(offset_of!(EsSnapshot, reserved) == offset_of!(Snapshot, reserved));
// Field by field at the same offset, so the cast below is the copy of each
// field to the field of the same name. The list is shm-format's
// (`snapshot_fields!`): a field added there and not here fails to compile.
// (cbindgen reads the struct above as written, so it must be spelled out.)
macro_rules! same_offsets {
    ($($(#[$doc:meta])* $field:ident = $word:literal,)*) => {
        $(const _: () = assert!(offset_of!(EsSnapshot, $field) == offset_of!(Snapshot, $field));)*
    };
}
engine_state_shm_format::snapshot_fields!(same_offsets);

impl From<&Snapshot> for EsSnapshot {
    /// The same 16 words: `Snapshot` is the shm-format struct these fields
    /// mirror one to one (same names, same order, same size — asserted
    /// above and by the golden vectors, which set every field).
    #[inline]
    fn from(s: &Snapshot) -> EsSnapshot {
        bytemuck::cast(*s)
    }
}

/// One engine as one read saw it. Plain data: copy it freely.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EsEngine {
    /// The engine id, NUL-terminated (at most `ES_MAX_ENGINE_ID_LEN` bytes).
    pub engine_id: [c_char; ES_ENGINE_ID_SIZE],
    /// `ES_STATUS_FRESH`: the state may be used.
    pub status: EsStatus,
    /// Zero.
    pub reserved: u32,
    /// The snapshot (all zero when torn).
    pub snapshot: EsSnapshot,
    /// Time since the writer's last heartbeat, ns.
    pub heartbeat_age_ns: u64,
    /// Time since the snapshot was captured, ns.
    pub capture_age_ns: u64,
    /// The generation of the writer's file or key (a restart makes a new one).
    pub generation: u64,
    /// `CLOCK_MONOTONIC` (ns) when this was read: both ages are as of then.
    pub read_mono_ns: u64,
    /// `1 - free / total` of the KV blocks, or -1 when the engine reported
    /// no KV blocks.
    pub gpu_kv_used_frac: f64,
}

const _: () = assert!(offset_of!(EsEngine, status) == ES_ENGINE_ID_SIZE);
const _: () = assert!(offset_of!(EsEngine, snapshot) == ES_ENGINE_ID_SIZE + 8);
const _: () = assert!(size_of::<EsEngine>() == 64 + 8 + 128 + 5 * 8);

impl Default for EsEngine {
    fn default() -> Self {
        EsEngine {
            engine_id: [0; ES_ENGINE_ID_SIZE],
            status: EsStatus::Torn,
            reserved: 0,
            snapshot: EsSnapshot::default(),
            heartbeat_age_ns: 0,
            capture_age_ns: 0,
            generation: 0,
            read_mono_ns: 0,
            gpu_kv_used_frac: -1.0,
        }
    }
}

/// `d` in nanoseconds, saturating (u64 arithmetic: this runs per engine and read).
#[inline]
/// A duration in ns, saturating (the C struct's unit).
pub(crate) fn nanos(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(d.subsec_nanos()))
}

impl EsEngine {
    /// Writes `state` into `*dst` field by field, straight into the
    /// caller's memory: building the struct on the stack first and copying
    /// it costs a store-forwarding stall per engine (the id's bytes are
    /// stored narrow and reloaded wide), a third of a 1,024-engine scan.
    ///
    /// # Safety
    /// `dst` is valid for writes of one `EsEngine` (it may be
    /// uninitialized: nothing is read from it) and aligned.
    #[inline]
    pub(crate) unsafe fn write(dst: *mut EsEngine, state: &EngineState) {
        let id = state.engine_id.as_bytes();
        // Readers only report valid ids (at most 63 bytes); a longer one
        // would be cut, never overflow, and the last byte stays NUL.
        let len = id.len().min(ES_MAX_ENGINE_ID_LEN);
        let s = &state.snapshot;
        let gpu_kv_used_frac = s.gpu_kv_used_frac().unwrap_or(-1.0);
        // SAFETY: `dst` is valid for writes and aligned (the contract), so
        // is each field place; `len` <= 63 bytes fit in the 64-byte id array
        // after it is zeroed; the reader's string cannot overlap the
        // caller's array. Only writes: the old contents are never read.
        unsafe {
            let engine_id = std::ptr::addr_of_mut!((*dst).engine_id).cast::<u8>();
            engine_id.write_bytes(0, ES_ENGINE_ID_SIZE);
            std::ptr::copy_nonoverlapping(id.as_ptr(), engine_id, len);
            std::ptr::addr_of_mut!((*dst).status).write(state.status.into());
            std::ptr::addr_of_mut!((*dst).reserved).write(0);
            std::ptr::addr_of_mut!((*dst).snapshot).write(s.into());
            std::ptr::addr_of_mut!((*dst).heartbeat_age_ns).write(nanos(state.heartbeat_age));
            std::ptr::addr_of_mut!((*dst).capture_age_ns).write(nanos(state.capture_age));
            std::ptr::addr_of_mut!((*dst).generation).write(state.generation);
            std::ptr::addr_of_mut!((*dst).read_mono_ns).write(state.read_mono_ns);
            std::ptr::addr_of_mut!((*dst).gpu_kv_used_frac).write(gpu_kv_used_frac);
        }
    }
}

impl From<&EngineState> for EsEngine {
    fn from(state: &EngineState) -> EsEngine {
        let mut engine = EsEngine::default();
        // SAFETY: a local EsEngine, valid for writes and aligned.
        unsafe { EsEngine::write(&mut engine, state) };
        engine
    }
}

impl EsEngine {
    /// The engine id as text.
    pub fn engine_id(&self) -> &str {
        let len = self
            .engine_id
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(ES_ENGINE_ID_SIZE);
        // SAFETY: c_char and u8 have the same size and alignment, and `len`
        // is within the array.
        let bytes =
            unsafe { std::slice::from_raw_parts(self.engine_id.as_ptr().cast::<u8>(), len) };
        std::str::from_utf8(bytes).unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_carried() {
        let words: Vec<u64> = (1..=16).collect();
        let snapshot = Snapshot::from_words(words.clone().try_into().unwrap());
        let state = EngineState {
            engine_id: "x".repeat(63).into(),
            status: Status::Stale,
            snapshot,
            heartbeat_age: Duration::from_nanos(7),
            capture_age: Duration::from_secs(3),
            generation: 9,
            read_mono_ns: 11,
            writer: Default::default(),
            clock_ahead: false,
            cache: None,
        };
        let engine = EsEngine::from(&state);
        assert_eq!(engine.engine_id(), "x".repeat(63));
        assert_eq!(engine.engine_id[63], 0);
        assert_eq!(engine.status, EsStatus::Stale);
        // Same words in the same order.
        // SAFETY: EsSnapshot is 16 u64 words, repr(C), no padding.
        let got: [u64; 16] = unsafe { std::mem::transmute(engine.snapshot) };
        assert_eq!(got.to_vec(), words);
        assert_eq!(
            (
                engine.heartbeat_age_ns,
                engine.capture_age_ns,
                engine.generation,
                engine.read_mono_ns
            ),
            (7, 3_000_000_000, 9, 11)
        );
        // 7 free of 6 total: free is capped at total.
        assert_eq!(engine.gpu_kv_used_frac, 0.0);
        let no_blocks = EngineState {
            snapshot: Snapshot::default(),
            ..state
        };
        assert_eq!(EsEngine::from(&no_blocks).gpu_kv_used_frac, -1.0);
    }
}
