//! Tests of what other processes can put into (or do to) the state
//! directory: FIFOs, symbolic links, unreadable files, truncation of a mapped
//! file. None may hang or kill a reader.

use std::os::unix::fs::PermissionsExt;

use crate::*;

fn id(s: &str) -> EngineId {
    EngineId::new(s).unwrap()
}

fn create(dir: &std::path::Path, name: &str) -> ShmWriter {
    let first = Snapshot {
        num_running: 4,
        ..Snapshot::default()
    };
    ShmWriter::create(dir, &id(name), &WriterOptions::default(), &first).unwrap()
}

#[test]
fn fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fifo");
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // Without O_NONBLOCK this open would wait for a writer forever.
    let err = ShmFile::open(&path).unwrap_err();
    assert!(matches!(err, Error::RefusedEntry { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("not a regular file (a FIFO): "), "{text}");
    assert!(text.contains("remove it"), "{text}");
}

#[test]
fn symbolic_link_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let _w = create(elsewhere.path(), "eng");
    let link = dir.path().join("eng");
    std::os::unix::fs::symlink(elsewhere.path().join("eng"), &link).unwrap();
    let err = ShmFile::open(&link).unwrap_err();
    assert!(
        err.to_string().starts_with("symbolic link, not followed: "),
        "{err}"
    );
    // The target itself is fine.
    ShmFile::open(elsewhere.path().join("eng")).unwrap();
}

#[test]
fn unreadable_file_says_readers_need_read_access() {
    if nix::unistd::geteuid().is_root() {
        return; // root reads anything
    }
    let dir = tempfile::tempdir().unwrap();
    let _w = create(dir.path(), "private");
    let path = dir.path().join("private");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o200)).unwrap();
    let err = ShmFile::open(&path).unwrap_err().to_string();
    assert!(
        err.contains("read access") && err.contains("AGENTIC_ENGINE_STATE_FILE_MODE=644"),
        "{err}"
    );
}

#[test]
fn truncated_mapping_reads_torn_instead_of_killing_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = create(dir.path(), "victim");
    let _b = create(dir.path(), "bystander");
    let victim = ShmFile::open(dir.path().join("victim")).unwrap();
    let bystander = ShmFile::open(dir.path().join("bystander")).unwrap();
    assert!(victim.read().is_ok());
    // Another process's `truncate -s 0`: the mapping now lies beyond the end
    // of the file, and touching it raises SIGBUS.
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("victim"))
        .unwrap()
        .set_len(0)
        .unwrap();
    assert!(victim.read().is_err(), "a truncated file reads torn");
    assert!(victim.is_truncated());
    assert_eq!(victim.heartbeat_mono_ns(), 0, "the mapping reads zeros now");
    assert!(!victim.is_retired());
    assert!(victim.read().is_err(), "and stays torn");
    // The writer in this process survives too: its stores land in zero pages.
    writer.publish(&Snapshot::default()).unwrap();
    let (snapshot, _) = bystander.read().unwrap();
    assert_eq!(snapshot.num_running, 4);
    assert!(!bystander.is_truncated());
    // Opening it again says what it is now.
    assert!(matches!(
        ShmFile::open(dir.path().join("victim")).unwrap_err(),
        Error::WrongSize { size: 0, .. }
    ));
    drop(victim);
    // The slot is free again and a new mapping starts untruncated.
    let again = ShmFile::open(dir.path().join("bystander")).unwrap();
    assert!(!again.is_truncated());
}

#[test]
fn many_mappings_register_and_unregister() {
    let dir = tempfile::tempdir().unwrap();
    let _w = create(dir.path(), "e");
    // More than one chunk of registry slots, opened and dropped twice.
    for _ in 0..2 {
        let files: Vec<ShmFile> = (0..600)
            .map(|_| ShmFile::open(dir.path().join("e")).unwrap())
            .collect();
        assert!(files.iter().all(|f| f.read().is_ok() && !f.is_truncated()));
    }
}

#[test]
fn file_zeroed_in_place_reads_torn() {
    let dir = tempfile::tempdir().unwrap();
    let _w = create(dir.path(), "zeroed");
    let reader = ShmFile::open(dir.path().join("zeroed")).unwrap();
    // Truncated and grown back before the reader touched it: no fault, the
    // mapping just reads zeros (sequence 0, which no writer publishes).
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("zeroed"))
        .unwrap();
    file.set_len(0).unwrap();
    file.set_len(FILE_SIZE as u64).unwrap();
    assert_eq!(reader.read().unwrap_err().last_seq, 0);
    assert!(!reader.is_truncated(), "no fault happened");
}

#[test]
fn writer_does_not_take_over_through_a_symbolic_link() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    // A dead writer's file elsewhere (dropping a writer removes its file,
    // so keep a copy of its bytes).
    let bytes = {
        let _w = create(elsewhere.path(), "eng");
        std::fs::read(elsewhere.path().join("eng")).unwrap()
    };
    std::fs::write(elsewhere.path().join("eng"), &bytes).unwrap();
    std::os::unix::fs::symlink(elsewhere.path().join("eng"), dir.path().join("eng")).unwrap();
    let first = Snapshot::default();
    let err =
        ShmWriter::create(dir.path(), &id("eng"), &WriterOptions::default(), &first).unwrap_err();
    assert!(
        err.to_string().starts_with("symbolic link, not followed: "),
        "{err}"
    );
    assert_eq!(
        std::fs::read(elsewhere.path().join("eng")).unwrap(),
        bytes,
        "the file the link points to is not retired"
    );
}

fn set_len(path: &std::path::Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// `truncate -s 0` of a live writer's file: the writer survives its own
/// stores into the truncated mapping, its heartbeat notices, a second
/// writer is refused with a clear error, and `create_after` renames a new
/// generation over the file, carrying the snapshot on.
#[test]
fn truncated_live_file_is_noticed_and_replaced_by_its_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut");
    let mut writer = create(dir.path(), "cut");
    let beat = writer.heartbeat();
    assert!(beat.in_place());
    set_len(&path, 0);
    assert!(!beat.in_place(), "0 bytes: readers refuse it");
    // The stores fault; the `sigbus` handler maps zero pages over the
    // mapping, and the process goes on.
    let latest = Snapshot {
        num_running: 9,
        ..Snapshot::default()
    };
    writer.publish(&latest).unwrap();
    assert!(beat.beat(), "a truncated file is not a retired one");
    assert!(!beat.in_place());
    assert_eq!(beat.snapshot(), Some(latest), "published since: kept");

    // Its lock is held: nobody else may take the id over.
    let err = ShmWriter::create(
        dir.path(),
        &id("cut"),
        &WriterOptions::default(),
        &Snapshot::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::LiveFileWrongSize { size: 0, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("published by a live process")
            && text.contains("is 0 bytes instead of 4096")
            && text.contains("replaces the file within a few heartbeat periods"),
        "{text}"
    );

    let again = ShmWriter::create_after(&beat, &WriterOptions::default(), &latest).unwrap();
    assert_eq!(again.generation(), writer.generation() + 1);
    assert!(again.heartbeat().in_place());
    let reader = ShmFile::open(&path).unwrap();
    assert_eq!(reader.generation(), again.generation());
    assert_eq!(reader.read().unwrap().0, latest);
    // The replaced writer retires without touching the file now there.
    writer.retire();
    assert!(!reader.is_retired());
    assert!(path.exists());
}

/// Grown, or truncated and grown back before the writer touched it (no
/// fault, the bytes are zeros): either way readers cannot use the file,
/// and the writer's heartbeat says so.
#[test]
fn grown_or_zeroed_live_file_is_not_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grown");
    let writer = create(dir.path(), "grown");
    let beat = writer.heartbeat();
    set_len(&path, 2 * FILE_SIZE as u64);
    assert!(!beat.in_place(), "8192 bytes: readers refuse it");
    assert!(beat.beat(), "nothing faulted; the heartbeat goes on");
    let again =
        ShmWriter::create_after(&beat, &WriterOptions::default(), &Snapshot::default()).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), FILE_SIZE as u64);

    let beat = again.heartbeat();
    set_len(&path, 0);
    set_len(&path, FILE_SIZE as u64);
    assert!(!beat.in_place(), "the right size, but zeros");
    assert_eq!(beat.snapshot(), None, "sequence 0 is no snapshot");
    let third =
        ShmWriter::create_after(&beat, &WriterOptions::default(), &Snapshot::default()).unwrap();
    assert_eq!(third.generation(), again.generation() + 1);
    ShmFile::open(&path).unwrap().read().unwrap();
}

/// Truncated to N > 0 bytes and grown back between two checks (`truncate
/// -s 200 f; truncate -s 4096 f`): the page stays (no fault), its bytes
/// from N on read zero, and size, magic and state survive. Readers refuse
/// the file for good (its engine id is gone), so the heartbeat says it is
/// not in place, and the cut payload is not taken for a snapshot.
#[test]
fn live_file_cut_to_a_few_bytes_and_grown_back_is_not_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut");
    let mut writer = create(dir.path(), "cut");
    // Every payload word nonzero: a cut anywhere in it shows.
    let full = Snapshot::from_words(core::array::from_fn(|i| i as u64 + 1));
    writer.publish(&full).unwrap();
    let mut beat = writer.heartbeat();
    assert_eq!(beat.snapshot(), Some(full));
    let mut writers = vec![writer];
    // Inside the header (past magic and state), in `seq`, in the payload,
    // and in the engine id (3 bytes long: "cut").
    for len in [40, 50, 60, 68, 200, 258] {
        assert!(beat.in_place(), "{len}: before the cut");
        set_len(&path, len);
        set_len(&path, FILE_SIZE as u64);
        assert!(!beat.in_place(), "cut to {len} bytes and grown back");
        assert!(!beat.map.truncated(), "{len}: no fault happened");
        assert_eq!(
            beat.snapshot(),
            None,
            "{len}: the cut payload is no snapshot"
        );
        assert!(beat.beat(), "{len}: not retired");
        assert!(
            matches!(ShmFile::open(&path), Err(Error::CorruptHeader { .. })),
            "{len}: readers refuse it"
        );
        let again = ShmWriter::create_after(&beat, &WriterOptions::default(), &full).unwrap();
        assert_eq!(again.generation(), writers.last().unwrap().generation() + 1);
        let reader = ShmFile::open(&path).unwrap();
        assert_eq!(reader.read().unwrap().0, full, "{len}: carried over");
        beat = again.heartbeat();
        writers.push(again);
    }
    // A cut past the engine id's end only zeroes zeros: still in place.
    set_len(&path, 320);
    set_len(&path, FILE_SIZE as u64);
    assert!(beat.in_place());
    assert_eq!(beat.snapshot(), Some(full));
    ShmFile::open(&path).unwrap().read().unwrap();
}

/// A symbolic link swapped in for the file (even one pointing to the same
/// inode) hides the engine from readers, which never follow links: not in
/// place, and never replaced (a link is foreign).
#[test]
fn symbolic_link_swapped_in_is_not_in_place_and_not_clobbered() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let path = dir.path().join("linked");
    let writer = create(dir.path(), "linked");
    let beat = writer.heartbeat();
    // The same inode under another name, and a link to it renamed over ours.
    std::fs::hard_link(&path, elsewhere.path().join("linked")).unwrap();
    let link = dir.path().join("link.tmp");
    std::os::unix::fs::symlink(elsewhere.path().join("linked"), &link).unwrap();
    std::fs::rename(&link, &path).unwrap();
    assert!(!beat.in_place(), "a link, however it resolves");
    let err = ShmWriter::create_after(&beat, &WriterOptions::default(), &Snapshot::default())
        .unwrap_err();
    assert!(
        err.to_string().starts_with("symbolic link, not followed: "),
        "{err}"
    );
    assert!(std::fs::symlink_metadata(&path)
        .unwrap()
        .file_type()
        .is_symlink());
}

/// A dead writer's file truncated or grown (nobody holds its lock, so
/// nobody will fix it) is taken over like any dead writer's file; the
/// generation goes on when the header is still there.
#[test]
fn dead_writers_file_of_the_wrong_size_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dead");
    // A dead writer's file (dropping a writer removes its file, so keep a
    // copy of its bytes).
    let bytes = {
        let _w = create(dir.path(), "dead");
        std::fs::read(&path).unwrap()
    };
    for (len, generation) in [(0, 1), (100, 2), (2 * FILE_SIZE as u64, 2)] {
        std::fs::write(&path, &bytes).unwrap();
        set_len(&path, len);
        let writer = ShmWriter::create(
            dir.path(),
            &id("dead"),
            &WriterOptions::default(),
            &Snapshot::default(),
        )
        .unwrap_or_else(|e| panic!("{len} bytes: {e}"));
        assert_eq!(writer.generation(), generation, "{len} bytes");
        ShmFile::open(&path).unwrap().read().unwrap();
        drop(writer);
    }
    // A foreign file of the wrong size is still never clobbered.
    std::fs::write(&path, b"not an engine-state file").unwrap();
    let err = ShmWriter::create(
        dir.path(),
        &id("dead"),
        &WriterOptions::default(),
        &Snapshot::default(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::NotEngineState { .. }), "{err:?}");
}

/// Stores `value` into the sequence word of the file at `path` (see [`poke`]).
fn poke_seq(path: &std::path::Path, value: u64) {
    poke(path, crate::layout::SEQ_OFFSET, value)
}

/// Stores `value` into the word at `offset` of the file at `path` through
/// a writable mapping of its own, as a stray 8-byte write of another
/// process would.
fn poke(path: &std::path::Path, offset: usize, value: u64) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    crate::mapping::Mapping::read_write(&file, path)
        .unwrap()
        .word(offset)
        .store(value, std::sync::atomic::Ordering::Relaxed);
}

/// A stray odd (or smaller even) value stored into a live file's sequence
/// word: readers see the file torn (or an old snapshot as new). Its
/// writer's check says it is not in place — at once when the value is
/// beyond any it stored or when it is odd while no publish is in progress
/// — and a publish that finds it says so as well;
/// `create_after` renames a readable new generation over it.
#[test]
fn stray_store_into_a_live_files_sequence_is_not_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("poked");
    let mut writer = create(dir.path(), "poked");
    let beat = writer.heartbeat();
    writer.publish(&Snapshot::default()).unwrap(); // seq 4
    assert!(beat.in_place() && beat.in_place(), "our own sequence");

    // Far beyond what was stored.
    poke_seq(&path, 7);
    let reader = ShmFile::open(&path).unwrap();
    assert_eq!(reader.read().unwrap_err().last_seq, 7, "torn for readers");
    assert!(!beat.in_place(), "a sequence the writer never stored");

    // The odd value a publish would store, while none is in progress:
    // told apart at the first check, by any handle.
    let writer2 =
        ShmWriter::create_after(&beat, &WriterOptions::default(), &Snapshot::default()).unwrap();
    drop(writer);
    let beat = writer2.heartbeat();
    poke_seq(&path, 1); // its sequence is 2: a publish would store 1, 4
    assert!(!beat.in_place(), "odd while no publish is in progress");
    assert!(!beat.clone().in_place(), "and at every check");

    // A publish that finds a value it did not store reports it, and leaves
    // the word even (readable) until the file is replaced.
    let mut writer3 =
        ShmWriter::create_after(&beat, &WriterOptions::default(), &Snapshot::default()).unwrap();
    drop(writer2);
    let beat = writer3.heartbeat();
    poke_seq(&path, 1);
    writer3.publish(&Snapshot::default()).unwrap();
    let reader = ShmFile::open(&path).unwrap();
    assert_eq!(reader.read().unwrap().1, 4, "even again after the publish");
    assert!(!beat.in_place(), "the publish saw the stray value");
    let again =
        ShmWriter::create_after(&beat, &WriterOptions::default(), &Snapshot::default()).unwrap();
    assert!(again.heartbeat().in_place());
    assert_eq!(
        ShmFile::open(&path).unwrap().generation(),
        again.generation()
    );
    drop(writer3);
}

/// A stray store of a future value into an idle engine's heartbeat word
/// (readers call it clock_ahead, never fresh) is overwritten by the next
/// beat, even one that leaves a young stamp alone.
#[test]
fn future_heartbeat_is_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ahead");
    let writer = create(dir.path(), "ahead");
    let beat = writer.heartbeat();
    poke(&path, crate::layout::HEARTBEAT_OFFSET, u64::MAX);
    assert!(beat.beat_unless_younger(std::time::Duration::from_secs(3600), crate::monotonic_ns()));
    let stamp = ShmFile::open(&path).unwrap().heartbeat_mono_ns();
    assert!(stamp <= crate::monotonic_ns(), "not overwritten: {stamp}");
}

/// The stamp is the `now` passed in (the publisher's clock), and a stamp
/// younger than `max_age` at that `now` is left alone.
#[test]
fn a_beat_stamps_the_now_it_is_given_unless_the_stamp_is_younger() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("given");
    let writer = create(dir.path(), "given");
    let beat = writer.heartbeat();
    let word = || ShmFile::open(&path).unwrap().heartbeat_mono_ns();
    let max_age = std::time::Duration::from_nanos(1_000);
    writer.stamp_heartbeat(10_000);
    assert!(beat.beat_unless_younger(max_age, 10_999));
    assert_eq!(word(), 10_000, "younger than max_age: left alone");
    assert!(beat.beat_unless_younger(max_age, 11_000));
    assert_eq!(word(), 11_000, "as old as max_age: the given now");
}

/// A publish held between its odd and its final store (its thread
/// preempted on a loaded host) for many checks, by several handles, is a
/// publish in progress, not a stray value: the file stays in place.
#[test]
fn publish_held_mid_write_is_not_a_stray_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = create(dir.path(), "held");
    let beat = writer.heartbeat();
    let other = beat.clone();
    writer.publish(&Snapshot::default()).unwrap(); // seq 4
    writer.begin_publish_for_test(); // seq 5, the final store not done yet
    for _ in 0..10 {
        assert!(beat.in_place() && other.in_place(), "a publish in progress");
    }
}

/// A live writer's directory swapped for a symbolic link to elsewhere: the
/// file is not in place (its path now resolves elsewhere), and the
/// replacement refuses to write through the link, with an error that says
/// what to do. A directory configured as a link from the start is followed.
#[test]
fn directory_swapped_for_a_symbolic_link_is_not_written_through() {
    let base = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let dir = base.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    let writer = create(&dir, "eng");
    let beat = writer.heartbeat();
    std::fs::rename(&dir, base.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), &dir).unwrap();
    assert!(!beat.in_place());
    let err = ShmWriter::create_after(&beat, &WriterOptions::default(), &Snapshot::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("replaced by a symbolic link, which is not followed")
            && err.contains("put the directory back"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(elsewhere.path()).unwrap().count(),
        0,
        "nothing written there"
    );

    // Configured as a link: replacing a truncated file through it is fine.
    let link = base.path().join("configured");
    std::os::unix::fs::symlink(elsewhere.path(), &link).unwrap();
    let linked = create(&link, "eng");
    let beat = linked.heartbeat();
    set_len(&elsewhere.path().join("eng"), 0);
    let again =
        ShmWriter::create_after(&beat, &WriterOptions::default(), &Snapshot::default()).unwrap();
    assert!(again.heartbeat().in_place());
    drop(again);

    // Configured as `link/`: `lstat` of that follows the link, yet it is the
    // same configured link as the file path's parent `link`.
    let slashed = std::path::PathBuf::from(format!("{}/", link.display()));
    let linked = create(&slashed, "slashed");
    let beat = linked.heartbeat();
    set_len(&elsewhere.path().join("slashed"), 0);
    let again =
        ShmWriter::create_after(&beat, &WriterOptions::default(), &Snapshot::default()).unwrap();
    assert!(again.heartbeat().in_place());
    drop(writer);
}

/// A socket (which `open` refuses with `ENXIO`) and a device node (whose
/// open can have effects of its own) are refused from an `lstat`, without
/// being opened.
#[test]
fn sockets_and_device_nodes_are_refused_without_an_open() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let err = ShmFile::open(&socket).unwrap_err();
    assert!(matches!(err, Error::RefusedEntry { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("not a regular file (a socket): "),
        "{err}"
    );
    let err = ShmFile::open("/dev/null").unwrap_err().to_string();
    assert!(
        err.starts_with("not a regular file (a character device): "),
        "{err}"
    );
}

/// The names of the entries of `dir` opened since `watch` (an inotify
/// descriptor watching `dir` for `IN_OPEN`, non-blocking) was last read.
fn opened_names(watch: &std::os::fd::OwnedFd) -> Vec<String> {
    use std::os::fd::AsRawFd;
    let mut buf = [0u8; 4096];
    // SAFETY: `watch` is an open descriptor; `buf` is writable for its length.
    let n = unsafe { nix::libc::read(watch.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    let mut names = Vec::new();
    let mut at = 0;
    let header = std::mem::size_of::<nix::libc::inotify_event>();
    while n > 0 && at + header <= n as usize {
        // The event's `len` field: after wd, mask and cookie (u32 each).
        let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
        let name = &buf[at + header..at + header + len];
        let name = name.split(|b| *b == 0).next().unwrap_or_default();
        names.push(String::from_utf8_lossy(name).into_owned());
        at += header + len;
    }
    names
}

/// A FIFO (standing in for a device node, whose open can have effects of
/// its own) named after the engine id: the writer refuses it from an
/// `lstat`, without opening it (an O_RDWR open of a FIFO succeeds).
#[test]
fn writer_refuses_a_fifo_without_opening_it() {
    use std::os::fd::FromRawFd;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("eng");
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // SAFETY: no pointer arguments; the descriptor returned is checked and
    // then owned by `watch` alone.
    let watch = unsafe {
        let fd = nix::libc::inotify_init1(nix::libc::IN_NONBLOCK | nix::libc::IN_CLOEXEC);
        assert!(fd >= 0, "inotify_init1");
        std::os::fd::OwnedFd::from_raw_fd(fd)
    };
    let dir_c = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `watch` is open; `dir_c` is a NUL-terminated path.
    let wd = unsafe {
        nix::libc::inotify_add_watch(
            std::os::fd::AsRawFd::as_raw_fd(&watch),
            dir_c.as_ptr(),
            nix::libc::IN_OPEN,
        )
    };
    assert!(wd >= 0, "inotify_add_watch");
    let err = ShmWriter::create(
        dir.path(),
        &id("eng"),
        &WriterOptions::default(),
        &Snapshot::default(),
    )
    .unwrap_err();
    let opened = opened_names(&watch);
    assert!(!opened.iter().any(|n| n == "eng"), "opened: {opened:?}");
    assert!(
        err.to_string().starts_with("not a regular file (a FIFO): "),
        "{err}"
    );
}
