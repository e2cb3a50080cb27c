//! The reconnection backoff every Redis client of engine-state uses (the
//! source, both sinks; the node agent reports it).

use std::time::Duration;

/// First wait before reconnecting after a failure; doubles up to [`RECONNECT_CAP`].
pub const RECONNECT_FIRST: Duration = Duration::from_millis(50);
/// Longest wait between two reconnection attempts.
pub const RECONNECT_CAP: Duration = Duration::from_secs(5);

/// Exponential backoff: [`RECONNECT_FIRST`] after the first failure,
/// doubling with each further one up to [`RECONNECT_CAP`], back to the start
/// after a success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: RECONNECT_FIRST,
        }
    }
}

impl Backoff {
    /// After a failure: how long to wait before the next attempt (the wait
    /// after the next failure is twice as long, up to the cap).
    pub fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(RECONNECT_CAP);
        wait
    }

    /// After a success: the next failure waits [`RECONNECT_FIRST`] again.
    pub fn succeeded(&mut self) {
        self.next = RECONNECT_FIRST;
    }

    /// `"50 ms to 5 s"`: the range, for messages.
    pub fn describe() -> String {
        format!(
            "{} ms to {} s",
            RECONNECT_FIRST.as_millis(),
            RECONNECT_CAP.as_secs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_restarts_after_a_success() {
        let mut backoff = Backoff::default();
        let waits: Vec<u128> = (0..9).map(|_| backoff.failed().as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        backoff.succeeded();
        assert_eq!(backoff.failed(), RECONNECT_FIRST);
        assert_eq!(Backoff::describe(), "50 ms to 5 s");
    }
}
