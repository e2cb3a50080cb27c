//! What `/healthz` reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use engine_state_shm_format::monotonic_ns;

/// Shared between the relay loop (writes) and the HTTP responder (reads).
#[derive(Debug)]
pub struct Health {
    /// `CLOCK_MONOTONIC` of the last relay period (0: none yet).
    last_tick_ns: AtomicU64,
    /// A relay period later than this is unhealthy.
    max_silence: Duration,
    /// The summary, and why the relay cannot work (unhealthy) if it cannot.
    summary: Mutex<(String, Option<String>)>,
}

impl Health {
    /// Health of a relay that ticks every `period`.
    pub fn new(period: Duration) -> Health {
        Health {
            last_tick_ns: AtomicU64::new(0),
            max_silence: (period * 4).max(Duration::from_secs(2)),
            summary: Mutex::new((String::new(), None)),
        }
    }

    /// Records a relay period, its summary and, when the relay cannot do
    /// its work (the directory cannot be listed), why.
    pub fn tick(&self, summary: String, problem: Option<String>) {
        // Relaxed: a monotonic timestamp, read on its own.
        self.last_tick_ns.store(monotonic_ns(), Ordering::Relaxed);
        *self.summary.lock().unwrap_or_else(|p| p.into_inner()) = (summary, problem);
    }

    /// (healthy, text). Healthy while the relay loop runs and the directory
    /// can be listed; a Redis outage is reported in the text but is not
    /// unhealthy (restarting the agent would not help; the sink reconnects
    /// on its own).
    pub fn report(&self) -> (bool, String) {
        let last = self.last_tick_ns.load(Ordering::Relaxed);
        let (summary, problem) = self
            .summary
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if last == 0 {
            return (false, "starting\n".to_owned());
        }
        let silence = Duration::from_nanos(monotonic_ns().saturating_sub(last));
        if silence > self.max_silence {
            return (
                false,
                format!("relay loop stalled for {silence:?}\n{summary}"),
            );
        }
        if let Some(problem) = problem {
            return (false, format!("{problem}\n{summary}"));
        }
        (true, format!("ok\n{summary}"))
    }
}

/// The `redis:` line of `/healthz` for a relay whose sink is `connected`
/// (or not) with `last_error`. A server that refuses the relay's commands
/// (ACL `NOPERM`: its user may connect but not run `EVAL` or `SET` on the
/// prefix's keys) is not "unreachable": retrying will not help until
/// someone grants them, so the line says so, with the server's words (which
/// command) and what to grant.
pub fn redis_line(connected: bool, last_error: Option<&str>) -> String {
    match last_error {
        Some(error) if engine_state_redis::is_permission_error(error) => {
            format!("permission denied (retrying): {error}")
        }
        _ if connected => "connected".to_owned(),
        Some(error) => format!("unreachable (retrying): {error}"),
        None => "unreachable (retrying)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_command_is_not_unreachable() {
        assert_eq!(redis_line(true, None), "connected");
        assert_eq!(redis_line(false, None), "unreachable (retrying)");
        let line = redis_line(
            false,
            Some("cannot write engines: NoPerm: this user has no permissions to run the 'eval' command"),
        );
        assert!(line.starts_with("permission denied"), "{line}");
        assert!(line.contains("'eval'"), "{line}");
    }
}
