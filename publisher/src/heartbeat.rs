//! The publisher's heartbeat thread: calls its backend's beat every period
//! until stopped (docs/ARCHITECTURE.md, "The file": the stamp policy is
//! shm-format's `heartbeat` module; what a beat does is the backend's).
//! Tests drive it instead ([`Ticks::Driven`], [`HeartbeatThread::tick`]):
//! the beat reads the publisher's `Clock`, so a test sets the time, ticks,
//! and asserts on exact stamps without sleeping.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::Error;

/// When the heartbeat thread beats.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ticks {
    /// Every period (production).
    Every(Duration),
    /// Only when [`HeartbeatThread::tick`] asks (tests).
    #[cfg_attr(not(test), allow(dead_code))]
    Driven,
}

enum Message {
    Stop,
    /// Beat now, then answer (a driven tick).
    #[cfg_attr(not(test), allow(dead_code))]
    Tick(mpsc::Sender<()>),
}

/// A running heartbeat thread; [`HeartbeatThread::stop`] ends and joins it.
#[derive(Debug)]
pub(crate) struct HeartbeatThread {
    messages: mpsc::Sender<Message>,
    handle: JoinHandle<()>,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Message::Stop => "Stop",
            Message::Tick(_) => "Tick",
        })
    }
}

impl HeartbeatThread {
    /// Calls `beat` at each of `ticks` until it returns false or the thread is stopped.
    pub(crate) fn spawn(
        mut beat: impl FnMut() -> bool + Send + 'static,
        ticks: Ticks,
        engine_id: &impl std::fmt::Display,
    ) -> Result<Self, Error> {
        let (messages, received) = mpsc::channel::<Message>();
        let handle = std::thread::Builder::new()
            .name(
                format!("es-heartbeat-{engine_id}")
                    .chars()
                    .take(15)
                    .collect(),
            )
            .spawn(move || loop {
                let message = match ticks {
                    Ticks::Every(period) => received.recv_timeout(period),
                    Ticks::Driven => received
                        .recv()
                        .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                };
                match message {
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if !beat() {
                            return; // retired, or the writer is gone
                        }
                    }
                    Ok(Message::Tick(done)) => {
                        let alive = beat();
                        let _ = done.send(());
                        if !alive {
                            return;
                        }
                    }
                    Ok(Message::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            })
            .map_err(|io| Error::Spawn {
                thread: "heartbeat",
                io,
            })?;
        Ok(HeartbeatThread { messages, handle })
    }

    /// One beat on the heartbeat thread, returned from once it is done
    /// (a thread started with [`Ticks::Driven`]; tests).
    #[cfg(test)]
    pub(crate) fn tick(&self) {
        let (done, finished) = mpsc::channel();
        self.messages
            .send(Message::Tick(done))
            .expect("the heartbeat thread is running");
        // An Err: the thread ended in that beat (retired), which is an answer too.
        let _ = finished.recv();
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(self) {
        let _ = self.messages.send(Message::Stop);
        let _ = self.handle.join();
    }
}
