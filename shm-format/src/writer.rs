//! The single writer of one engine's file: atomic creation, lock, publish,
//! heartbeat, retirement (DESIGN §4).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::clock::{monotonic_ns, pid_namespace, unix_ns};
use crate::engine_id::EngineId;
use crate::error::Error;
use crate::fork::fork_generation;
use crate::layout::*;
use crate::mapping::Mapping;
use crate::seqlock;
use crate::snapshot::{Snapshot, SNAPSHOT_WORDS};

/// How a [`ShmWriter`] creates its file.
#[derive(Clone, Debug)]
pub struct WriterOptions {
    /// Permission bits of the file (default `0o600`: only the engine's user
    /// may read it; use `0o644` when routers run as another user).
    pub mode: u32,
    /// The publish period recorded in the header (default 50 ms).
    pub publish_period: Duration,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            mode: 0o600,
            publish_period: Duration::from_millis(50),
        }
    }
}

/// The one writer of `<dir>/<engine id>`.
///
/// Created atomically (temporary dot-file, `posix_fallocate`, header and first
/// snapshot, then `link`/`rename` into place) and locked with `flock` for its
/// whole life, so a second live writer of the same id is refused. A dead
/// writer's file is marked retired and replaced, never truncated or reused.
/// Dropping the writer retires and removes the file.
#[derive(Debug)]
pub struct ShmWriter {
    pub(crate) map: Arc<Mapping>,
    path: PathBuf,
    engine_id: EngineId,
    generation: u64,
    pub(crate) inode: u64,
    dev: u64,
    fork_generation: u64,
    /// What was written at creation into the bytes that never change after it.
    written: Written,
    /// The sequence this writer stored last (even): the next publish starts
    /// from it, not from what the word holds (see [`seqlock::write_after`]).
    seq: u64,
    /// What the heartbeat's check needs to know of `seq`.
    seq_record: Arc<SeqRecord>,
    /// See [`Heartbeat::dir_was_link`].
    dir_was_link: bool,
    // Held for the writer's life; released (closing the file) on drop.
    _lock: Flock<File>,
    pub(crate) retired: bool,
}

/// Stamps the heartbeat word of a writer's file from another thread, and
/// checks that the file is still in place.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    pub(crate) map: Arc<Mapping>,
    fork_generation: u64,
    /// Where the file was put, and its (device, inode).
    path: Arc<Path>,
    file_id: (u64, u64),
    engine_id: EngineId,
    generation: u64,
    written: Written,
    seq_record: Arc<SeqRecord>,
    /// The directory was a symbolic link when the writer was created (then
    /// it was configured as one, and following it is what was asked for).
    dir_was_link: bool,
}

/// Shared by a writer's publishing thread and its [`Heartbeat`] handles, so
/// that the heartbeat's check can tell a sequence this writer stored from
/// one another process stored into the file (a stray 8-byte write through a
/// writable mapping). An odd one would otherwise keep the file torn for
/// every reader as long as the writer lives; an even one would make a
/// reader take old payload words for a new snapshot.
#[derive(Debug)]
struct SeqRecord {
    /// The final (even) sequence of the publish in progress, else of the
    /// last one. Stored only by `publish`.
    target: AtomicU64,
    /// Set by a publish that found in the word a value this writer did not
    /// store there.
    foreign: AtomicBool,
    /// The final sequence of the last publish that completed (stored by
    /// `publish` after its final store into the word): an odd sequence
    /// `target - 1` while this is below `target` is a publish in progress
    /// (however long its thread was preempted), and the same odd value
    /// once this is `target` was stored by someone else.
    done: AtomicU64,
}

impl SeqRecord {
    fn new(seq: u64) -> SeqRecord {
        SeqRecord {
            target: AtomicU64::new(seq),
            foreign: AtomicBool::new(false),
            done: AtomicU64::new(seq),
        }
    }
}

/// The bytes a writer wrote at creation and never changes afterwards: the
/// header (all of it but `state`, which `retire` stores) and the engine id
/// field. `seq`, `heartbeat_mono_ns` and the payload change with every
/// publish (layout.rs).
#[derive(Clone, Copy, Debug)]
struct Written {
    header: Header,
    engine_id: [u64; ENGINE_ID_FIELD_SIZE / 8],
}

impl Written {
    fn new(header: Header, engine_id: &EngineId) -> Written {
        let field = engine_id.to_field();
        Written {
            header,
            engine_id: core::array::from_fn(|i| {
                u64::from_le_bytes(field[8 * i..8 * i + 8].try_into().expect("8 bytes"))
            }),
        }
    }
}

impl Heartbeat {
    /// Stores the current `CLOCK_MONOTONIC` as `heartbeat_mono_ns`. Returns
    /// false (and writes nothing) once the file is retired or in a forked
    /// child. A file truncated under the mapping (which then reads zeros, see
    /// `sigbus`) is not retired: nothing is stored, true is returned, and
    /// [`Heartbeat::in_place`] says false, so the caller can replace it.
    pub fn beat(&self) -> bool {
        self.beat_unless_younger(std::time::Duration::ZERO)
    }

    /// Like [`Heartbeat::beat`], but stores nothing while the stamp is
    /// younger than `max_age` (a publish stamped it): a heartbeat thread that
    /// ticks every period then leaves a busy engine's stamp to its publishes,
    /// and relays see one change per publish instead of two, while the stamp
    /// never gets much older than `max_age` plus one tick. A stamp in the
    /// future (stored by another process) is overwritten whatever `max_age`.
    pub fn beat_unless_younger(&self, max_age: std::time::Duration) -> bool {
        if fork_generation() != self.fork_generation {
            return false;
        }
        // This load may be the first touch of a truncated file: the `sigbus`
        // handler then maps zero pages over the mapping and it reads 0.
        match self.map.word(STATE_WORD * 8).load(Ordering::Relaxed) {
            STATE_ACTIVE => {}
            STATE_RETIRED => return false,
            _ => return true, // zeroed or truncated: `in_place` says false
        }
        let word = self.map.word(HEARTBEAT_OFFSET);
        let now = monotonic_ns();
        // Readers load it Relaxed; it carries no other data, and only this
        // process stores it (publish and the heartbeat thread): Relaxed.
        let last = word.load(Ordering::Relaxed);
        // A stamp ahead of our clock was not ours (a stray store): readers
        // call it clock_ahead, never fresh, so it is overwritten at once.
        if last > now || now - last >= max_age.as_nanos() as u64 {
            word.store(now, Ordering::Relaxed);
        }
        true
    }

    /// Whether readers still see this file at its path: false when it was
    /// removed (alone or with its directory), replaced by another file or a
    /// symbolic link (readers never follow one), truncated or grown by
    /// another process (readers refuse a file that is not [`FILE_SIZE`]
    /// bytes, and one truncated to any size and grown back has lost part of
    /// what was written at creation), or when its sequence word holds a
    /// value this writer did not store (see [`Heartbeat::seq_is_ours`]).
    /// One `lstat` and about twenty loads, for a heartbeat thread every few
    /// periods. Any number of handles may check at once: a check stores
    /// nothing.
    pub fn in_place(&self) -> bool {
        // `lstat`, not `stat`: a link to this very file has its own inode.
        let Ok(meta) = std::fs::symlink_metadata(&self.path) else {
            return false;
        };
        if !meta.is_file()
            || (meta.dev(), meta.ino()) != self.file_id
            || meta.len() != FILE_SIZE as u64
        {
            return false;
        }
        // The size is right now, but the file may have been truncated and
        // grown back: its bytes past the cut are zeros (or this mapping's
        // were all replaced by zero pages when it faulted meanwhile).
        !self.map.truncated() && self.intact() && self.seq_is_ours()
    }

    /// Whether the sequence word holds a value this writer stored: at least
    /// the last one it completed before the publish in progress (if any),
    /// at most that publish's final one, odd only while that publish is in
    /// progress, and no publish found a value it did not store.
    fn seq_is_ours(&self) -> bool {
        let record = &*self.seq_record;
        // Relaxed: set by `publish`, read on its own.
        if record.foreign.load(Ordering::Relaxed) {
            return false;
        }
        // First, before the word: Acquire pairs with the Release store of
        // `done` in `publish`, which follows that publish's final store
        // into the word, so if this sees `done == target` the load of the
        // word below sees that final store (or a later publish's stores).
        let done = record.done.load(Ordering::Acquire);
        // Acquire: pairs with the Release store of `target` in `publish`,
        // which follows the previous publish's final store of `target - 2`
        // into the word: the load below sees that store or a later one.
        let low = record.target.load(Ordering::Acquire).saturating_sub(2);
        let seq = self.map.word(SEQ_OFFSET).load(Ordering::Relaxed);
        // Pairs with the `fence(Release)` in `publish` between its store of
        // `target` and that publish's stores into the word: if the load
        // above saw one of those, the load below sees its `target`.
        fence(Ordering::Acquire);
        let high = record.target.load(Ordering::Relaxed);
        if seq == 0 || seq < low || seq > high {
            return false;
        }
        // The only odd value in range is `high - 1`: ours while the publish
        // of `high` has not completed (`done` loaded before the word, so a
        // publish that completes meanwhile still counts as in progress).
        seq % 2 == 0 || done != high
    }

    /// Whether the mapping still holds what this writer wrote at creation
    /// and never changes (the header but `state`, and the engine id field),
    /// `state` is ACTIVE, and `seq` is not 0 (the first snapshot, published
    /// before the file was put in place, made it 2, and it only grows). A
    /// file truncated to N bytes (even N > 0, which keeps the page: no
    /// fault) and grown back reads zeros from byte N on: a cut anywhere
    /// before the engine id's end zeroes some of the id (non-empty, so its
    /// first byte is not 0) or of the header, and a later cut zeroed only
    /// zeros. Relaxed loads: only this process stores these words (`seq`
    /// too, on the publishing thread: only its being 0 matters here).
    fn intact(&self) -> bool {
        let expected = Header {
            state: STATE_ACTIVE,
            ..self.written.header
        };
        let id: &[std::sync::atomic::AtomicU64; ENGINE_ID_FIELD_SIZE / 8] =
            self.map.words(ENGINE_ID_OFFSET);
        self.map.header() == expected
            && id
                .iter()
                .zip(&self.written.engine_id)
                .all(|(word, written)| word.load(Ordering::Relaxed) == *written)
            && self.map.word(SEQ_OFFSET).load(Ordering::Relaxed) != 0
    }

    /// The latest snapshot published in this file (a seqlock read of the
    /// writer's own mapping), e.g. to carry it over into a recreated file.
    /// `None` if no consistent copy could be read (a write is in progress in
    /// a killed thread), if the file was truncated under the mapping (which
    /// then faulted and reads zero pages) and nothing was published since
    /// (sequence 0, never a snapshot), or if part of the file was zeroed in
    /// place (truncated to a few bytes and grown back before any fault: the
    /// payload may be cut anywhere, and nothing tells whether a publish
    /// rewrote it since, so none of it is trusted).
    pub fn snapshot(&self) -> Option<Snapshot> {
        let (words, seq) =
            seqlock::read(self.map.word(SEQ_OFFSET), self.map.words(PAYLOAD_OFFSET)).ok()?;
        // After the read (whose Acquire fence orders these loads after its
        // own): a cut that zeroed payload words read above zeroed the
        // engine id field past them as well. A mapping that faulted is
        // private zero pages: everything in it was published since.
        (seq != 0 && (self.map.truncated() || self.intact())).then(|| Snapshot::from_words(words))
    }

    /// The generation of this file.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl ShmWriter {
    /// Creates (or takes over from a dead writer) the file of `engine_id` in `dir`.
    ///
    /// `first` is published before the file becomes visible, so readers never
    /// see a file without a snapshot.
    pub fn create(
        dir: &Path,
        engine_id: &EngineId,
        options: &WriterOptions,
        first: &Snapshot,
    ) -> Result<ShmWriter, Error> {
        ShmWriter::create_in(dir, engine_id, options, first, None)
    }

    /// A new file for the writer of `previous`, whose file readers no longer
    /// see ([`Heartbeat::in_place`] is false): removed, replaced, or
    /// truncated. In the same directory under the same engine id; its
    /// generation is above `previous`'s whatever the path holds now, so
    /// readers that knew the old file see a new generation.
    ///
    /// If the path still names the old file (truncated, grown, or zeroed by
    /// another process), the new file is renamed over it: the writer of
    /// `previous` holds its lock, so no other writer can be replacing it
    /// meanwhile. That writer must therefore still be alive (not retired)
    /// until this returns; if it was retired, this fails and touches
    /// nothing. Anything else on the path is treated as by
    /// [`ShmWriter::create`].
    ///
    /// A directory that was swapped for a symbolic link since `previous`
    /// was created is refused (nothing is written through it): readers of
    /// the directory never follow a link to an engine's file, and a link
    /// swapped in points wherever its maker chose.
    pub fn create_after(
        previous: &Heartbeat,
        options: &WriterOptions,
        first: &Snapshot,
    ) -> Result<ShmWriter, Error> {
        let dir = previous.path.parent().unwrap_or(Path::new("."));
        if !previous.dir_was_link && is_link(dir) {
            return Err(Error::io(
                "recreate the engine's file in",
                dir,
                io::Error::other(
                    "the directory was replaced by a symbolic link, which is not followed; \
                     put the directory back (or restart the engine with the link's target as \
                     its directory)",
                ),
            ));
        }
        ShmWriter::create_in(dir, &previous.engine_id, options, first, Some(previous))
    }

    fn create_in(
        dir: &Path,
        engine_id: &EngineId,
        options: &WriterOptions,
        first: &Snapshot,
        replacing: Option<&Heartbeat>,
    ) -> Result<ShmWriter, Error> {
        let meta = std::fs::metadata(dir).map_err(|e| Error::io("read directory", dir, e))?;
        let dir_was_link = replacing.map_or_else(|| is_link(dir), |beat| beat.dir_was_link);
        if !meta.is_dir() {
            return Err(Error::io(
                "use as a directory",
                dir,
                io::Error::other("not a directory"),
            ));
        }
        let path = dir.join(engine_id.as_str());
        // A few rounds: another writer may replace or create the file between
        // our steps; each round starts over from what the path holds now.
        let own = replacing.map(|beat| beat.file_id);
        let previous = replacing.map_or(0, |beat| beat.generation);
        for _ in 0..8 {
            // What the path holds now: its lock (a dead writer's file) and
            // generation, and whether the new file is renamed over it.
            let (old_lock, old_generation, rename) = match take_over(&path, engine_id, own)? {
                TakeOver::Raced => continue,
                TakeOver::Nothing => (None, 0, false),
                TakeOver::Dead { lock, generation } => (Some(lock), generation, true),
                TakeOver::Own => {
                    let beat = replacing.expect("only a replacement owns the file");
                    // Relaxed: stored by this process only (`retire`).
                    if beat.map.word(STATE_WORD * 8).load(Ordering::Relaxed) == STATE_RETIRED {
                        // Its lock may be released: another writer could be
                        // replacing the path now. Never clobber that.
                        return Err(Error::io(
                            "replace",
                            &path,
                            io::Error::other("its writer was closed; create a new writer"),
                        ));
                    }
                    (None, previous, true)
                }
            };
            let generation = (old_generation + 1).max(previous + 1);
            let (lock, map, header) =
                create_filled(dir, &path, engine_id, options, first, generation)?;
            let tmp = tmp_path(dir, engine_id);
            let placed = if rename {
                // We hold the old file's lock (taken over, or held by the
                // writer we replace) and checked that the path names it, so
                // no other writer can replace it meanwhile: rename over it.
                std::fs::rename(&tmp, &path)
            } else {
                // Nothing was there: link fails if someone created it since.
                std::fs::hard_link(&tmp, &path).and_then(|()| std::fs::remove_file(&tmp))
            };
            match placed {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let _ = std::fs::remove_file(&tmp);
                    continue;
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(Error::io("move into place", &path, e));
                }
            }
            drop(old_lock);
            let meta = lock.metadata().map_err(|e| Error::io("stat", &path, e))?;
            // Relaxed: our own store (the first snapshot's, in `create_filled`).
            let seq = map.word(SEQ_OFFSET).load(Ordering::Relaxed);
            return Ok(ShmWriter {
                map: Arc::new(map),
                path,
                engine_id: engine_id.clone(),
                generation,
                inode: meta.ino(),
                dev: meta.dev(),
                fork_generation: fork_generation(),
                written: Written::new(header, engine_id),
                seq,
                seq_record: Arc::new(SeqRecord::new(seq)),
                dir_was_link,
                _lock: lock,
                retired: false,
            });
        }
        Err(Error::io(
            "create",
            &path,
            io::Error::other("the file kept changing under us; retry"),
        ))
    }

    /// Publishes one snapshot (the seqlock write of DESIGN §5).
    ///
    /// In a process forked from the one that created the writer this writes
    /// nothing and returns [`WrongProcess`]: the child must create its own writer.
    #[inline]
    pub fn publish(&mut self, snapshot: &Snapshot) -> Result<(), WrongProcess> {
        if fork_generation() != self.fork_generation || self.retired {
            return Err(WrongProcess);
        }
        let words: [u64; SNAPSHOT_WORDS] = snapshot.to_words();
        let seq = self.map.word(SEQ_OFFSET);
        // Relaxed: only this thread stores the word, unless another process
        // wrote into the file, which is what this load looks for.
        if seq.load(Ordering::Relaxed) != self.seq {
            // Relaxed: read on its own by the heartbeat's check.
            self.seq_record.foreign.store(true, Ordering::Relaxed);
        }
        let target = self.seq.wrapping_add(2);
        // Release: pairs with the Acquire load of `target` in
        // `Heartbeat::seq_is_ours` (our store of `self.seq` came before).
        self.seq_record.target.store(target, Ordering::Release);
        // Pairs with the `fence(Acquire)` in `Heartbeat::seq_is_ours`: a
        // check that sees either store of this write into the word sees
        // `target` too. (No instruction on x86.)
        fence(Ordering::Release);
        seqlock::write_after(seq, self.map.words(PAYLOAD_OFFSET), &words, self.seq);
        // Release: pairs with the Acquire load of `done` in
        // `Heartbeat::seq_is_ours` (the final store into the word came
        // before): from now on an odd `target - 1` in the word is not ours.
        self.seq_record.done.store(target, Ordering::Release);
        self.seq = target;
        Ok(())
    }

    /// The first half of `publish`, as a publishing thread preempted
    /// between its odd and its final store leaves the file.
    #[cfg(test)]
    pub(crate) fn begin_publish_for_test(&mut self) {
        let target = self.seq.wrapping_add(2);
        self.seq_record.target.store(target, Ordering::Release);
        fence(Ordering::Release);
        self.map
            .word(SEQ_OFFSET)
            .store(self.seq.wrapping_add(1), Ordering::Relaxed);
    }

    /// Stores `mono_ns` as the heartbeat (a publish is a sign of life too).
    #[inline]
    pub fn stamp_heartbeat(&self, mono_ns: u64) {
        if !self.retired && fork_generation() == self.fork_generation {
            self.map
                .word(HEARTBEAT_OFFSET)
                .store(mono_ns, Ordering::Relaxed);
        }
    }

    /// A handle for a heartbeat thread.
    pub fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            map: self.map.clone(),
            fork_generation: self.fork_generation,
            path: Arc::from(self.path.as_path()),
            file_id: (self.dev, self.inode),
            engine_id: self.engine_id.clone(),
            generation: self.generation,
            written: self.written,
            seq_record: self.seq_record.clone(),
            dir_was_link: self.dir_was_link,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The engine id.
    pub fn engine_id(&self) -> &EngineId {
        &self.engine_id
    }

    /// This file's generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Marks the file retired and removes it (if the path still names it).
    /// Idempotent; does nothing in a forked child.
    pub fn retire(&mut self) {
        if self.retired || fork_generation() != self.fork_generation {
            return;
        }
        self.retired = true;
        // Pairs with the readers' Relaxed state load followed by their
        // seqlock fences; readers only need to see it eventually.
        self.map
            .word(STATE_WORD * 8)
            .store(STATE_RETIRED, Ordering::Release);
        // We hold the lock, so no other writer can have replaced the path,
        // but a foreign hand may have: only remove our own inode (`lstat`:
        // not a link that points to it).
        if std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| (m.dev(), m.ino()) == (self.dev, self.inode))
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for ShmWriter {
    fn drop(&mut self) {
        self.retire();
    }
}

/// A writer was used in a process forked from the one that created it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this writer belongs to the process that created it (before fork); create a new one in this process")]
pub struct WrongProcess;

enum TakeOver {
    Nothing,
    Raced,
    /// A dead writer's file, locked and retired (generation 0 when it has
    /// the wrong size and no readable header).
    Dead {
        lock: Flock<File>,
        generation: u64,
    },
    /// The file of the writer being replaced (`create_after`), whose lock
    /// that writer holds.
    Own,
}

/// Looks at what `path` holds now: nothing, the file of the writer we
/// replace (`own`, its device and inode), a live writer's file (error), a
/// dead writer's file (locked and retired, its generation returned; also
/// when another process truncated or grew it), or a foreign file (error:
/// never clobbered).
fn take_over(
    path: &Path,
    engine_id: &EngineId,
    own: Option<(u64, u64)>,
) -> Result<TakeOver, Error> {
    // Like a reader (shm_file.rs): never open what is no regular file (a
    // device node's open can have effects of its own; a FIFO's O_RDWR open
    // succeeds), never follow a link out of the directory (retiring a file
    // elsewhere), never block on a FIFO swapped in after the `lstat`.
    crate::shm_file::refuse_irregular_entry(path)?;
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(TakeOver::Nothing),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
            return Err(Error::RefusedEntry {
                path: path.to_owned(),
                what: "symbolic link, not followed".to_owned(),
            })
        }
        Err(e) => return Err(Error::io("open", path, e)),
    };
    let opened = file.metadata().map_err(|e| Error::io("stat", path, e))?;
    if !opened.is_file() {
        // Swapped in between the `lstat` and the open.
        return Err(crate::shm_file::refused(path, opened.file_type()));
    }
    if own == Some((opened.dev(), opened.ino())) {
        // Locking it again would fail: our own writer holds the lock.
        return Ok(TakeOver::Own);
    }
    let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((file, Errno::EWOULDBLOCK)) => {
            return Err(match crate::ShmFile::from_file(file, path) {
                Err(Error::WrongSize { size, expected, .. }) => Error::LiveFileWrongSize {
                    engine_id: engine_id.to_string(),
                    path: path.to_owned(),
                    size,
                    expected,
                },
                opened => Error::AlreadyPublished {
                    engine_id: engine_id.to_string(),
                    path: path.to_owned(),
                    pid: opened.map(|f| f.header().writer_pid).unwrap_or(0),
                },
            });
        }
        Err((_, errno)) => return Err(Error::io("lock", path, errno.into())),
    };
    // The path may have been replaced between open and lock.
    match std::fs::symlink_metadata(path) {
        Ok(m) if (m.dev(), m.ino()) == (opened.dev(), opened.ino()) => {}
        Ok(_) => return Ok(TakeOver::Raced),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(TakeOver::Raced),
        Err(e) => return Err(Error::io("stat", path, e)),
    }
    let old = match crate::ShmFile::validate(&lock, path) {
        Ok(old) => old,
        // Nobody holds its lock, so no writer will ever fix it: truncated
        // or grown by another process (an engine's file, or too short to
        // tell; a foreign file has another magic: `NotEngineState`, refused).
        // Readers already refuse it: nothing to retire.
        Err(Error::WrongSize { .. }) => {
            return Ok(TakeOver::Dead {
                generation: header_generation(&lock).unwrap_or(0),
                lock,
            })
        }
        Err(e) => return Err(e),
    };
    // Tell readers still mapping it that this file is over.
    old.map
        .word(STATE_WORD * 8)
        .store(STATE_RETIRED, Ordering::Release);
    Ok(TakeOver::Dead {
        generation: old.header().generation,
        lock,
    })
}

/// The generation in the header of a file of the wrong size, if it still
/// has one (`pread`: mapping a short file would fault).
fn header_generation(file: &File) -> Option<u64> {
    let mut bytes = [0u8; HEADER_SIZE];
    let read = std::os::unix::fs::FileExt::read_at(file, &mut bytes, 0).ok()?;
    let header: Header = bytemuck::cast(bytes);
    (read == HEADER_SIZE && header.magic == MAGIC).then_some(header.generation)
}

/// Whether `path` itself is a symbolic link (`lstat`). Trailing slashes are
/// dropped first: `lstat("link/")` follows the link, and a directory given
/// as `link/` at creation must read as the same link that `create_after`
/// later checks as the file path's parent (`link`).
fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path.components().as_path()).is_ok_and(|m| m.file_type().is_symlink())
}

fn tmp_path(dir: &Path, engine_id: &EngineId) -> PathBuf {
    dir.join(format!(".{}.tmp.{}", engine_id, std::process::id()))
}

/// Creates the temporary file, locks it, reserves its space and fills it;
/// returns the header it wrote.
///
/// It is locked before it gets its real name, so no other writer can ever
/// see it unlocked and take it for a dead writer's file.
fn create_filled(
    dir: &Path,
    path: &Path,
    engine_id: &EngineId,
    options: &WriterOptions,
    first: &Snapshot,
    generation: u64,
) -> Result<(Flock<File>, Mapping, Header), Error> {
    let tmp = tmp_path(dir, engine_id);
    // A leftover of an earlier process with our pid that died mid-creation.
    let _ = std::fs::remove_file(&tmp);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(options.mode)
        .open(&tmp)
        .map_err(|e| Error::io("create", path, e))?;
    let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((_, errno)) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io("lock", path, errno.into()));
        }
    };
    let fill = || -> Result<(Mapping, Header), Error> {
        // Reserve the pages now, so that a full tmpfs fails here and not with
        // SIGBUS on first touch of the mapping.
        nix::fcntl::posix_fallocate(file.as_raw_fd(), 0, FILE_SIZE as i64)
            .map_err(|errno| Error::io("reserve space for", path, errno.into()))?;
        let map = Mapping::read_write(&file, path)?;
        let period_us = options.publish_period.as_micros().min(u32::MAX as u128) as u32;
        let header = Header::new(
            std::process::id(),
            pid_namespace(),
            period_us,
            unix_ns(),
            generation,
        );
        map.store_bytes(0, bytemuck::bytes_of(&header));
        map.store_bytes(ENGINE_ID_OFFSET, &engine_id.to_field());
        map.word(HEARTBEAT_OFFSET)
            .store(monotonic_ns(), Ordering::Relaxed);
        seqlock::write(
            map.word(SEQ_OFFSET),
            map.words(PAYLOAD_OFFSET),
            &first.to_words(),
        );
        Ok((map, header))
    };
    match fill() {
        Ok((map, header)) => Ok((file, map, header)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}
