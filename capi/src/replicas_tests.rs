//! `es_open_replicas` / `es_read_replicas` through the `extern "C"`
//! functions: arrays too small, bad arguments.

use std::ffi::CString;
use std::ptr::{null, null_mut};

use engine_state_shm_format::{RouterFileWriter, RouterWriterOptions};

use super::*;
use crate::engine::EsStatus;
use crate::reservation::EsReplica;
use engine_state_shm_format::Reservations;

fn open(uri: &str, own: Option<&str>) -> (EsCode, *mut EsReplicas) {
    let uri = CString::new(uri).unwrap();
    let own = own.map(|o| CString::new(o).unwrap());
    let mut out = null_mut();
    // SAFETY: C strings (or null), default options, a writable out-pointer.
    let code = unsafe {
        es_open_replicas(
            uri.as_ptr(),
            own.as_ref().map_or(null(), |o| o.as_ptr()),
            null(),
            &mut out,
        )
    };
    (code, out)
}

/// `es_read_replicas` into the arrays given: the code, the replica count
/// and the entry count written back.
///
/// # Safety
/// As `es_read_replicas`'s, for `source` and the arrays.
unsafe fn read(
    source: *mut EsReplicas,
    replicas: *mut EsReplica,
    capacity: usize,
    engines: *mut EsReservation,
    engines_capacity: usize,
) -> (EsCode, usize, usize) {
    let (mut count, mut entries) = (usize::MAX, usize::MAX);
    // SAFETY: the caller's contract, passed on; the counts are writable.
    let code = unsafe {
        es_read_replicas(
            source,
            replicas,
            capacity,
            &mut count,
            engines,
            engines_capacity,
            &mut entries,
        )
    };
    (code, count, entries)
}

#[test]
fn arrays_too_small_get_whole_replicas_and_the_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("engines");
    std::fs::create_dir(&state).unwrap();
    let options = RouterWriterOptions::default();
    let mut writers = Vec::new();
    for (id, engines) in [("a", 2u64), ("b", 0), ("c", 3)] {
        let mut w =
            RouterFileWriter::create(&state, &EngineId::new(id).unwrap(), &options).unwrap();
        for n in 0..engines {
            let counters = Reservations {
                num_requests: n + 1,
                ..Reservations::default()
            };
            w.set(&format!("e{n}"), &counters).unwrap();
        }
        writers.push(w);
    }
    let (code, source) = open(&format!("file://{}", state.display()), None);
    assert_eq!(code, EsCode::Ok);
    // SAFETY: a live handle, counting only.
    let (code, count, entries) = unsafe { read(source, null_mut(), 0, null_mut(), 0) };
    assert_eq!((code, count, entries), (EsCode::BufferTooSmall, 3, 5));
    let mut replicas = [EsReplica::default(); 3];
    let mut slots = [EsReservation::default(); 5];
    // SAFETY: arrays of 3 and 4 (one entry short: c does not fit).
    let (code, count, entries) =
        unsafe { read(source, replicas.as_mut_ptr(), 3, slots.as_mut_ptr(), 4) };
    assert_eq!((code, count, entries), (EsCode::BufferTooSmall, 3, 5));
    assert_eq!(
        (replicas[0].replica_id(), replicas[1].replica_id()),
        ("a", "b")
    );
    assert_eq!(replicas[2].replica_id(), "", "c was not written");
    // SAFETY: arrays that fit.
    let (code, count, entries) =
        unsafe { read(source, replicas.as_mut_ptr(), 3, slots.as_mut_ptr(), 5) };
    assert_eq!((code, count, entries), (EsCode::Ok, 3, 5));
    let c = &replicas[2];
    assert_eq!(
        (c.replica_id(), c.status, c.first_engine, c.engine_count),
        ("c", EsStatus::Fresh, 2, 3)
    );
    assert_eq!(slots[4].engine_id(), "e2");
    assert_eq!(slots[4].counters.num_requests, 3);
    assert_ne!(c.changed_age_ns, u64::MAX);
    // A null count, a null array with a capacity: refused.
    // SAFETY: the null pointers are refused before any write.
    let (code, _, _) = unsafe { read(source, null_mut(), 1, null_mut(), 0) };
    assert_eq!(code, EsCode::NullArgument);
    let mut entries = 0;
    // SAFETY: as above.
    let code = unsafe {
        es_read_replicas(
            source,
            null_mut(),
            0,
            null_mut(),
            null_mut(),
            0,
            &mut entries,
        )
    };
    assert_eq!(code, EsCode::NullArgument);
    // SAFETY: closed once; null is ignored.
    unsafe {
        es_close_replicas(source);
        es_close_replicas(null_mut());
    }
}

#[test]
fn a_bad_own_id_and_a_bad_uri_are_refused() {
    assert_eq!(open("file:///nowhere", Some("a/b")).0, EsCode::BadArgument);
    assert_eq!(open("ftp://x", None).0, EsCode::BadUri);
    let mut count = 0;
    // SAFETY: a null handle is refused.
    let code = unsafe { es_replica_error_count(null_mut(), &mut count) };
    assert_eq!(code, EsCode::NullArgument);
}

#[test]
fn a_call_while_the_handle_is_in_use_is_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let (code, source) = open(&format!("file://{}", tmp.path().display()), Some("own"));
    assert_eq!(code, EsCode::Ok);
    {
        // Another call in progress on this handle.
        // SAFETY: the live handle from es_open_replicas.
        let _held = unsafe { &*source }.inner.lock().unwrap();
        // SAFETY: the live handle, counting only.
        let (busy, _, _) = unsafe { read(source, null_mut(), 0, null_mut(), 0) };
        assert_eq!(busy, EsCode::Busy);
    }
    // SAFETY: as above, the lock released; no replica yet (no routers directory).
    let (code, count, entries) = unsafe { read(source, null_mut(), 0, null_mut(), 0) };
    assert_eq!((code, count, entries), (EsCode::Ok, 0, 0));
    // SAFETY: closed once.
    unsafe { es_close_replicas(source) };
}
