//! The single writer of one engine's cache digest file, `<dir>.cache/<id>`
//! (docs/FORMAT.md, "Cache residency"): created, replaced and retired by
//! the engine file's rules, with the engine writer's machinery
//! (`writer/create.rs`: a locked temporary dot-file, `posix_fallocate`,
//! then `link`/`rename` into place; a dead writer's file retired and
//! replaced, never reused); published with the seqlock over its control
//! words and entries.

use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use nix::fcntl::Flock;

use crate::clock::unix_ns;
use crate::digest::CacheDigest;
use crate::digest_layout::*;
use crate::digest_value::DigestRecord;
use crate::engine_id::EngineId;
use crate::error::Error;
use crate::fork::fork_generation;
use crate::layout::{STATE_ACTIVE, STATE_RETIRED};
use crate::mapping::Mapping;
use crate::seqlock;
use crate::shm_file::{read_prefix, read_start};
use crate::writer::create::{create_reserved, place, take_over_with, tmp_path, TakeOver};
use crate::writer::retire::retire_mapped;
use crate::writer::DEFAULT_FILE_MODE;

/// How a [`DigestWriter`] creates its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DigestOptions {
    /// Permission bits of the file (default [`DEFAULT_FILE_MODE`]; give it
    /// the engine file's).
    pub mode: u32,
    /// Entries the file holds, fixed at creation (at most
    /// [`MAX_DIGEST_ENTRIES`]; see [`crate::default_cache_capacity`]).
    pub capacity: usize,
    /// The generation of the engine's file (or Redis record) the digest
    /// belongs to: readers use the digest only when they are equal.
    pub generation: u64,
    /// The engine's KV block size in tokens (display).
    pub kv_block_size: u32,
}

impl Default for DigestOptions {
    fn default() -> Self {
        DigestOptions {
            mode: DEFAULT_FILE_MODE,
            capacity: 0,
            generation: 1,
            kv_block_size: 0,
        }
    }
}

/// The one writer of `<dir>.cache/<engine id>`.
///
/// Locked with `flock` for its whole life, like the engine's file. Its size
/// is fixed at creation ([`digest_size`] of the capacity): a digest that
/// needs another capacity (or a new engine generation) goes into a new file
/// renamed over this one ([`DigestWriter::replace`]). Dropping the writer
/// retires and removes the file.
#[derive(Debug)]
pub struct DigestWriter {
    map: Mapping,
    path: PathBuf,
    dir: PathBuf,
    engine_id: EngineId,
    header: DigestHeader,
    mode: u32,
    dev: u64,
    inode: u64,
    fork_generation: u64,
    /// The sequence this writer stored last (even): see [`seqlock::write_after`].
    seq: u64,
    last: DigestRecord,
    // Held for the writer's life; released (closing the file) on drop.
    _lock: Flock<File>,
    retired: bool,
}

impl DigestWriter {
    /// Creates (or takes over from a dead writer) the digest file of
    /// `engine_id` for the engines of `state_dir`, in [`cache_dir`]
    /// (created, with `state_dir`'s permission bits, when missing), with
    /// `first` published before the file becomes visible.
    ///
    /// `held` is how many router blocks the engine held (at least
    /// `first.len()`: more when `first` was cut to the capacity);
    /// `captured_unix_ns` the capture's `CLOCK_REALTIME`. Fails with
    /// [`Error::DigestCapacity`] when the capacity is above
    /// [`MAX_DIGEST_ENTRIES`] or `first` does not fit it.
    pub fn create(
        state_dir: &Path,
        engine_id: &EngineId,
        options: &DigestOptions,
        first: &CacheDigest,
        held: u64,
        captured_unix_ns: u64,
    ) -> Result<DigestWriter, Error> {
        let dir = ensure_cache_dir(state_dir)?;
        DigestWriter::create_in(dir, engine_id, options, first, held, captured_unix_ns, None)
    }

    /// Replaces the file with a new one for `options` (a new capacity, or
    /// the engine file's new generation), `first` published in it before
    /// it is renamed over the old one; the old file is retired (readers
    /// still mapping it see RETIRED and open the path again). On error this
    /// writer is unchanged and keeps its file.
    pub fn replace(
        &mut self,
        options: &DigestOptions,
        first: &CacheDigest,
        held: u64,
        captured_unix_ns: u64,
    ) -> Result<(), Error> {
        self.check_usable()?;
        let fresh = DigestWriter::create_in(
            self.dir.clone(),
            &self.engine_id,
            options,
            first,
            held,
            captured_unix_ns,
            Some((self.dev, self.inode)),
        )?;
        // Pairs with the readers' Relaxed state load followed by their
        // seqlock fences; readers only need to see it eventually. The path
        // already names the new file, so nothing is removed.
        self.map
            .word(DIGEST_STATE_WORD * 8)
            .store(STATE_RETIRED, Ordering::Release);
        self.retired = true;
        *self = fresh;
        Ok(())
    }

    fn create_in(
        dir: PathBuf,
        engine_id: &EngineId,
        options: &DigestOptions,
        first: &CacheDigest,
        held: u64,
        captured_unix_ns: u64,
        own: Option<(u64, u64)>,
    ) -> Result<DigestWriter, Error> {
        check_fits(first.len(), options.capacity)?;
        let path = dir.join(engine_id.as_str());
        for _ in 0..8 {
            // The dead writer's lock is held until the new file is in
            // place, so no other writer can be replacing it meanwhile.
            let (rename, old_lock) = match take_over_with(
                &path,
                own,
                |file| live_writer(file, &path, engine_id),
                |lock| retire_dead(lock, &path),
            )? {
                TakeOver::Raced => continue,
                TakeOver::Nothing => (false, None),
                TakeOver::Dead { lock, .. } => (true, Some(lock)),
                TakeOver::Own => (true, None),
            };
            let size = digest_size(options.capacity);
            let (lock, map) = create_reserved(&dir, &path, engine_id, options.mode, size)?;
            let header = DigestHeader::new(
                std::process::id(),
                options.capacity as u32,
                options.generation,
                unix_ns(),
                options.kv_block_size,
            );
            map.store_bytes(0, &header.to_le_bytes());
            let mut writer = DigestWriter {
                map,
                path: path.clone(),
                dir: dir.clone(),
                engine_id: engine_id.clone(),
                header,
                mode: options.mode,
                dev: 0,
                inode: 0,
                fork_generation: fork_generation(),
                seq: 0,
                last: DigestRecord::default(),
                _lock: lock,
                // Not yet in place: dropping it on error removes nothing.
                retired: true,
            };
            writer.write(first, held, captured_unix_ns);
            if !place(&tmp_path(&dir, engine_id), &path, rename)? {
                continue;
            }
            drop(old_lock);
            let meta = writer
                ._lock
                .metadata()
                .map_err(|e| Error::io("stat", &path, e))?;
            (writer.dev, writer.inode) = (meta.dev(), meta.ino());
            writer.retired = false;
            return Ok(writer);
        }
        Err(Error::io(
            "create",
            &path,
            io::Error::other("the file kept changing under us; retry"),
        ))
    }

    /// Publishes a new digest (the seqlock write of docs/FORMAT.md, "The
    /// seqlock protocol", over the control words and the first
    /// `digest.len()` entries). The caller decides when the digest changed
    /// and gives it a new version; `held` below `digest.len()` is written
    /// as `digest.len()`.
    ///
    /// Fails with [`Error::DigestCapacity`] when `digest` does not fit the
    /// file's capacity (then [`DigestWriter::replace`] with a larger one,
    /// or cut it with [`crate::cut_prefix_closed`]), and after
    /// [`DigestWriter::retire`] or in a process forked from the creator.
    pub fn publish(
        &mut self,
        digest: &CacheDigest,
        held: u64,
        captured_unix_ns: u64,
    ) -> Result<(), Error> {
        self.check_usable()?;
        check_fits(digest.len(), self.capacity())?;
        self.write(digest, held, captured_unix_ns);
        Ok(())
    }

    fn write(&mut self, digest: &CacheDigest, held: u64, captured_unix_ns: u64) {
        let record = DigestRecord {
            writer_pid: self.header.writer_pid,
            generation: self.header.generation,
            created_unix_ns: self.header.created_unix_ns,
            kv_block_size: self.header.kv_block_size,
            captured_unix_ns,
            held: held.max(digest.len() as u64),
            // What a reader of this write reads: the digest with the
            // record's `held` and `kv_block_size`.
            digest: CacheDigest::from_ascending(
                digest.version(),
                digest.captured_mono_ns(),
                digest.blocks().to_vec(),
                held,
                self.header.kv_block_size,
            ),
        };
        let control = record.control_words();
        let control_words = self
            .map
            .words::<DIGEST_CONTROL_WORDS>(DIGEST_CONTROL_OFFSET);
        let entries = self.map.word_slice(DIGEST_ENTRIES_OFFSET, self.capacity());
        seqlock::write_with_after(self.map.word(DIGEST_SEQ_OFFSET), self.seq, || {
            // Relaxed stores between the seqlock's fences (see `seqlock`).
            for (word, value) in control_words.iter().zip(control) {
                word.store(value, Ordering::Relaxed);
            }
            for (word, block) in entries.iter().zip(digest.blocks()) {
                word.store(*block, Ordering::Relaxed);
            }
        });
        self.seq = self.seq.wrapping_add(2);
        self.last = record;
    }

    fn check_usable(&self) -> Result<(), Error> {
        if self.retired || fork_generation() != self.fork_generation {
            return Err(Error::io(
                "publish into",
                &self.path,
                io::Error::other(
                    "this digest writer was closed, or belongs to the process that created it \
                     (before fork); create a new one",
                ),
            ));
        }
        Ok(())
    }

    /// Marks the file retired and removes it (if the path still names it).
    /// Idempotent; does nothing in a forked child.
    pub fn retire(&mut self) {
        if self.retired || fork_generation() != self.fork_generation {
            return;
        }
        self.retired = true;
        retire_mapped(
            &self.map,
            DIGEST_STATE_WORD,
            &self.path,
            (self.dev, self.inode),
        );
    }

    /// Retires the file and releases the lock (as dropping the writer does).
    pub fn close(mut self) {
        self.retire();
    }

    /// Whether readers still see this file at its path (one `lstat`): false
    /// once it was removed, replaced or resized by another process; then
    /// [`DigestWriter::replace`] puts a new one in place.
    pub fn in_place(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| {
            (m.dev(), m.ino()) == (self.dev, self.inode)
                && m.len() == digest_size(self.capacity()) as u64
        })
    }

    /// The digest last published, with its header's fields (what
    /// [`crate::encode_digest_value`] makes a Redis value of).
    pub fn last(&self) -> &DigestRecord {
        &self.last
    }

    /// Entries the file holds.
    pub fn capacity(&self) -> usize {
        self.header.capacity as usize
    }

    /// The engine generation this digest belongs to.
    pub fn generation(&self) -> u64 {
        self.header.generation
    }

    /// The options the file was created with.
    pub fn options(&self) -> DigestOptions {
        DigestOptions {
            mode: self.mode,
            capacity: self.capacity(),
            generation: self.header.generation,
            kv_block_size: self.header.kv_block_size,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DigestWriter {
    fn drop(&mut self) {
        self.retire();
    }
}

fn check_fits(count: usize, capacity: usize) -> Result<(), Error> {
    if capacity > MAX_DIGEST_ENTRIES || count > capacity {
        return Err(Error::DigestCapacity { count, capacity });
    }
    Ok(())
}

/// The cache directory of `state_dir`, created when missing with
/// `state_dir`'s permission bits (whoever may list the engines may list
/// their digests).
fn ensure_cache_dir(state_dir: &Path) -> Result<PathBuf, Error> {
    ensure_sibling_dir(state_dir, cache_dir(state_dir))
}

/// `sibling` (a directory next to `state_dir`: [`cache_dir`],
/// [`crate::routers_dir`]), created when missing with `state_dir`'s
/// permission bits (whoever may list the engines may list it); both must be
/// directories.
pub(crate) fn ensure_sibling_dir(state_dir: &Path, sibling: PathBuf) -> Result<PathBuf, Error> {
    let meta =
        std::fs::metadata(state_dir).map_err(|e| Error::io("read directory", state_dir, e))?;
    if !meta.is_dir() {
        return Err(Error::io(
            "use as a directory",
            state_dir,
            io::Error::other("not a directory"),
        ));
    }
    let dir = sibling;
    match std::fs::DirBuilder::new()
        .mode(meta.permissions().mode() & 0o7777)
        .create(&dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("create directory", &dir, e)),
    }
    let made = std::fs::metadata(&dir).map_err(|e| Error::io("read directory", &dir, e))?;
    if !made.is_dir() {
        return Err(Error::io(
            "use as a directory",
            &dir,
            io::Error::other("not a directory"),
        ));
    }
    Ok(dir)
}

/// The error for a digest file whose lock a live writer holds.
fn live_writer(file: File, path: &Path, engine_id: &EngineId) -> Error {
    let pid = read_start::<DIGEST_FIXED_HEADER_SIZE>(&file)
        .map_or(0, |s| DigestHeader::from_le_bytes(&s).writer_pid);
    Error::AlreadyPublished {
        engine_id: engine_id.to_string(),
        path: path.to_owned(),
        pid,
    }
}

/// A dead writer's digest file (locked by us): marked retired when it is a
/// digest of the right size (readers may still map it); a file of the wrong
/// size is replaced as it is (readers already refuse it); a foreign file is
/// refused, never clobbered. Its generation is not used (a digest's is the
/// engine's).
fn retire_dead(lock: &Flock<File>, path: &Path) -> Result<u64, Error> {
    let meta = lock.metadata().map_err(|e| Error::io("stat", path, e))?;
    let mut start = [0u8; DIGEST_FIXED_HEADER_SIZE];
    let have = read_prefix(lock, &mut start).map_err(|e| Error::io("read", path, e))?;
    let header = DigestHeader::from_le_bytes(&start);
    if have >= 8 && header.magic != DIGEST_MAGIC {
        return Err(Error::Digest {
            path: path.to_owned(),
            error: crate::DigestError::NotDigest,
        });
    }
    if have == start.len()
        && header.check().is_ok()
        && meta.len() == digest_size(header.capacity as usize) as u64
        && header.state == STATE_ACTIVE
    {
        let map = Mapping::read_write_len(lock, path, DIGEST_FIXED_HEADER_SIZE)?;
        map.word(DIGEST_STATE_WORD * 8)
            .store(STATE_RETIRED, Ordering::Release);
    }
    Ok(header.generation)
}
