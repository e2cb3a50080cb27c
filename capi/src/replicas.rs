//! Router replicas' shared reservations as C sees them (docs/FORMAT.md,
//! "Shared reservations"), read the way engines are: `es_open_replicas`
//! opens the place (the engines' URI; the reader's own replica left out),
//! `es_read_replicas` fills the caller's arrays (`EsReplica`s and the
//! `EsReservation`s they index), `es_replica_error_count` /
//! `es_replica_error` describe the per-replica errors, and
//! `es_close_replicas` frees the handle (`router_file.rs`:
//! `es_read_router_file`, one file; `reservation.rs`: the structs). Every
//! rule is the reader's: this file only copies what it decides.

use std::ffi::c_char;
use std::sync::{Mutex, MutexGuard};

use engine_state_reader::{open_replicas, ReplicaReading, ReplicaSource};
use engine_state_shm_format::EngineId;

use crate::c_string::text_arg;
use crate::code::EsCode;
use crate::digest::check_out;
use crate::ffi_call::{ffi_call, Failure};
use crate::handle::{
    close_handle, describe_error, lock_handle, open_handle, state_uri, write_error_count, ErrorOut,
};
use crate::options::{reader_options, EsOptions};
use crate::reservation::{EsReplica, EsReservation};

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
    // SAFETY: the caller's contract, passed on.
    unsafe { lock_handle(replicas, "replicas", |r| &r.inner) }
}

/// Opens the router replicas' reservations at the place `uri` names — the
/// URI the engines are read from (`es_open`'s forms and default; on shared
/// memory the replicas' files are in `<dir>.routers`) — leaving out
/// `own_replica_id` (the reading router's own replica id, so it never adds
/// its own reservations twice; null: leave none out), with `options` (null:
/// the defaults; the freshness fields judge replicas as they judge
/// engines). Stores the new handle in `*out` (null on failure); the caller
/// frees it with `es_close_replicas`. A routers directory that does not
/// exist yet is no replica, not an error. On Redis the replicas are the ids
/// of `<prefix>routers` and their values `<prefix>router:<id>`
/// (docs/REDIS.md, "Key schema"), judged as engine records are (a build
/// without Redis support: `ES_CODE_BAD_URI`).
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
        let make = || {
            // SAFETY: null or NUL-terminated (the caller's contract).
            let uri = unsafe { state_uri(uri) }?;
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
            Ok(EsReplicas {
                inner: Mutex::new(ReplicasInner {
                    source,
                    reading: ReplicaReading::default(),
                }),
            })
        };
        // SAFETY: `out` is null or writable (the caller's contract).
        unsafe { open_handle(out, make) }
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
        // SAFETY: null or a live handle closed once (the caller's contract).
        unsafe { close_handle(replicas) };
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
/// `source` is a live handle from `es_open_replicas`; `replicas` is null
/// or has `capacity` writable `EsReplica`s; `engines` is null or has
/// `engines_capacity` writable `EsReservation`s; `count` and
/// `engine_count` are null (an error) or writable.
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

/// `es_error_count` for the per-replica errors of the last
/// `es_read_replicas` (files or keys that could not be read as a replica).
///
/// # Safety
/// As `es_error_count`'s, `source` from `es_open_replicas`.
#[no_mangle]
pub unsafe extern "C" fn es_replica_error_count(
    source: *mut EsReplicas,
    count: *mut usize,
) -> EsCode {
    ffi_call(|| {
        // SAFETY: writable or null (the caller's contract); a live handle.
        unsafe { write_error_count(count, || Ok(lock(source)?.reading.errors.len())) }
    })
}

/// `es_engine_error` for per-replica error `index` (from 0 to
/// `es_replica_error_count - 1`) of the last `es_read_replicas`, with the
/// same buffers and rules. The class is a per-replica code (100 or more:
/// `ES_CODE_NOT_ROUTER`, `ES_CODE_UNKNOWN_VERSION`, `ES_CODE_WRONG_SIZE`,
/// `ES_CODE_CORRUPT_ROUTER`, `ES_CODE_REFUSED_ENTRY`, `ES_CODE_IO`, or one
/// this header does not know yet; a torn reading is no error, only
/// `ES_STATUS_TORN`); `name` gets the replica id or entry name.
///
/// # Safety
/// As `es_engine_error`'s, `source` from `es_open_replicas`.
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
        let out = ErrorOut {
            class_out,
            name,
            name_size,
            message,
            message_size,
        };
        // SAFETY: the caller's contract on the out-pointers.
        unsafe {
            describe_error(
                &inner.reading.errors,
                index,
                "per-replica",
                "es_replica_error_count",
                out,
            )
        }
    })
}

#[cfg(test)]
#[path = "replicas_tests.rs"]
mod tests;
