//! Creation and take-over: a writer's file is created atomically (a
//! temporary dot-file, filled, then linked or renamed into place), and a
//! dead writer's file is retired and replaced, never truncated or reused
//! (FORMAT.md, "Creating, replacing and retiring (writers)").

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::damage::{SeqRecord, Written};
use super::{Heartbeat, ShmWriter, WriterOptions};
use crate::clock::{monotonic_ns, pid_namespace, unix_ns};
use crate::engine_id::EngineId;
use crate::error::Error;
use crate::fork::fork_generation;
use crate::layout::*;
use crate::mapping::Mapping;
use crate::seqlock;
use crate::snapshot::Snapshot;

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
            if !place(&tmp_path(dir, engine_id), &path, rename)? {
                continue;
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
}

pub(crate) enum TakeOver {
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
    take_over_with(
        path,
        own,
        |file| match crate::ShmFile::from_file(file, path) {
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
        },
        |lock| match crate::ShmFile::validate(lock, path) {
            Ok(old) => {
                // Tell readers still mapping it that this file is over.
                old.map
                    .word(STATE_WORD * 8)
                    .store(STATE_RETIRED, Ordering::Release);
                Ok(old.header().generation)
            }
            // Nobody holds its lock, so no writer will ever fix it: truncated
            // or grown by another process (an engine's file, or too short to
            // tell; a foreign file has another magic: `NotEngineState`, refused).
            // Readers already refuse it: nothing to retire.
            Err(Error::WrongSize { .. }) => Ok(header_generation(lock).unwrap_or(0)),
            Err(e) => Err(e),
        },
    )
}

/// [`take_over`] for any kind of writer's file (an engine's, a cache
/// digest's): `live` is the error for a file whose lock a live writer
/// holds; `retire_dead` validates a dead writer's file (locked by us),
/// marks it retired and returns its generation, or refuses it (a foreign
/// file is never clobbered).
pub(crate) fn take_over_with(
    path: &Path,
    own: Option<(u64, u64)>,
    live: impl FnOnce(File) -> Error,
    retire_dead: impl FnOnce(&Flock<File>) -> Result<u64, Error>,
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
        Err((file, Errno::EWOULDBLOCK)) => return Err(live(file)),
        Err((_, errno)) => return Err(Error::io("lock", path, errno.into())),
    };
    // The path may have been replaced between open and lock.
    match std::fs::symlink_metadata(path) {
        Ok(m) if (m.dev(), m.ino()) == (opened.dev(), opened.ino()) => {}
        Ok(_) => return Ok(TakeOver::Raced),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(TakeOver::Raced),
        Err(e) => return Err(Error::io("stat", path, e)),
    }
    let generation = retire_dead(&lock)?;
    Ok(TakeOver::Dead { generation, lock })
}

/// Moves the filled temporary file `tmp` to `path`: renamed over what is
/// there (`rename`: we hold the lock of the file the path names, so no
/// other writer can replace it meanwhile), or linked where nothing was
/// (fails if someone created it since). False when the path was taken
/// meanwhile (the caller starts over); `tmp` is gone either way.
pub(crate) fn place(tmp: &Path, path: &Path, rename: bool) -> Result<bool, Error> {
    let placed = if rename {
        std::fs::rename(tmp, path)
    } else {
        std::fs::hard_link(tmp, path).and_then(|()| std::fs::remove_file(tmp))
    };
    match placed {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_file(tmp);
            Ok(false)
        }
        Err(e) => {
            let _ = std::fs::remove_file(tmp);
            Err(Error::io("move into place", path, e))
        }
    }
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
pub(crate) fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path.components().as_path()).is_ok_and(|m| m.file_type().is_symlink())
}

pub(crate) fn tmp_path(dir: &Path, engine_id: &EngineId) -> PathBuf {
    dir.join(format!(".{}.tmp.{}", engine_id, std::process::id()))
}

/// Creates the temporary file ([`create_reserved`]) and fills it; returns
/// the header it wrote.
fn create_filled(
    dir: &Path,
    path: &Path,
    engine_id: &EngineId,
    options: &WriterOptions,
    first: &Snapshot,
    generation: u64,
) -> Result<(Flock<File>, Mapping, Header), Error> {
    let (file, map) = create_reserved(dir, path, engine_id, options.mode, FILE_SIZE)?;
    let fill = || -> Header {
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
        header
    };
    let header = fill();
    Ok((file, map, header))
}

/// Creates the temporary file of `engine_id` in `dir` (`mode`), locks it,
/// reserves its `size` bytes and maps them read-write: a new file of any
/// kind of writer (an engine's, a cache digest's), for the caller to fill
/// and [`place`] at `path`.
///
/// It is locked before it gets its real name, so no other writer can ever
/// see it unlocked and take it for a dead writer's file. On error the
/// temporary file is removed.
pub(crate) fn create_reserved(
    dir: &Path,
    path: &Path,
    engine_id: &EngineId,
    mode: u32,
    size: usize,
) -> Result<(Flock<File>, Mapping), Error> {
    let tmp = tmp_path(dir, engine_id);
    // A leftover of an earlier process with our pid that died mid-creation.
    let _ = std::fs::remove_file(&tmp);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| Error::io("create", path, e))?;
    let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => lock,
        Err((_, errno)) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io("lock", path, errno.into()));
        }
    };
    let reserve = || -> Result<Mapping, Error> {
        // Reserve the pages now, so that a full tmpfs fails here and not with
        // SIGBUS on first touch of the mapping.
        nix::fcntl::posix_fallocate(file.as_raw_fd(), 0, size as i64)
            .map_err(|errno| Error::io("reserve space for", path, errno.into()))?;
        Mapping::read_write_len(&file, path, size)
    };
    match reserve() {
        Ok(map) => Ok((file, map)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}
