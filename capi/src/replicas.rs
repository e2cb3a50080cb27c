//! Router replicas' shared reservations as C sees them (docs/FORMAT.md,
//! "Shared reservations"), read the way engines are: `es_open_replicas`
//! opens the place (the engines' URI; the reader's own replica left out),
//! `es_read_replicas` fills the caller's arrays (`EsReplica`s and the
//! `EsReservation`s they index), `es_replica_error_count` /
//! `es_replica_error` describe the per-replica errors, and
//! `es_close_replicas` frees the handle. `es_read_router_file` reads one
//! replica's file as the format's rules say (the golden vectors). Every
//! rule is the reader's or shm-format's: this file only copies what they
//! decide.

use std::ffi::c_char;
use std::mem::{offset_of, size_of};
use std::sync::{Mutex, MutexGuard, TryLockError};

use engine_state_reader::{open_replicas, ReplicaReading, ReplicaSource, ReplicaState, StateUri};
use engine_state_shm_format::{EngineId, Error as FormatError, Reservations, RouterFile};

use crate::c_string::{copy_arg, text_arg};
use crate::code::EsCode;
use crate::digest::check_out;
use crate::engine::{nanos, EsStatus, ES_ENGINE_ID_SIZE, ES_MAX_ENGINE_ID_LEN};
use crate::ffi_call::{ffi_call, Failure};
use crate::options::{reader_options, EsOptions};

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
    /// Prompt plus expected output tokens of those requests.
    pub ongoing_tokens: u64,
    /// Prefill tokens of those requests not yet prefilled.
    pub pending_prefill_tokens: u64,
    /// Tokens of those requests whose prefill is done.
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
fn id_field(id: &str) -> [c_char; ES_ENGINE_ID_SIZE] {
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
    fn new(engine_id: &str, counters: &Reservations) -> EsReservation {
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
    fn new(state: &ReplicaState, first_engine: usize) -> EsReplica {
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

/// An open place router replicas publish their reservations into (opaque).
/// Made by `es_open_replicas`, freed by `es_close_replicas`; one call at a
/// time (`ES_CODE_BUSY` otherwise), as an `EsSource`.
pub struct EsReplicas {
    inner: Mutex<ReplicasInner>,
}

struct ReplicasInner {
    source: Box<dyn ReplicaSource>,
    /// The last read (its per-replica errors for `es_replica_error`).
    reading: ReplicaReading,
}

impl std::fmt::Debug for EsReplicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EsReplicas").finish_non_exhaustive()
    }
}

/// The handle's state, or `Busy` while another thread is inside a call.
///
/// # Safety
/// `replicas` is null or a handle from `es_open_replicas` not yet closed.
unsafe fn lock<'a>(replicas: *mut EsReplicas) -> Result<MutexGuard<'a, ReplicasInner>, Failure> {
    if replicas.is_null() {
        return Err(Failure::new(EsCode::NullArgument, "replicas is null"));
    }
    // SAFETY: a live handle (the caller's contract); only shared references
    // are made to it, the Mutex serializes the rest.
    let replicas = unsafe { &*replicas };
    match replicas.inner.try_lock() {
        Ok(inner) => Ok(inner),
        // Every read clears and refills what it uses: go on after a panic.
        Err(TryLockError::Poisoned(poisoned)) => Ok(poisoned.into_inner()),
        Err(TryLockError::WouldBlock) => Err(Failure::new(
            EsCode::Busy,
            "another thread is inside a call on this replicas handle; use one handle per thread",
        )),
    }
}

/// Opens the router replicas' reservations at the place `uri` names — the
/// URI the engines are read from (`es_open`'s forms and default; on shared
/// memory the replicas' files are in `<dir>.routers`) — leaving out
/// `own_replica_id` (the reading router's own replica id, so it never adds
/// its own reservations twice; null: leave none out), with `options` (null:
/// the defaults; the freshness fields judge replicas as they judge
/// engines). Stores the new handle in `*out` (null on failure); the caller
/// frees it with `es_close_replicas`. A routers directory that does not
/// exist yet is no replica, not an error. Redis: `ES_CODE_BAD_URI` while
/// this build cannot read replicas there.
///
/// # Safety
/// `uri` and `own_replica_id` are null or NUL-terminated; `options` is null
/// or an `EsOptions` of at least its `struct_size` bytes; `out` is null (an
/// error) or writable.
#[no_mangle]
pub unsafe extern "C" fn es_open_replicas(
    uri: *const c_char,
    own_replica_id: *const c_char,
    options: *const EsOptions,
    out: *mut *mut EsReplicas,
) -> EsCode {
    ffi_call(|| {
        if out.is_null() {
            return Err(Failure::new(EsCode::NullArgument, "out is null"));
        }
        // SAFETY: writable (the caller's contract); null until success.
        unsafe { out.write(std::ptr::null_mut()) };
        let uri = if uri.is_null() {
            StateUri::from_env()?
        } else {
            // SAFETY: NUL-terminated (the caller's contract).
            StateUri::parse(unsafe { text_arg(uri, "uri") }?)?
        };
        let own = if own_replica_id.is_null() {
            None
        } else {
            // SAFETY: NUL-terminated (the caller's contract).
            let own = unsafe { text_arg(own_replica_id, "own_replica_id") }?;
            EngineId::new(own).map_err(|e| {
                Failure::new(
                    EsCode::BadArgument,
                    format!("own_replica_id {own:?} is no valid replica id: {e}"),
                )
            })?;
            Some(own)
        };
        // SAFETY: the caller's contract, passed on.
        let options = unsafe { reader_options(options) }?;
        let source = open_replicas(&uri, own, options)?;
        let handle = Box::new(EsReplicas {
            inner: Mutex::new(ReplicasInner {
                source,
                reading: ReplicaReading::default(),
            }),
        });
        // SAFETY: writable (checked above); ownership passes to the caller.
        unsafe { out.write(Box::into_raw(handle)) };
        Ok(())
    })
}

/// Closes a replicas handle and frees everything it holds. Null is ignored.
///
/// # Safety
/// `replicas` is null or a handle from `es_open_replicas` that no thread is
/// using and that is closed only once; it must not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn es_close_replicas(replicas: *mut EsReplicas) {
    let _ = ffi_call(|| {
        if !replicas.is_null() {
            // SAFETY: made by Box::into_raw in es_open_replicas, closed once.
            drop(unsafe { Box::from_raw(replicas) });
        }
        Ok(())
    });
}

/// Reads every peer replica, sorted by id (the handle's own replica id left
/// out), into the caller's arrays: `replicas` (`capacity` of them) and
/// `engines` (`engines_capacity` entries), and sets `*count` to the number
/// of replicas and `*engine_count` to the number of entries there are.
/// Each `EsReplica` names its entries (`first_engine`, `engine_count`).
/// Replicas are written whole, in order, while both arrays have room; when
/// one does not fit, the replicas before it were written and the result is
/// `ES_CODE_BUFFER_TOO_SMALL` (the counts say what is needed: `replicas =
/// NULL, capacity = 0, engines = NULL, engines_capacity = 0` just counts;
/// `engines_capacity = capacity × ES_MAX_ROUTER_ENGINES` always suffices).
/// Only `ES_STATUS_FRESH` replicas' reservations may be added to a router's
/// own. Replicas that could not be read (bad files, foreign entries) are
/// not in the array: `es_replica_error_count` and `es_replica_error`
/// describe them. An error of the whole source is the result.
///
/// # Safety
/// `source` is a live handle from `es_open_replicas`; `replicas` is null or has `capacity` writable
/// `EsReplica`s; `engines` is null or has `engines_capacity` writable
/// `EsReservation`s; `count` and `engine_count` are null (an error) or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn es_read_replicas(
    source: *mut EsReplicas,
    replicas: *mut EsReplica,
    capacity: usize,
    count: *mut usize,
    engines: *mut EsReservation,
    engines_capacity: usize,
    engine_count: *mut usize,
) -> EsCode {
    ffi_call(|| {
        if count.is_null() || engine_count.is_null() {
            return Err(Failure::new(
                EsCode::NullArgument,
                "count or engine_count is null",
            ));
        }
        check_out(replicas, capacity, "replicas")?;
        check_out(engines, engines_capacity, "engines")?;
        // SAFETY: writable (checked non-null above; the contract).
        unsafe {
            count.write(0);
            engine_count.write(0);
        }
        // SAFETY: a live handle (the caller's contract).
        let mut inner = unsafe { lock(source) }?;
        let ReplicasInner { source, reading } = &mut *inner;
        source.read_into(reading)?;
        let (mut written, mut entries, mut fits) = (0usize, 0usize, true);
        for state in &reading.replicas {
            let n = state.engines.len();
            if fits && written < capacity && entries + n <= engines_capacity {
                // SAFETY: written < capacity and entries + n <=
                // engines_capacity: in the caller's arrays (the contract);
                // `write` never reads the caller's memory.
                unsafe {
                    replicas.add(written).write(EsReplica::new(state, entries));
                    for (i, (engine_id, counters)) in state.engines.iter().enumerate() {
                        engines
                            .add(entries + i)
                            .write(EsReservation::new(engine_id, counters));
                    }
                }
                written += 1;
            } else {
                fits = false;
            }
            entries += n;
        }
        let total = reading.replicas.len();
        // SAFETY: writable (as above).
        unsafe {
            count.write(total);
            engine_count.write(entries);
        }
        if !fits {
            return Err(Failure::new(
                EsCode::BufferTooSmall,
                format!(
                    "{total} replicas with {entries} reservation entries, but the arrays hold \
                     {capacity} and {engines_capacity} (the first {written} replicas were \
                     written); pass arrays of at least the counts written back"
                ),
            ));
        }
        Ok(())
    })
}

/// Sets `*count` to the number of per-replica errors of the last
/// `es_read_replicas` (files or keys that could not be read as a replica).
///
/// # Safety
/// `source` is a live handle from `es_open_replicas`; `count` is null (an
/// error) or writable.
#[no_mangle]
pub unsafe extern "C" fn es_replica_error_count(
    source: *mut EsReplicas,
    count: *mut usize,
) -> EsCode {
    ffi_call(|| {
        if count.is_null() {
            return Err(Failure::new(EsCode::NullArgument, "count is null"));
        }
        // SAFETY: a live handle (the caller's contract).
        let inner = unsafe { lock(source) }?;
        // SAFETY: writable (checked non-null above).
        unsafe { count.write(inner.reading.errors.len()) };
        Ok(())
    })
}

/// Describes per-replica error `index` (from 0 to `es_replica_error_count -
/// 1`) of the last `es_read_replicas`, as `es_engine_error` does an
/// engine's: its class in `*class_out` (a per-replica code, 100 or more:
/// `ES_CODE_NOT_ROUTER`, `ES_CODE_UNKNOWN_VERSION`, `ES_CODE_WRONG_SIZE`,
/// `ES_CODE_CORRUPT_ROUTER`, `ES_CODE_REFUSED_ENTRY`, `ES_CODE_IO`,
/// `ES_CODE_CLOCK_AHEAD`, or one this header does not know yet), the
/// replica id or entry name in `name` and the message in `message`, each
/// NUL-terminated (a buffer may be null with size 0 to skip it; one too
/// small gets what fits and the result is `ES_CODE_BUFFER_TOO_SMALL`).
/// `class_out` may be null.
///
/// # Safety
/// `source` is a live handle from `es_open_replicas`; `class_out` is null
/// or writable; `name` and `message` are null or have `name_size` /
/// `message_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn es_replica_error(
    source: *mut EsReplicas,
    index: usize,
    class_out: *mut EsCode,
    name: *mut c_char,
    name_size: usize,
    message: *mut c_char,
    message_size: usize,
) -> EsCode {
    ffi_call(|| {
        // SAFETY: a live handle (the caller's contract).
        let inner = unsafe { lock(source) }?;
        let errors = &inner.reading.errors;
        let error = errors.get(index).ok_or_else(|| {
            Failure::new(
                EsCode::NotFound,
                format!(
                    "no per-replica error {index}: the last read has {} (es_replica_error_count)",
                    errors.len()
                ),
            )
        })?;
        if !class_out.is_null() {
            // SAFETY: writable (the caller's contract).
            unsafe { class_out.write(EsCode::of(&error.error)) };
        }
        // SAFETY: the caller's contract on both buffers.
        let copied_name = unsafe { copy_arg(&error.name, name, name_size, "name") };
        // SAFETY: as above.
        let copied_message =
            unsafe { copy_arg(&error.error.to_string(), message, message_size, "message") };
        copied_name.and(copied_message)
    })
}

/// Reads the router reservations file at `path` (`<dir>.routers/<replica
/// id>`) as a reader does: never blocking, never following a link,
/// validated in the order of docs/FORMAT.md, "Writing and reading
/// reservations" (the file's name must be the replica id it holds), read
/// once under its seqlock. On success `*file` has its header and control
/// words and `engines` the first `capacity` of its `file->count` live
/// slots, in slot order (`engines = NULL, capacity = 0` learns the count:
/// `ES_CODE_BUFFER_TOO_SMALL` when it is not 0; `ES_MAX_ROUTER_ENGINES`
/// always suffices). A retired file is read (`ES_ROUTER_STATE_RETIRED`): a
/// router must not use it. No freshness is judged (`es_read_replicas`
/// does). Failures are the format's classes: `ES_CODE_REFUSED_ENTRY`,
/// `ES_CODE_NOT_ROUTER`, `ES_CODE_UNKNOWN_VERSION`, `ES_CODE_WRONG_SIZE`,
/// `ES_CODE_CORRUPT_ROUTER`, `ES_CODE_TORN` (read it again later), or
/// `ES_CODE_IO` (it cannot be opened, e.g. missing).
///
/// # Safety
/// `path` is NUL-terminated; `file` is null (an error) or writable;
/// `engines` is null or has `capacity` writable `EsReservation`s.
#[no_mangle]
pub unsafe extern "C" fn es_read_router_file(
    path: *const c_char,
    file: *mut EsRouterFile,
    engines: *mut EsReservation,
    capacity: usize,
) -> EsCode {
    ffi_call(|| {
        if file.is_null() {
            return Err(Failure::new(EsCode::NullArgument, "file is null"));
        }
        check_out(engines, capacity, "engines")?;
        // SAFETY: NUL-terminated (the caller's contract).
        let path = unsafe { text_arg(path, "path") }?;
        let format_failure = |error: FormatError| {
            let code = match &error {
                FormatError::Router { error, .. } => EsCode::of_router(error),
                FormatError::RefusedEntry { .. } => EsCode::RefusedEntry,
                FormatError::Io { .. } => EsCode::Io,
                _ => EsCode::Other,
            };
            Failure::new(code, error.to_string())
        };
        let router = RouterFile::open(path).map_err(format_failure)?;
        let record = router
            .read()
            .map_err(|error| Failure::new(EsCode::of_router(&error), format!("{path}: {error}")))?;
        let header = router.header();
        let out = EsRouterFile {
            replica_id: id_field(record.replica_id.as_str()),
            state: if router.is_retired() {
                EsRouterState::Retired
            } else {
                EsRouterState::Active
            },
            writer_pid: header.writer_pid,
            heartbeat_period_us: header.heartbeat_period_us,
            capacity: header.capacity,
            writer_pid_ns: header.writer_pid_ns,
            created_unix_ns: header.created_unix_ns,
            generation: record.generation,
            seq: record.seq,
            heartbeat_mono_ns: record.heartbeat_mono_ns,
            changed_mono_ns: record.changed_mono_ns,
            count: record.engines.len() as u64,
        };
        // SAFETY: writable (checked above).
        unsafe { file.write(out) };
        let n = record.engines.len().min(capacity);
        for (i, (engine_id, counters)) in record.engines.iter().take(n).enumerate() {
            // SAFETY: i < n <= capacity writable entries (the contract).
            unsafe {
                engines
                    .add(i)
                    .write(EsReservation::new(engine_id.as_str(), counters))
            };
        }
        if record.engines.len() > capacity {
            return Err(Failure::new(
                EsCode::BufferTooSmall,
                format!(
                    "{} reservation entries, but the array holds {capacity} (the first {n} were \
                     written); pass an array of at least file->count",
                    record.engines.len()
                ),
            ));
        }
        Ok(())
    })
}
