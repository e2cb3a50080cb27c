//! Publishing to a shared-memory file: the file's single writer, the
//! keeper that recreates a lost file on the heartbeat thread, and the
//! hand-off between them (docs/ARCHITECTURE.md, "The file"; the keeper:
//! `recreate.rs`); beside it, the engine's cache digest file in
//! `<dir>.cache` (docs/FORMAT.md, "Cache residency").

use std::path::{Path, PathBuf};
use std::sync::Arc;

use engine_state_shm_format::{
    fork_generation, unix_ns, CacheDigest, Clock, DigestOptions, DigestWriter, ShmWriter, Snapshot,
    WriterOptions,
};

use crate::cache::NextDigest;

use crate::config::PublisherConfig;
use crate::error::Error;
use crate::heartbeat::{HeartbeatThread, Ticks};
use crate::recreate::{Handoff, Keeper, PublisherStats};
use crate::stamp::{stamp, CacheWords};

/// The publisher ran in a process forked from the one that created it.
pub(crate) struct WrongProcess;

#[derive(Debug)]
pub(crate) struct ShmBackend {
    writer: ShmWriter,
    /// A writer of a recreated file, from the heartbeat thread.
    handoff: Arc<Handoff>,
    /// The engine's state directory (the digest's is `<dir>.cache`).
    dir: PathBuf,
    /// The cache digest's writer, from the first `publish_cache` on (boxed:
    /// it is larger than the rest of the backend).
    digest: Option<Box<DigestWriter>>,
}

impl ShmBackend {
    /// Creates the engine's file in `dir` (and `dir` when missing) and
    /// starts the heartbeat thread that stamps and keeps it.
    pub(crate) fn start(
        dir: &Path,
        config: &PublisherConfig,
        clock: &Clock,
        ticks: Ticks,
    ) -> Result<(ShmBackend, HeartbeatThread), Error> {
        create_dir(dir)?;
        let options = WriterOptions {
            mode: config.file_mode,
            publish_period: config.period,
        };
        let first = stamp(Snapshot::default(), clock, CacheWords::default());
        let writer =
            ShmWriter::create(dir, &config.engine_id, &options, &first).map_err(Error::from_shm)?;
        // Creation stamped `CLOCK_MONOTONIC`; the heartbeat is on the
        // publisher's clock (the same one unless a test passes one in; read
        // after creation, so never earlier).
        writer.stamp_heartbeat(clock.now_ns());
        let handoff = Arc::new(Handoff::default());
        // A stamp younger than a period is a publish's: left alone.
        let mut keeper = Keeper::new(
            dir.to_path_buf(),
            &writer,
            options,
            handoff.clone(),
            clock.clone(),
        );
        let heartbeat = HeartbeatThread::spawn(move || keeper.tick(), ticks, &config.engine_id)?;
        Ok((
            ShmBackend {
                writer,
                handoff,
                dir: dir.to_path_buf(),
                digest: None,
            },
            heartbeat,
        ))
    }

    /// Publishes `snapshot` (stamped here) into the file, first adopting a
    /// recreated one. `fork_generation`: the creating process's.
    #[inline]
    pub(crate) fn publish(
        &mut self,
        snapshot: Snapshot,
        clock: &Clock,
        cache: CacheWords,
        fork_generation_at_start: u64,
    ) -> Result<(), WrongProcess> {
        if self.handoff.is_ready() {
            // The file was recreated (a new generation): publish there.
            if fork_generation() != fork_generation_at_start {
                return Err(WrongProcess);
            }
            self.handoff.adopt(&mut self.writer);
        }
        let snapshot = stamp(snapshot, clock, cache);
        if self.writer.publish(&snapshot).is_err() {
            return Err(WrongProcess);
        }
        // A publish is a sign of life too.
        self.writer.stamp_heartbeat(snapshot.captured_mono_ns);
        Ok(())
    }

    /// Whether the digest file in place still fits a digest of `capacity`
    /// for the engine file's generation (else `publish_cache` writes a new
    /// file even for an unchanged set: a recreated engine file is a new
    /// generation, whose readers would not use the old digest; a file
    /// removed or replaced by another process is not seen). A recreated
    /// engine file waiting in the hand-off is adopted first, so the answer
    /// is about the file readers see. Called in the creating process only.
    pub(crate) fn digest_current(&mut self, capacity: usize, kv_block_size: u32) -> bool {
        if self.handoff.is_ready() {
            self.handoff.adopt(&mut self.writer);
        }
        let generation = self.generation();
        // `in_place`: one `lstat`, so a digest file that another process
        // removed or replaced is put back at the next capture.
        self.digest.as_ref().is_some_and(|digest| {
            digest.capacity() == capacity
                && digest.generation() == generation
                && digest.last().kv_block_size == kv_block_size
                && digest.in_place()
        })
    }

    /// Writes `next` into the digest file, first creating it (in
    /// `<dir>.cache`, made when missing, `shm-format`'s `cache_dir`) or
    /// replacing it by a new one when its capacity or generation is not the
    /// one needed. Done before any snapshot names `next.version`.
    /// `current`: what [`ShmBackend::digest_current`] answered just before
    /// for `next.capacity` (asked once: it costs an `lstat`).
    pub(crate) fn publish_cache(
        &mut self,
        next: &NextDigest<'_>,
        current: bool,
        clock: &Clock,
        config: &PublisherConfig,
    ) -> Result<(), Error> {
        // `digest_current` adopted a recreated engine file just before.
        let generation = self.generation();
        let digest = CacheDigest::new(next.version, clock.now_ns(), next.blocks.to_vec());
        let captured_unix_ns = clock.unix_ns().unwrap_or_else(unix_ns);
        let options = DigestOptions {
            mode: config.file_mode,
            capacity: next.capacity,
            generation,
            kv_block_size: next.kv_block_size,
        };
        match self.digest.as_mut() {
            Some(writer) if current => writer.publish(&digest, next.held, captured_unix_ns)?,
            // A new file renamed over the old one (which readers then see
            // retired) or put where it was removed, the digest in it before
            // it appears.
            Some(writer) => writer.replace(&options, &digest, next.held, captured_unix_ns)?,
            None => {
                self.digest = Some(Box::new(DigestWriter::create(
                    &self.dir,
                    &config.engine_id,
                    &options,
                    &digest,
                    next.held,
                    captured_unix_ns,
                )?))
            }
        }
        Ok(())
    }

    /// The generation of the engine file being published.
    fn generation(&self) -> u64 {
        self.writer.generation()
    }

    /// Retires the file and removes it (the heartbeat thread is stopped),
    /// and the digest file with it.
    pub(crate) fn close(mut self) {
        if let Some(mut digest) = self.digest.take() {
            digest.retire();
        }
        self.writer.retire();
        self.handoff.clear(); // a recreated file not published into yet
    }

    /// Files lost and recreated.
    pub(crate) fn stats(&self) -> PublisherStats {
        self.handoff.stats()
    }

    /// The file being published.
    pub(crate) fn path(&self) -> &Path {
        self.writer.path()
    }
}

/// Creates the engine-state directory when missing (publishers of engines
/// and of router replicas).
pub(crate) fn create_dir(dir: &Path) -> Result<(), Error> {
    // A missing directory that cannot be created, and something that exists
    // but is not a directory (a regular file, refused by `ShmWriter::create`)
    // are not bad settings but bad directories: I/O errors
    // (`EngineStateError` in Python, not `ValueError`).
    if dir.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|io| Error::CreateDirectory {
        dir: PathBuf::from(dir),
        io,
    })
}
