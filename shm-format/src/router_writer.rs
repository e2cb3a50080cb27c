//! The single writer of one router replica's reservations file,
//! `<dir>.routers/<replica id>` (docs/FORMAT.md, "Shared reservations"):
//! created, replaced and retired by the engine file's rules, with the
//! engine writer's machinery (`writer/create.rs`: a locked temporary
//! dot-file, `posix_fallocate`, then `link`/`rename` into place; a dead
//! writer's file retired and replaced, never reused); every change one
//! seqlock write over the control words and the slots it touches.

use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::Flock;

use crate::clock::{pid_namespace, unix_ns, Clock};
use crate::digest_writer::ensure_sibling_dir;
use crate::engine_id::EngineId;
use crate::error::{Error, RouterError};
use crate::fork::fork_generation;
use crate::heartbeat::DEFAULT_PUBLISH_PERIOD;
use crate::layout::{STATE_ACTIVE, STATE_RETIRED};
use crate::mapping::Mapping;
use crate::reservations::{
    encode_reservation_slot, Reservations, RESERVATION_WORDS, SLOT_COUNTERS_OFFSET, SLOT_WORDS,
};
use crate::router_layout::*;
use crate::seqlock;
use crate::shm_file::{read_prefix, read_start};
use crate::writer::create::{create_reserved, place, take_over_with, tmp_path, TakeOver};
use crate::writer::retire::retire_mapped;
use crate::writer::DEFAULT_FILE_MODE;

/// How a [`RouterFileWriter`] creates its file.
#[derive(Clone, Debug)]
pub struct RouterWriterOptions {
    /// Permission bits of the file (default [`DEFAULT_FILE_MODE`]; `0o644`
    /// when the other routers run as another user).
    pub mode: u32,
    /// The heartbeat period recorded in the header (default
    /// [`DEFAULT_PUBLISH_PERIOD`], 50 ms): the heartbeat thread's tick.
    pub heartbeat_period: Duration,
    /// The clock of `changed_mono_ns` and of the first heartbeat
    /// (`CLOCK_MONOTONIC` unless a test drives it).
    pub clock: Clock,
}

impl Default for RouterWriterOptions {
    fn default() -> Self {
        RouterWriterOptions {
            mode: DEFAULT_FILE_MODE,
            heartbeat_period: DEFAULT_PUBLISH_PERIOD,
            clock: Clock::monotonic(),
        }
    }
}

/// The one writer of `<state dir>.routers/<replica id>`: a router replica's
/// reservations per engine, for the other replicas on the host.
///
/// Locked with `flock` for its whole life, like an engine's file, so a
/// second live writer of the same replica id is refused
/// ([`Error::ReplicaInUse`]). It holds [`MAX_ROUTER_ENGINES`] slots; slots
/// `[0, count)` are live, in no particular order (a removal moves the last
/// one into the hole). Dropping the writer retires and removes the file.
///
/// ```
/// use engine_state_shm_format::{EngineId, Reservations, RouterFile, RouterFileWriter, RouterWriterOptions};
///
/// let state_dir = tempfile::tempdir()?;
/// let replica = EngineId::new("router-a")?;
/// let mut writer = RouterFileWriter::create(state_dir.path(), &replica, &RouterWriterOptions::default())?;
/// writer.set("engine-0", &Reservations { num_requests: 2, ongoing_tokens: 900, ..Reservations::default() })?;
///
/// let reader = RouterFile::open(writer.path())?;
/// let record = reader.read()?;
/// assert_eq!(record.engines[0].0.as_str(), "engine-0");
/// assert_eq!(record.engines[0].1.num_requests, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RouterFileWriter {
    map: Arc<Mapping>,
    path: PathBuf,
    dir: PathBuf,
    replica_id: EngineId,
    header: RouterHeader,
    options: RouterWriterOptions,
    dev: u64,
    inode: u64,
    fork_generation: u64,
    /// The sequence this writer stored last (even): see [`seqlock::write_after`].
    seq: u64,
    /// The live slots as this writer wrote them, in slot order: what a
    /// change compares against (only changed words are stored) and what a
    /// replacement file is filled with.
    slots: Vec<(EngineId, Reservations)>,
    /// Engine id → index into `slots`.
    index: HashMap<String, usize, BuildHasherDefault<IdHasher>>,
    // Held for the writer's life; released (closing the file) on drop.
    _lock: Flock<File>,
    retired: bool,
}

/// Stamps the heartbeat word of a router file from another thread (the
/// publisher's heartbeat thread), and checks that the file is still in
/// place. Clones share the mapping.
#[derive(Clone, Debug)]
pub struct RouterHeartbeat {
    map: Arc<Mapping>,
    fork_generation: u64,
    path: Arc<Path>,
    file_id: (u64, u64),
    generation: u64,
}

impl RouterHeartbeat {
    /// Stores `CLOCK_MONOTONIC` as `heartbeat_mono_ns`; see
    /// [`RouterHeartbeat::beat_at`].
    pub fn beat(&self) -> bool {
        self.beat_at(crate::clock::monotonic_ns())
    }

    /// Stores `now_ns` as `heartbeat_mono_ns`. Returns false (and stores
    /// nothing) once the file is retired (the writer closed or replaced it:
    /// take a new handle from the writer) or in a forked child.
    pub fn beat_at(&self, now_ns: u64) -> bool {
        if fork_generation() != self.fork_generation {
            return false;
        }
        // Relaxed: `state` is stored only by this process (`retire`,
        // `replace`); a zeroed or truncated file reads 0 and is not
        // stamped (`in_place` says false).
        match self.map.word(ROUTER_STATE_WORD * 8).load(Ordering::Relaxed) {
            STATE_ACTIVE => {}
            STATE_RETIRED => return false,
            _ => return true,
        }
        // Relaxed: the stamp carries no other data (readers load it
        // Relaxed, outside the seqlock), and only this process stores it.
        self.map
            .word(ROUTER_HEARTBEAT_OFFSET)
            .store(now_ns, Ordering::Relaxed);
        true
    }

    /// Whether readers still see this file at its path (one `lstat`):
    /// false once it was removed, replaced or resized by another process,
    /// or truncated under the mapping; then [`RouterFileWriter::replace`]
    /// puts a new one in place.
    pub fn in_place(&self) -> bool {
        !self.map.truncated()
            && std::fs::symlink_metadata(&self.path).is_ok_and(|m| {
                m.is_file()
                    && (m.dev(), m.ino()) == self.file_id
                    && m.len() == ROUTER_FILE_SIZE as u64
            })
    }

    /// The generation of this file.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl RouterFileWriter {
    /// Creates (or takes over from a dead writer) the reservations file of
    /// `replica_id` for the engines of `state_dir`, in [`routers_dir`]
    /// (created, with `state_dir`'s permission bits, when missing). The
    /// file holds no engine at first; it is ACTIVE with a heartbeat when it
    /// appears.
    pub fn create(
        state_dir: &Path,
        replica_id: &EngineId,
        options: &RouterWriterOptions,
    ) -> Result<RouterFileWriter, Error> {
        let dir = ensure_sibling_dir(state_dir, routers_dir(state_dir))?;
        RouterFileWriter::create_in(dir, replica_id, options, &[], None)
    }

    /// Replaces the file with a new one (generation + 1) holding the same
    /// reservations, renamed over the old one, which is retired first
    /// (readers still mapping it see RETIRED and open the path again). For
    /// a file that is no longer in place ([`RouterHeartbeat::in_place`]):
    /// removed, or damaged by another process. On error this writer is
    /// unchanged and keeps its file. Heartbeat handles of the old file
    /// stop stamping: take a new one.
    pub fn replace(&mut self) -> Result<(), Error> {
        self.check_usable()?;
        let fresh = RouterFileWriter::create_in(
            self.dir.clone(),
            &self.replica_id,
            &self.options,
            &self.slots,
            Some((self.dev, self.inode, self.header.generation)),
        )?;
        // Release: pairs with the readers' Relaxed state load followed by
        // their seqlock fences; readers only need to see it eventually. The
        // path already names the new file, so nothing is removed.
        self.map
            .word(ROUTER_STATE_WORD * 8)
            .store(STATE_RETIRED, Ordering::Release);
        self.retired = true;
        *self = fresh;
        Ok(())
    }

    fn create_in(
        dir: PathBuf,
        replica_id: &EngineId,
        options: &RouterWriterOptions,
        slots: &[(EngineId, Reservations)],
        own: Option<(u64, u64, u64)>,
    ) -> Result<RouterFileWriter, Error> {
        let path = dir.join(replica_id.as_str());
        let previous = own.map_or(0, |(_, _, generation)| generation);
        for _ in 0..8 {
            // The dead writer's lock is held until the new file is in
            // place, so no other writer can be replacing it meanwhile.
            let (rename, old_lock, old_generation) = match take_over_with(
                &path,
                own.map(|(dev, ino, _)| (dev, ino)),
                |file| live_writer(file, &path, replica_id),
                |lock| retire_dead(lock, &path),
            )? {
                TakeOver::Raced => continue,
                TakeOver::Nothing => (false, None, 0),
                TakeOver::Dead { lock, generation } => (true, Some(lock), generation),
                TakeOver::Own => (true, None, previous),
            };
            let generation = (old_generation + 1).max(previous + 1);
            let (lock, map) =
                create_reserved(&dir, &path, replica_id, options.mode, ROUTER_FILE_SIZE)?;
            let period_us = options.heartbeat_period.as_micros().min(u32::MAX as u128) as u32;
            let header = RouterHeader::new(
                std::process::id(),
                pid_namespace(),
                period_us,
                unix_ns(),
                generation,
                MAX_ROUTER_ENGINES as u32,
            );
            // Relaxed stores into a file no other process can see yet; the
            // `rename`/`link` that publishes it orders them for readers.
            map.store_bytes(0, &header.to_le_bytes());
            map.store_bytes(REPLICA_ID_OFFSET, &replica_id.to_field());
            map.word(ROUTER_HEARTBEAT_OFFSET)
                .store(options.clock.now_ns(), Ordering::Relaxed);
            let mut writer = RouterFileWriter {
                map: Arc::new(map),
                path: path.clone(),
                dir: dir.clone(),
                replica_id: replica_id.clone(),
                header,
                options: options.clone(),
                dev: 0,
                inode: 0,
                fork_generation: fork_generation(),
                seq: 0,
                slots: Vec::new(),
                index: HashMap::default(),
                _lock: lock,
                // Not yet in place: dropping it on error removes nothing.
                retired: true,
            };
            writer.fill(slots);
            if !place(&tmp_path(&dir, replica_id), &path, rename)? {
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

    /// The first write of a new file (sequence 0 → 2): `slots` (a
    /// replaced file's), count, changed. Readers never see sequence 0 in
    /// a file in place.
    fn fill(&mut self, slots: &[(EngineId, Reservations)]) {
        let map = Arc::clone(&self.map);
        let now = self.options.clock.now_ns();
        seqlock::write_with_after(map.word(ROUTER_SEQ_OFFSET), self.seq, || {
            // Relaxed stores between the seqlock's fences (see `seqlock`).
            for (index, (engine_id, counters)) in slots.iter().enumerate() {
                store_slot(slot_words(&map, index), engine_id, counters);
            }
            store_control(&map, slots.len(), now);
        });
        self.seq = self.seq.wrapping_add(2);
        self.slots = slots.to_vec();
        self.index = slots
            .iter()
            .enumerate()
            .map(|(index, (engine_id, _))| (engine_id.as_str().to_owned(), index))
            .collect();
    }

    /// This replica's reservations on `engine_id` are now `counters`: one
    /// seqlock write storing the words that changed (nothing when none
    /// did). An engine not yet in the file gets the next free slot (engine
    /// id, counters and count in the same write).
    ///
    /// Fails with [`Error::InvalidEngineId`] for an id that is not an
    /// [`EngineId`], [`Error::RouterCapacity`] when the file already holds
    /// [`MAX_ROUTER_ENGINES`] others, and after [`RouterFileWriter::retire`]
    /// or in a process forked from the creator.
    #[inline]
    pub fn set(&mut self, engine_id: &str, counters: &Reservations) -> Result<(), Error> {
        self.set_with(engine_id, counters, None)
    }

    /// [`RouterFileWriter::set`] with `changed_mono_ns`, a reading of the
    /// writer's clock the caller already holds (a router takes one per
    /// decision): saves the clock read, a third of a `set`'s cost.
    #[inline]
    pub fn set_at(
        &mut self,
        engine_id: &str,
        counters: &Reservations,
        changed_mono_ns: u64,
    ) -> Result<(), Error> {
        self.set_with(engine_id, counters, Some(changed_mono_ns))
    }

    #[inline]
    fn set_with(
        &mut self,
        engine_id: &str,
        counters: &Reservations,
        now: Option<u64>,
    ) -> Result<(), Error> {
        self.check_usable()?;
        match self.index.get(engine_id) {
            Some(&index) => {
                self.update(index, counters, now);
                Ok(())
            }
            None => self.insert(engine_id, counters, now),
        }
    }

    #[inline]
    fn update(&mut self, index: usize, counters: &Reservations, now: Option<u64>) {
        let old = self.slots[index].1.to_words();
        let new = counters.to_words();
        // Word by word (no `memcmp` call): which words the write stores.
        let changed_words = old.iter().zip(&new).filter(|(o, n)| o != n).count();
        if changed_words == 0 {
            return;
        }
        let words: &[AtomicU64; RESERVATION_WORDS] = self
            .map
            .words(router_slot_offset(index) + SLOT_COUNTERS_OFFSET);
        let changed = self.map.word(ROUTER_CHANGED_OFFSET);
        let now = now.unwrap_or_else(|| self.options.clock.now_ns());
        seqlock::write_with_after(self.map.word(ROUTER_SEQ_OFFSET), self.seq, || {
            // Relaxed stores between the seqlock's fences (see `seqlock`):
            // the same counted-words protocol as a cache digest's, checked
            // by loom (`seqlock::loom_tests::counted_words_are_copied_whole`).
            for ((word, new), old) in words.iter().zip(new).zip(old) {
                if new != old {
                    word.store(new, Ordering::Relaxed);
                }
            }
            changed.store(now, Ordering::Relaxed);
        });
        self.seq = self.seq.wrapping_add(2);
        self.slots[index].1 = *counters;
    }

    fn insert(
        &mut self,
        engine_id: &str,
        counters: &Reservations,
        now: Option<u64>,
    ) -> Result<(), Error> {
        let engine_id = EngineId::new(engine_id)?;
        let index = self.slots.len();
        if index >= self.capacity() {
            return Err(Error::RouterCapacity {
                replica_id: self.replica_id.to_string(),
                engine_id: engine_id.to_string(),
                capacity: self.capacity(),
            });
        }
        let map = Arc::clone(&self.map);
        let now = now.unwrap_or_else(|| self.options.clock.now_ns());
        seqlock::write_with_after(map.word(ROUTER_SEQ_OFFSET), self.seq, || {
            // The slot and the count that makes it live, in one write: a
            // reader sees both or neither.
            store_slot(slot_words(&map, index), &engine_id, counters);
            store_control(&map, index + 1, now);
        });
        self.seq = self.seq.wrapping_add(2);
        self.index.insert(engine_id.as_str().to_owned(), index);
        self.slots.push((engine_id, *counters));
        Ok(())
    }

    /// Removes `engine_id`'s slot (the router no longer has the engine):
    /// the last slot moves into its place, count − 1, the vacated slot is
    /// zeroed, in one seqlock write. False when the engine was not in the
    /// file. Fails only after [`RouterFileWriter::retire`] or in a forked
    /// child.
    pub fn remove(&mut self, engine_id: &str) -> Result<bool, Error> {
        self.check_usable()?;
        let Some(index) = self.index.remove(engine_id) else {
            return Ok(false);
        };
        let last = self.slots.len() - 1;
        let map = Arc::clone(&self.map);
        let now = self.options.clock.now_ns();
        let moved = (index != last).then(|| self.slots[last].clone());
        seqlock::write_with_after(map.word(ROUTER_SEQ_OFFSET), self.seq, || {
            // Relaxed stores between the seqlock's fences: a reader sees the
            // moved slot, the zeroed one and the new count together, or the
            // file as it was (loom: `a_removal_moving_the_last_slot_is_copied_whole`).
            if let Some((engine_id, counters)) = &moved {
                store_slot(slot_words(&map, index), engine_id, counters);
            }
            for word in slot_words(&map, last) {
                word.store(0, Ordering::Relaxed);
            }
            store_control(&map, last, now);
        });
        self.seq = self.seq.wrapping_add(2);
        self.slots.swap_remove(index);
        if let Some((engine_id, _)) = moved {
            self.index.insert(engine_id.as_str().to_owned(), index);
        }
        Ok(true)
    }

    fn check_usable(&self) -> Result<(), Error> {
        if self.retired || fork_generation() != self.fork_generation {
            return Err(Error::io(
                "write reservations into",
                &self.path,
                io::Error::other(
                    "this router writer was closed, or belongs to the process that created it \
                     (before fork); create a new one",
                ),
            ));
        }
        Ok(())
    }

    /// A handle for a heartbeat thread.
    pub fn heartbeat(&self) -> RouterHeartbeat {
        RouterHeartbeat {
            map: Arc::clone(&self.map),
            fork_generation: self.fork_generation,
            path: Arc::from(self.path.as_path()),
            file_id: (self.dev, self.inode),
            generation: self.header.generation,
        }
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
            ROUTER_STATE_WORD,
            &self.path,
            (self.dev, self.inode),
        );
    }

    /// Retires the file and releases the lock (as dropping the writer does).
    pub fn close(mut self) {
        self.retire();
    }

    /// Whether readers still see this file at its path (see
    /// [`RouterHeartbeat::in_place`]).
    pub fn in_place(&self) -> bool {
        self.heartbeat().in_place()
    }

    /// The reservations as last written, in slot order.
    pub fn engines(&self) -> &[(EngineId, Reservations)] {
        &self.slots
    }

    /// This replica's reservations on `engine_id`, if it is in the file.
    pub fn get(&self, engine_id: &str) -> Option<&Reservations> {
        self.index.get(engine_id).map(|&index| &self.slots[index].1)
    }

    /// Slots in the file ([`MAX_ROUTER_ENGINES`]).
    pub fn capacity(&self) -> usize {
        self.header.capacity as usize
    }

    /// The file's header (`state` as written at creation).
    pub fn header(&self) -> &RouterHeader {
        &self.header
    }

    /// This file's generation.
    pub fn generation(&self) -> u64 {
        self.header.generation
    }

    /// The replica id.
    pub fn replica_id(&self) -> &EngineId {
        &self.replica_id
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RouterFileWriter {
    fn drop(&mut self) {
        self.retire();
    }
}

/// The hasher of the writer's engine id → slot map: FxHash's mix (a
/// rotate, an xor and a multiply per 8 bytes), a few ns for an id where
/// SipHash takes a fifth of a `set`. The ids come from the router's own
/// configuration, so flooding resistance buys nothing here.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().expect("chunks_exact(8)"));
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
        }
        let mut tail = [0u8; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    }

    #[inline]
    fn write_u8(&mut self, byte: u8) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

fn slot_words(map: &Mapping, index: usize) -> &[AtomicU64; SLOT_WORDS] {
    map.words(router_slot_offset(index))
}

/// Relaxed stores of a whole slot, inside a seqlock write.
fn store_slot(words: &[AtomicU64; SLOT_WORDS], engine_id: &EngineId, counters: &Reservations) {
    let values: [u64; SLOT_WORDS] = bytemuck::cast(encode_reservation_slot(engine_id, counters));
    for (word, value) in words.iter().zip(values) {
        word.store(value, Ordering::Relaxed);
    }
}

/// Relaxed stores of `count` and `changed_mono_ns`, inside a seqlock write.
fn store_control(map: &Mapping, count: usize, changed_mono_ns: u64) {
    map.word(ROUTER_COUNT_OFFSET)
        .store(count as u64, Ordering::Relaxed);
    map.word(ROUTER_CHANGED_OFFSET)
        .store(changed_mono_ns, Ordering::Relaxed);
}

/// The error for a router file whose lock a live writer holds.
fn live_writer(file: File, path: &Path, replica_id: &EngineId) -> Error {
    let pid = read_start::<ROUTER_HEADER_SIZE>(&file)
        .map_or(0, |s| RouterHeader::from_le_bytes(&s).writer_pid);
    Error::ReplicaInUse {
        replica_id: replica_id.to_string(),
        path: path.to_owned(),
        pid,
    }
}

/// A dead writer's router file (locked by us): marked retired when it is a
/// router file of the right size (readers may still map it); a file of the
/// wrong size is replaced as it is (readers already refuse it); a foreign
/// file is refused, never clobbered. Returns its generation (0 when its
/// header is unreadable).
fn retire_dead(lock: &Flock<File>, path: &Path) -> Result<u64, Error> {
    let meta = lock.metadata().map_err(|e| Error::io("stat", path, e))?;
    let mut start = [0u8; ROUTER_HEADER_SIZE];
    let have = read_prefix(lock, &mut start).map_err(|e| Error::io("read", path, e))?;
    let header = RouterHeader::from_le_bytes(&start);
    if have >= 8 && header.magic != ROUTER_MAGIC {
        return Err(Error::Router {
            path: path.to_owned(),
            error: RouterError::NotRouter,
        });
    }
    if have < ROUTER_HEADER_SIZE {
        return Ok(0);
    }
    if header.check().is_ok()
        && meta.len() == router_file_size(header.capacity as usize) as u64
        && header.state == STATE_ACTIVE
    {
        let map = Mapping::read_write_len(lock, path, ROUTER_HEADER_SIZE)?;
        // Release: as in `retire`.
        map.word(ROUTER_STATE_WORD * 8)
            .store(STATE_RETIRED, Ordering::Release);
    }
    Ok(header.generation)
}
