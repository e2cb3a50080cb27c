//! The publisher's heartbeat thread: calls its backend's beat every period
//! until stopped (docs/ARCHITECTURE.md, "The file": the stamp policy is
//! shm-format's `heartbeat` module; what a beat does is the backend's).

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::Error;

/// A running heartbeat thread; [`HeartbeatThread::stop`] ends and joins it.
#[derive(Debug)]
pub(crate) struct HeartbeatThread {
    stop: mpsc::Sender<()>,
    handle: JoinHandle<()>,
}

impl HeartbeatThread {
    /// Calls `beat` every period until it returns false or the thread is stopped.
    pub(crate) fn spawn(
        mut beat: impl FnMut() -> bool + Send + 'static,
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
                        if !beat() {
                            return; // retired, or the writer is gone
                        }
                    }
                    Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            })
            .map_err(|io| Error::Spawn {
                thread: "heartbeat",
                io,
            })?;
        Ok(HeartbeatThread { stop, handle })
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.handle.join();
    }
}
