//! A reader whose process is out of file descriptors keeps reading the
//! engines it has mapped (a mapping needs no descriptor) and reports the
//! failed listing beside them. Its own test binary, one test: it exhausts
//! the descriptors of the whole process.

use std::time::Duration;

use engine_state_reader::{Error, ReaderOptions, Reading, ShmDir, Source};
use engine_state_shm_format::{monotonic_ns, EngineId, ShmWriter, Snapshot, WriterOptions};

#[test]
fn out_of_descriptors_keeps_the_mapped_engines_and_reports_the_listing() {
    let dir = tempfile::tempdir().unwrap();
    let writers: Vec<ShmWriter> = ["a", "b"]
        .iter()
        .map(|id| {
            let first = Snapshot {
                captured_mono_ns: monotonic_ns(),
                ..Snapshot::default()
            };
            ShmWriter::create(
                dir.path(),
                &EngineId::new(id).unwrap(),
                &WriterOptions::default(),
                &first,
            )
            .unwrap()
        })
        .collect();
    let options = ReaderOptions {
        rescan_interval: Duration::ZERO, // a listing at every read
        ..ReaderOptions::default()
    };
    let mut source = ShmDir::open(dir.path(), options).unwrap();
    let mut reading = Reading::default();
    source.read_into(&mut reading).unwrap();
    assert_eq!(reading.engines.len(), 2);

    // Every descriptor taken, as by a leak elsewhere in the process. The soft
    // limit comes down to a few above what is open first: under a limit of
    // 2^20 the hoard would take a million descriptors and could run the
    // whole host out of them (ENFILE) instead of this process (EMFILE).
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let open_now = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    setrlimit(Resource::RLIMIT_NOFILE, open_now + 16, hard).unwrap();
    let mut hoard = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(file) => hoard.push(file),
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EMFILE as i32) => break,
            Err(e) => panic!("open /dev/null: {e}"),
        }
    }
    let result = source.read_into(&mut reading);
    drop(hoard);
    result.expect("the read succeeds with the mapped engines");
    let ids: Vec<&str> = reading.engines.iter().map(|e| &*e.engine_id).collect();
    assert_eq!(ids, ["a", "b"], "the mapped engines are kept");
    assert_eq!(reading.errors.len(), 1, "{:?}", reading.errors);
    let error = &reading.errors[0];
    assert_eq!(error.name, source.uri());
    assert!(
        matches!(&*error.error, Error::Directory { io, .. } if io.raw_os_error() == Some(nix::errno::Errno::EMFILE as i32)),
        "{error:?}"
    );
    // Descriptors back: the next listing succeeds and the error is gone.
    source.read_into(&mut reading).unwrap();
    assert_eq!((reading.engines.len(), reading.errors.len()), (2, 0));
    drop(writers);
}
