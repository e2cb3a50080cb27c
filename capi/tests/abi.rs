//! The C ABI's contract on bad input and threads, through the `extern "C"`
//! functions only: null pointers and small buffers are codes with messages,
//! per-engine errors never stop the other engines, a shared handle is
//! `ES_CODE_BUSY` rather than a race.
//!
//! Every `unsafe` call here passes null (on purpose, to see it refused),
//! the live handle from `open`, or pointers to locals of the sizes given
//! with them: the SAFETY argument is the same for each, so it is made once.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

use engine_state::{
    es_close, es_engine_error, es_error_count, es_last_error, es_open, es_read, es_read_engine,
    EsCode, EsEngine, EsOptions, EsSource, EsStatus,
};
use engine_state_shm_format::{EngineId, ShmWriter, Snapshot, WriterOptions};

fn last_error() -> String {
    let mut buf = [0 as c_char; 1024];
    // SAFETY: a 1024-byte buffer.
    unsafe { es_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: NUL-terminated by es_last_error.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// A directory with `n` live engines `e00`, `e01`, … (num_running = index).
fn engines(n: usize) -> (tempfile::TempDir, Vec<ShmWriter>) {
    let dir = tempfile::tempdir().unwrap();
    let writers = (0..n)
        .map(|i| {
            let snapshot = Snapshot {
                captured_mono_ns: engine_state_shm_format::monotonic_ns(),
                num_running: i as u64,
                ..Snapshot::default()
            };
            let id = EngineId::new(&format!("e{i:02}")).unwrap();
            ShmWriter::create(dir.path(), &id, &WriterOptions::default(), &snapshot).unwrap()
        })
        .collect();
    (dir, writers)
}

fn open(dir: &std::path::Path) -> *mut EsSource {
    let uri = CString::new(format!("file://{}", dir.display())).unwrap();
    let mut source = null_mut();
    // SAFETY: a C string, default options, a writable out-pointer.
    let code = unsafe { es_open(uri.as_ptr(), null(), &mut source) };
    assert_eq!(code, EsCode::Ok, "{}", last_error());
    source
}

#[test]
fn open_refuses_bad_arguments_with_codes_and_messages() {
    let uri = CString::new("ftp://example").unwrap();
    // SAFETY: a null out-pointer is refused before any write.
    assert_eq!(
        unsafe { es_open(uri.as_ptr(), null(), null_mut()) },
        EsCode::NullArgument
    );
    let mut source = std::ptr::dangling_mut::<EsSource>(); // must be reset to null
                                                           // SAFETY: a C string, a writable out-pointer.
    assert_eq!(
        unsafe { es_open(uri.as_ptr(), null(), &mut source) },
        EsCode::BadUri
    );
    assert!(source.is_null());
    assert!(last_error().contains("file:///"), "{}", last_error());

    let missing = CString::new("file:///nonexistent/engine-state-capi-test").unwrap();
    // SAFETY: as above.
    assert_eq!(
        unsafe { es_open(missing.as_ptr(), null(), &mut source) },
        EsCode::Directory
    );
    assert!(last_error().contains("/nonexistent/engine-state-capi-test"));

    let (dir, _writers) = engines(1);
    let uri = CString::new(format!("file://{}", dir.path().display())).unwrap();
    let old = EsOptions {
        struct_size: 8,
        ..EsOptions::default()
    };
    // SAFETY: `old` is a whole EsOptions whose struct_size says 8.
    assert_eq!(
        unsafe { es_open(uri.as_ptr(), &old, &mut source) },
        EsCode::BadArgument
    );
    assert!(last_error().contains("es_options_init"));
    let not_utf8 = [0xffu8 as c_char, 0];
    // SAFETY: a NUL-terminated (non-UTF-8) string.
    assert_eq!(
        unsafe { es_open(not_utf8.as_ptr(), null(), &mut source) },
        EsCode::BadArgument
    );
}

#[test]
fn reads_report_null_and_small_arrays_and_fill_what_fits() {
    let (dir, _writers) = engines(3);
    let source = open(dir.path());
    let mut engines = [EsEngine::default(); 3];
    let mut count = 0usize;
    // SAFETY (this block): every pointer is null, the live handle, or a local
    // of the size passed with it.
    unsafe {
        assert_eq!(
            es_read(null_mut(), engines.as_mut_ptr(), 3, &mut count),
            EsCode::NullArgument
        );
        assert_eq!(
            es_read(source, engines.as_mut_ptr(), 3, null_mut()),
            EsCode::NullArgument
        );
        assert_eq!(
            es_read(source, null_mut(), 3, &mut count),
            EsCode::NullArgument
        );
        assert!(last_error().contains("capacity 0"));

        // Counting only.
        assert_eq!(
            es_read(source, null_mut(), 0, &mut count),
            EsCode::BufferTooSmall
        );
        assert_eq!(count, 3);
        // Two of three: the first two by id are written.
        assert_eq!(
            es_read(source, engines.as_mut_ptr(), 2, &mut count),
            EsCode::BufferTooSmall
        );
        assert_eq!(count, 3);
        assert!(last_error().contains("3 engines"), "{}", last_error());
        assert_eq!(engines[0].engine_id(), "e00");
        assert_eq!(engines[1].engine_id(), "e01");
        assert_eq!(engines[2].engine_id(), "", "the third slot is untouched");

        assert_eq!(
            es_read(source, engines.as_mut_ptr(), 3, &mut count),
            EsCode::Ok
        );
        assert_eq!(count, 3);
        for (i, engine) in engines.iter().enumerate() {
            assert_eq!(engine.engine_id(), format!("e{i:02}"));
            assert_eq!(engine.snapshot.num_running, i as u64);
            assert_eq!(engine.status, EsStatus::Fresh);
            assert_eq!(engine.generation, 1);
            assert!(engine.read_mono_ns > 0);
            assert_eq!(engine.gpu_kv_used_frac, -1.0);
        }

        let mut one = EsEngine::default();
        let id = CString::new("e02").unwrap();
        assert_eq!(es_read_engine(source, id.as_ptr(), &mut one), EsCode::Ok);
        assert_eq!((one.engine_id(), one.snapshot.num_running), ("e02", 2));
        let absent = CString::new("nope").unwrap();
        assert_eq!(
            es_read_engine(source, absent.as_ptr(), &mut one),
            EsCode::NotFound
        );
        assert!(last_error().contains("\"nope\""));
        assert_eq!(
            es_read_engine(source, null(), &mut one),
            EsCode::NullArgument
        );
        assert_eq!(
            es_read_engine(source, id.as_ptr(), null_mut()),
            EsCode::NullArgument
        );
        es_close(source);
        es_close(null_mut()); // ignored
    }
}

#[test]
fn bad_entries_are_per_engine_errors_and_the_others_are_read() {
    let (dir, _writers) = engines(2);
    std::fs::write(dir.path().join("foreign"), b"not engine state at all").unwrap();
    nix::unistd::mkfifo(&dir.path().join("a_fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let source = open(dir.path());
    let mut engines = [EsEngine::default(); 4];
    let mut count = 0usize;
    let mut n_errors = 0usize;
    let mut class = EsCode::Ok;
    let mut name = [0 as c_char; 64];
    let mut message = [0 as c_char; 512];
    let text = |b: &[c_char]| {
        // SAFETY: NUL-terminated by es_engine_error.
        unsafe { CStr::from_ptr(b.as_ptr()) }
            .to_str()
            .unwrap()
            .to_owned()
    };
    // SAFETY (this block): the live handle and locals of the sizes passed.
    unsafe {
        assert_eq!(
            es_read(source, engines.as_mut_ptr(), 4, &mut count),
            EsCode::Ok
        );
        assert_eq!(count, 2);
        assert_eq!(es_error_count(source, &mut n_errors), EsCode::Ok);
        assert_eq!(n_errors, 2);
        assert_eq!(es_error_count(source, null_mut()), EsCode::NullArgument);
        let mut seen = Vec::new();
        for i in 0..n_errors {
            let code = es_engine_error(
                source,
                i,
                &mut class,
                name.as_mut_ptr(),
                name.len(),
                message.as_mut_ptr(),
                message.len(),
            );
            assert_eq!(code, EsCode::Ok, "{}", last_error());
            seen.push((text(&name), class));
            assert!(text(&message).contains("remove it"), "{}", text(&message));
        }
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            seen,
            [
                ("a_fifo".to_owned(), EsCode::RefusedEntry),
                ("foreign".to_owned(), EsCode::NotEngineState)
            ]
        );
        // Too small: what fits, NUL-terminated, and a code.
        let mut small = [0x55 as c_char; 4];
        let code = es_engine_error(source, 0, null_mut(), small.as_mut_ptr(), 4, null_mut(), 0);
        assert_eq!(code, EsCode::BufferTooSmall);
        assert_eq!(text(&small), "a_f");
        assert!(
            last_error().contains("name needs 7 bytes"),
            "{}",
            last_error()
        );
        let code = es_engine_error(source, 0, null_mut(), null_mut(), 16, null_mut(), 0);
        assert_eq!(code, EsCode::NullArgument);
        let code = es_engine_error(source, 2, &mut class, null_mut(), 0, null_mut(), 0);
        assert_eq!(code, EsCode::NotFound);
        assert!(last_error().contains("has 2"));
        es_close(source);
    }
}

/// A raw handle shared across threads (the C caller's situation).
#[derive(Clone, Copy)]
struct Shared(*mut EsSource);
// SAFETY: EsSource is internally locked (a second thread gets Busy), which
// is what this test checks.
unsafe impl Send for Shared {}

#[test]
fn a_handle_shared_by_threads_is_busy_never_a_race() {
    let (dir, _writers) = engines(8);
    let source = Shared(open(dir.path()));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let source = source;
                let mut engines = [EsEngine::default(); 8];
                let (mut ok, mut busy) = (0, 0);
                for _ in 0..2000 {
                    let mut count = 0;
                    // SAFETY: a live handle (closed after the join), a local array.
                    match unsafe { es_read(source.0, engines.as_mut_ptr(), 8, &mut count) } {
                        EsCode::Ok => {
                            ok += 1;
                            assert_eq!(count, 8);
                            assert!(engines.iter().all(|e| e.status == EsStatus::Fresh));
                        }
                        EsCode::Busy => {
                            busy += 1;
                            assert!(last_error().contains("one handle per thread"));
                        }
                        other => panic!("{other:?}: {}", last_error()),
                    }
                }
                (ok, busy)
            })
        })
        .collect();
    let results: Vec<(u32, u32)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(results.iter().map(|r| r.0).sum::<u32>() > 0, "{results:?}");
    // SAFETY: every thread is joined; closed once.
    unsafe { es_close(source.0) };
}

#[test]
fn reading_one_engine_of_a_vanished_directory_is_the_directory_error() {
    let (parent, _writers) = engines(0);
    let dir = parent.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    let id = EngineId::new("e0").unwrap();
    let _writer =
        ShmWriter::create(&dir, &id, &WriterOptions::default(), &Snapshot::default()).unwrap();
    let uri = CString::new(format!("file://{}", dir.display())).unwrap();
    let options = EsOptions {
        rescan_interval_ns: 0, // every read lists the directory
        ..EsOptions::default()
    };
    let mut source = null_mut();
    assert_eq!(
        unsafe { es_open(uri.as_ptr(), &options, &mut source) },
        EsCode::Ok
    );
    let name = CString::new("e0").unwrap();
    let mut engine = EsEngine::default();
    assert_eq!(
        unsafe { es_read_engine(source, name.as_ptr(), &mut engine) },
        EsCode::Ok
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let code = unsafe { es_read_engine(source, name.as_ptr(), &mut engine) };
    assert_eq!(code, EsCode::Directory, "{}", last_error());
    assert!(last_error().contains("state"), "{}", last_error());
    unsafe { es_close(source) };
}

/// The layouts C programs compile against (engine_state.h): a change here
/// is an ABI change (a new `EsOptions` version, or `ES_ABI_VERSION`).
#[test]
fn cache_struct_sizes_and_offsets_are_the_header_s() {
    use engine_state::{EsCacheDigest, ES_OPTIONS_V1_SIZE, ES_OPTIONS_V2_SIZE};
    use std::mem::{offset_of, size_of};
    assert_eq!(ES_OPTIONS_V1_SIZE, 32);
    assert_eq!(ES_OPTIONS_V2_SIZE, 40);
    assert_eq!(size_of::<EsOptions>(), ES_OPTIONS_V2_SIZE);
    assert_eq!(offset_of!(EsOptions, read_cache_digests), 32);
    assert_eq!(offset_of!(EsOptions, reserved), 36);
    assert_eq!(size_of::<EsCacheDigest>(), 72);
    let offsets = [
        offset_of!(EsCacheDigest, version),
        offset_of!(EsCacheDigest, captured_mono_ns),
        offset_of!(EsCacheDigest, captured_unix_ns),
        offset_of!(EsCacheDigest, count),
        offset_of!(EsCacheDigest, held),
        offset_of!(EsCacheDigest, generation),
        offset_of!(EsCacheDigest, created_unix_ns),
        offset_of!(EsCacheDigest, capacity),
        offset_of!(EsCacheDigest, kv_block_size),
        offset_of!(EsCacheDigest, writer_pid),
        offset_of!(EsCacheDigest, state),
    ];
    assert_eq!(offsets, [0, 8, 16, 24, 32, 40, 48, 56, 60, 64, 68]);
}

/// A version-1 caller's options are 32 bytes of its memory, no more: the
/// library reads only those (an ASan build of a C caller would catch more).
#[test]
fn a_version_1_options_struct_opens_a_source() {
    #[repr(C)]
    struct OptionsV1 {
        struct_size: usize,
        stale_after_ns: u64,
        max_capture_age_ns: u64,
        rescan_interval_ns: u64,
    }
    let d = EsOptions::default();
    let v1 = OptionsV1 {
        struct_size: engine_state::ES_OPTIONS_V1_SIZE,
        stale_after_ns: d.stale_after_ns,
        max_capture_age_ns: d.max_capture_age_ns,
        rescan_interval_ns: d.rescan_interval_ns,
    };
    let (dir, _writers) = engines(1);
    let uri = CString::new(format!("file://{}", dir.path().display())).unwrap();
    let mut source = null_mut();
    let code = unsafe { es_open(uri.as_ptr(), (&v1 as *const OptionsV1).cast(), &mut source) };
    assert_eq!(code, EsCode::Ok, "{}", last_error());
    unsafe { es_close(source) };
}
