//! Publishing to a shared-memory file: the file's single writer, the
//! keeper that recreates a lost file on the heartbeat thread, and the
//! hand-off between them (docs/ARCHITECTURE.md, "The file"; the keeper:
//! `recreate.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use engine_state_shm_format::{fork_generation, Clock, ShmWriter, Snapshot, WriterOptions};

use crate::config::PublisherConfig;
use crate::error::Error;
use crate::heartbeat::{HeartbeatThread, Ticks};
use crate::recreate::{Handoff, Keeper, PublisherStats};
use crate::stamp::stamp;

/// The publisher ran in a process forked from the one that created it.
pub(crate) struct WrongProcess;

#[derive(Debug)]
pub(crate) struct ShmBackend {
    writer: ShmWriter,
    /// A writer of a recreated file, from the heartbeat thread.
    handoff: Arc<Handoff>,
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
        let first = stamp(Snapshot::default(), clock);
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
        Ok((ShmBackend { writer, handoff }, heartbeat))
    }

    /// Publishes `snapshot` (stamped here) into the file, first adopting a
    /// recreated one. `fork_generation`: the creating process's.
    #[inline]
    pub(crate) fn publish(
        &mut self,
        snapshot: Snapshot,
        clock: &Clock,
        fork_generation_at_start: u64,
    ) -> Result<(), WrongProcess> {
        if self.handoff.is_ready() {
            // The file was recreated (a new generation): publish there.
            if fork_generation() != fork_generation_at_start {
                return Err(WrongProcess);
            }
            self.handoff.adopt(&mut self.writer);
        }
        let snapshot = stamp(snapshot, clock);
        if self.writer.publish(&snapshot).is_err() {
            return Err(WrongProcess);
        }
        // A publish is a sign of life too.
        self.writer.stamp_heartbeat(snapshot.captured_mono_ns);
        Ok(())
    }

    /// Retires the file and removes it (the heartbeat thread is stopped).
    pub(crate) fn close(mut self) {
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

fn create_dir(dir: &Path) -> Result<(), Error> {
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
