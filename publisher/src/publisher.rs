//! The publisher: one engine's writer plus its heartbeat thread.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use engine_state_reader::StateUri;
use engine_state_shm_format::{
    fork_generation, monotonic_ns, unix_ns, Heartbeat, ShmWriter, Snapshot, WriterOptions,
    FLAG_IDLE,
};

use crate::config::PublisherConfig;
use crate::error::Error;

/// Publishes one engine's snapshots.
///
/// [`Publisher::publish`] is the hot path (called on vLLM's scheduler thread):
/// it stamps the capture clocks and the idle flag and does one seqlock write,
/// with no allocation, lock or system call beyond `clock_gettime` (vDSO).
/// A native heartbeat thread stamps `heartbeat_mono_ns` every period, so an
/// idle engine, or one inside a long forward pass, still shows as alive; it
/// never touches Python. Fork-safe: in a child process `publish` returns
/// [`Error::WrongProcess`] and dropping does nothing to the parent's file.
#[derive(Debug)]
pub struct Publisher {
    config: PublisherConfig,
    writer: Option<ShmWriter>,
    heartbeat: Option<HeartbeatThread>,
    fork_generation: u64,
    owner_pid: u32,
}

#[derive(Debug)]
struct HeartbeatThread {
    stop: mpsc::Sender<()>,
    handle: JoinHandle<()>,
}

impl Publisher {
    /// Creates the engine's file (and its directory when missing) and starts
    /// the heartbeat thread.
    pub fn start(config: PublisherConfig) -> Result<Publisher, Error> {
        let dir = match &config.uri {
            StateUri::Shm { dir } => dir.clone(),
            StateUri::Redis { .. } => {
                return Err(Error::Config {
                    what: format!(
                        "{}: this build has no Redis sink yet; publish to shared memory \
                         (file:///dev/shm/agentic_engine_state) instead",
                        config.uri
                    ),
                })
            }
        };
        create_dir(&dir)?;
        let options = WriterOptions {
            mode: config.file_mode,
            publish_period: config.period,
        };
        let first = stamp(Snapshot::default());
        let writer = ShmWriter::create(&dir, &config.engine_id, &options, &first)?;
        let heartbeat =
            HeartbeatThread::spawn(writer.heartbeat(), config.period, &config.engine_id)?;
        Ok(Publisher {
            config,
            writer: Some(writer),
            heartbeat: Some(heartbeat),
            fork_generation: fork_generation(),
            owner_pid: std::process::id(),
        })
    }

    /// Publishes `snapshot`: `captured_mono_ns`, `captured_unix_ns` and the idle
    /// flag are set here (whatever the caller passed); the rest as given.
    #[inline]
    pub fn publish(&mut self, snapshot: Snapshot) -> Result<(), Error> {
        let Some(writer) = self.writer.as_mut() else {
            return Err(Error::Closed {
                engine_id: self.config.engine_id.to_string(),
            });
        };
        let snapshot = stamp(snapshot);
        if writer.publish(&snapshot).is_err() {
            return Err(Error::WrongProcess {
                engine_id: self.config.engine_id.to_string(),
                owner_pid: self.owner_pid,
            });
        }
        // A publish is a sign of life too.
        writer.stamp_heartbeat(snapshot.captured_mono_ns);
        Ok(())
    }

    /// Stops the heartbeat, retires the file and removes it. Idempotent; in a
    /// forked child it only forgets the parent's resources.
    pub fn close(&mut self) {
        if fork_generation() != self.fork_generation {
            // The heartbeat thread does not exist in a child; joining it would
            // hang, and the file is the parent's.
            if let Some(heartbeat) = self.heartbeat.take() {
                std::mem::forget(heartbeat);
            }
            if let Some(writer) = self.writer.take() {
                std::mem::forget(writer);
            }
            return;
        }
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.stop();
        }
        if let Some(mut writer) = self.writer.take() {
            writer.retire();
        }
    }

    /// False once closed.
    pub fn is_open(&self) -> bool {
        self.writer.is_some()
    }

    /// The engine id.
    pub fn engine_id(&self) -> &str {
        self.config.engine_id.as_str()
    }

    /// The settings in use.
    pub fn config(&self) -> &PublisherConfig {
        &self.config
    }

    /// The file being published (None once closed).
    pub fn path(&self) -> Option<&Path> {
        self.writer.as_ref().map(|w| w.path())
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.close();
    }
}

/// Sets the capture clocks and derives the idle flag from the counts.
#[inline]
fn stamp(mut snapshot: Snapshot) -> Snapshot {
    snapshot.captured_mono_ns = monotonic_ns();
    snapshot.captured_unix_ns = unix_ns();
    if snapshot.num_running == 0 && snapshot.num_waiting == 0 {
        snapshot.flags |= FLAG_IDLE;
    } else {
        snapshot.flags &= !FLAG_IDLE;
    }
    snapshot
}

fn create_dir(dir: &PathBuf) -> Result<(), Error> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::Config {
        what: format!(
            "cannot create the engine-state directory {}: {e}; create it, or choose another \
             directory with AGENTIC_ENGINE_STATE_URI=file:///path",
            dir.display()
        ),
    })
}

impl HeartbeatThread {
    fn spawn(
        heartbeat: Heartbeat,
        period: Duration,
        engine_id: &impl std::fmt::Display,
    ) -> Result<Self, Error> {
        let (stop, stopped) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name(
                format!("es-heartbeat-{engine_id}")
                    .chars()
                    .take(15)
                    .collect(),
            )
            .spawn(move || loop {
                match stopped.recv_timeout(period) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if !heartbeat.beat() {
                            return; // retired, or the writer is gone
                        }
                    }
                    Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            })
            .map_err(|e| Error::Config {
                what: format!("cannot start the heartbeat thread: {e}"),
            })?;
        Ok(HeartbeatThread { stop, handle })
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.handle.join();
    }
}
