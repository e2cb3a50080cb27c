//! The C structs of router replicas' shared reservations (docs/FORMAT.md,
//! "Shared reservations"): the counters (`EsReservations`), one (replica,
//! engine) entry (`EsReservation`), one replica as a read saw it
//! (`EsReplica`) and one file as `es_read_router_file` read it
//! (`EsRouterFile`). Plain data, filled from the reader's and shm-format's
//! types.

use std::ffi::c_char;
use std::mem::{offset_of, size_of};

use engine_state_reader::ReplicaState;
use engine_state_shm_format::Reservations;

use crate::engine::{nanos, EsStatus, ES_ENGINE_ID_SIZE, ES_MAX_ENGINE_ID_LEN};

/// The most engines one replica holds reservations on (docs/FORMAT.md
/// `MAX_ROUTER_ENGINES`): `ES_MAX_ROUTER_ENGINES` entries per replica
/// always suffice.
pub const ES_MAX_ROUTER_ENGINES: usize = 256;

const _: () = assert!(ES_MAX_ROUTER_ENGINES == engine_state_shm_format::MAX_ROUTER_ENGINES);

/// One replica's reservations on one engine: the six counters of
/// docs/FORMAT.md ("The reservation counters"), same names, same order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EsReservations {
    /// Requests the replica reserved on the engine and has not seen complete.
    pub num_requests: u64,
    /// Prompt tokens of those requests.
    pub ongoing_tokens: u64,
    /// Prefill still to do (prompt − cache hit) of those requests before
    /// their first token.
    pub pending_prefill_tokens: u64,
    /// Prompt tokens of those requests past their first token.
    pub ongoing_decode_tokens: u64,
    /// Those requests still prefilling.
    pub num_prefilling: u64,
    /// Largest remaining prefill of any of those requests.
    pub max_prefill_remaining: u64,
}

// Field by field at the same offset as shm-format's `Reservations` (its
// `FIELD_NAMES` order; the header test checks the names).
const _: () = assert!(size_of::<EsReservations>() == size_of::<Reservations>());
const _: () =
    assert!(offset_of!(EsReservations, num_requests) == offset_of!(Reservations, num_requests));
const _: () =
    assert!(offset_of!(EsReservations, ongoing_tokens) == offset_of!(Reservations, ongoing_tokens));
const _: () = assert!(
    offset_of!(EsReservations, pending_prefill_tokens)
        == offset_of!(Reservations, pending_prefill_tokens)
);
const _: () = assert!(
    offset_of!(EsReservations, ongoing_decode_tokens)
        == offset_of!(Reservations, ongoing_decode_tokens)
);
const _: () =
    assert!(offset_of!(EsReservations, num_prefilling) == offset_of!(Reservations, num_prefilling));
const _: () = assert!(
    offset_of!(EsReservations, max_prefill_remaining)
        == offset_of!(Reservations, max_prefill_remaining)
);

/// One (replica, engine) entry: the engine id and the replica's
/// reservations on it. Plain data.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EsReservation {
    /// The engine id, NUL-terminated (at most `ES_MAX_ENGINE_ID_LEN` bytes).
    pub engine_id: [c_char; ES_ENGINE_ID_SIZE],
    /// The replica's reservations on that engine.
    pub counters: EsReservations,
}

const _: () = assert!(offset_of!(EsReservation, counters) == 64);
const _: () = assert!(size_of::<EsReservation>() == 112);

impl Default for EsReservation {
    fn default() -> Self {
        EsReservation {
            engine_id: [0; ES_ENGINE_ID_SIZE],
            counters: EsReservations::default(),
        }
    }
}

/// One peer replica as one read saw it. Its reservations are the entries
/// `first_engine .. first_engine + engine_count` of the read's
/// `EsReservation` array, in the writer's slot order (each engine once).
/// Plain data.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EsReplica {
    /// The replica id, NUL-terminated (at most `ES_MAX_ENGINE_ID_LEN` bytes).
    pub replica_id: [c_char; ES_ENGINE_ID_SIZE],
    /// `ES_STATUS_FRESH`: add its reservations to the router's own; any
    /// other status: leave them out (the engines' rule: stale heartbeat,
    /// dead writer, retired file, torn reading with no entries).
    pub status: EsStatus,
    /// Its writer's pid, in its pid namespace (display only).
    pub writer_pid: u32,
    /// Time since the replica's last heartbeat, ns.
    pub heartbeat_age_ns: u64,
    /// Time since the replica last changed its reservations, ns;
    /// `UINT64_MAX` when unknown.
    pub changed_age_ns: u64,
    /// The generation of its file or key (a restarted router's is higher).
    pub generation: u64,
    /// `CLOCK_MONOTONIC` (ns) when this was read: the ages are as of then.
    pub read_mono_ns: u64,
    /// Index of its first entry in the read's `EsReservation` array.
    pub first_engine: u64,
    /// How many entries it has there (0 to `ES_MAX_ROUTER_ENGINES`).
    pub engine_count: u64,
}

const _: () = assert!(offset_of!(EsReplica, status) == ES_ENGINE_ID_SIZE);
const _: () = assert!(size_of::<EsReplica>() == 64 + 8 + 6 * 8);

impl Default for EsReplica {
    fn default() -> Self {
        EsReplica {
            replica_id: [0; ES_ENGINE_ID_SIZE],
            status: EsStatus::Torn,
            writer_pid: 0,
            heartbeat_age_ns: 0,
            changed_age_ns: u64::MAX,
            generation: 0,
            read_mono_ns: 0,
            first_engine: 0,
            engine_count: 0,
        }
    }
}

/// The `state` of a router reservations file.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EsRouterState {
    /// Not filled in (a default `EsRouterFile`).
    Unknown = 0,
    /// Written by its router: usable (while its heartbeat is recent).
    Active = 1,
    /// Its router closed or replaced it: do not use it.
    Retired = 2,
}

/// One router reservations file's header and control words
/// (docs/FORMAT.md, "The reservations file"), as `es_read_router_file`
/// read it; its live slots go into the caller's `EsReservation` array.
/// Plain data.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EsRouterFile {
    /// The replica id (the file's name), NUL-terminated.
    pub replica_id: [c_char; ES_ENGINE_ID_SIZE],
    /// Active or retired (a retired file's reservations must not be used).
    pub state: EsRouterState,
    /// The writer's pid, in its pid namespace.
    pub writer_pid: u32,
    /// The writer's heartbeat period, microseconds.
    pub heartbeat_period_us: u32,
    /// Slots in the file (at most `ES_MAX_ROUTER_ENGINES`).
    pub capacity: u32,
    /// Inode of the writer's pid namespace; 0 when unknown.
    pub writer_pid_ns: u64,
    /// `CLOCK_REALTIME` when the file was created, ns since the epoch.
    pub created_unix_ns: u64,
    /// The file's generation (1 for a replica id's first file).
    pub generation: u64,
    /// The seqlock sequence the reading was published under (even).
    pub seq: u64,
    /// The writer's last heartbeat, its `CLOCK_MONOTONIC` ns.
    pub heartbeat_mono_ns: u64,
    /// The writer's `CLOCK_MONOTONIC` at its last change, ns.
    pub changed_mono_ns: u64,
    /// Live slots: the array length the entries need.
    pub count: u64,
}

const _: () = assert!(offset_of!(EsRouterFile, state) == ES_ENGINE_ID_SIZE);
const _: () = assert!(size_of::<EsRouterFile>() == 64 + 16 + 7 * 8);

impl Default for EsRouterFile {
    fn default() -> Self {
        EsRouterFile {
            replica_id: [0; ES_ENGINE_ID_SIZE],
            state: EsRouterState::Unknown,
            writer_pid: 0,
            heartbeat_period_us: 0,
            capacity: 0,
            writer_pid_ns: 0,
            created_unix_ns: 0,
            generation: 0,
            seq: 0,
            heartbeat_mono_ns: 0,
            changed_mono_ns: 0,
            count: 0,
        }
    }
}

/// A valid id (at most 63 bytes) into a NUL-padded 64-byte C field.
pub(crate) fn id_field(id: &str) -> [c_char; ES_ENGINE_ID_SIZE] {
    let mut field = [0 as c_char; ES_ENGINE_ID_SIZE];
    for (dst, src) in field
        .iter_mut()
        .zip(id.as_bytes().iter().take(ES_MAX_ENGINE_ID_LEN))
    {
        *dst = *src as c_char;
    }
    field
}

/// The text of a NUL-terminated 64-byte C id field.
fn field_text(field: &[c_char; ES_ENGINE_ID_SIZE]) -> &str {
    let len = field
        .iter()
        .position(|&c| c == 0)
        .unwrap_or(ES_ENGINE_ID_SIZE);
    // SAFETY: c_char and u8 have the same size and alignment; `len` is
    // within the array.
    let bytes = unsafe { std::slice::from_raw_parts(field.as_ptr().cast::<u8>(), len) };
    std::str::from_utf8(bytes).unwrap_or("")
}

impl EsReservation {
    pub(crate) fn new(engine_id: &str, counters: &Reservations) -> EsReservation {
        EsReservation {
            engine_id: id_field(engine_id),
            counters: bytemuck::cast(*counters),
        }
    }

    /// The engine id as text.
    pub fn engine_id(&self) -> &str {
        field_text(&self.engine_id)
    }
}

impl EsReplica {
    pub(crate) fn new(state: &ReplicaState, first_engine: usize) -> EsReplica {
        EsReplica {
            replica_id: id_field(&state.replica_id),
            status: state.status.into(),
            writer_pid: state.writer_pid,
            heartbeat_age_ns: nanos(state.heartbeat_age),
            changed_age_ns: state.changed_age.map_or(u64::MAX, nanos),
            generation: state.generation,
            read_mono_ns: state.read_mono_ns,
            first_engine: first_engine as u64,
            engine_count: state.engines.len() as u64,
        }
    }

    /// The replica id as text.
    pub fn replica_id(&self) -> &str {
        field_text(&self.replica_id)
    }
}

impl EsRouterFile {
    /// The replica id as text.
    pub fn replica_id(&self) -> &str {
        field_text(&self.replica_id)
    }
}
