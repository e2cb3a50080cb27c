//! `es_read_router_file`: one router replica's reservations file read as
//! a reader does (docs/FORMAT.md, "Writing and reading reservations"): the
//! golden vectors' reading from C. Every rule is shm-format's.

use std::ffi::c_char;

use engine_state_shm_format::{Error as FormatError, RouterFile};

use crate::c_string::text_arg;
use crate::code::EsCode;
use crate::digest::check_out;
use crate::ffi_call::{ffi_call, Failure};
use crate::reservation::{id_field, EsReservation, EsRouterFile, EsRouterState};

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
