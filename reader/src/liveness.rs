//! Whether a file's writer process still lives (docs/FORMAT.md, "Liveness
//! and staleness"): `kill(pid, 0)`, and for a writer whose heartbeat is
//! late, its state in `/proc/<pid>/stat`, since a killed writer that its
//! parent has not reaped yet (a zombie) still answers `kill`; and when a
//! reader asks ([`WriterCheck`]).

use std::sync::OnceLock;
use std::time::Duration;

use engine_state_shm_format::router_layout::RouterHeader;
use engine_state_shm_format::{heartbeat, pid_namespace, Header};
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

/// Least time between two pid checks of one writer on reads, in ns.
const PID_CHECK_INTERVAL_NS: u64 = 10_000_000;

/// Least time between two `/proc` lookups (is it a zombie?) of one writer
/// whose heartbeat is late, in ns: three system calls and procfs
/// formatting, so not at every pid check; a zombie is still dead within
/// two periods plus 100 ms, long before `stale_after`.
const ZOMBIE_CHECK_INTERVAL_NS: u64 = 100_000_000;

/// What liveness reads of a file's header: an engine's, or a router
/// replica's (the same words at the same offsets).
pub(crate) trait WriterHeader {
    /// The writer's pid, in its own pid namespace.
    fn writer_pid(&self) -> u32;
    /// Inode of the writer's pid namespace (0: unknown).
    fn writer_pid_ns(&self) -> u64;
    /// The writer's heartbeat period, in µs.
    fn period_us(&self) -> u32;
}

impl WriterHeader for Header {
    fn writer_pid(&self) -> u32 {
        self.writer_pid
    }
    fn writer_pid_ns(&self) -> u64 {
        self.writer_pid_ns
    }
    fn period_us(&self) -> u32 {
        self.publish_period_us
    }
}

impl WriterHeader for RouterHeader {
    fn writer_pid(&self) -> u32 {
        self.writer_pid
    }
    fn writer_pid_ns(&self) -> u64 {
        self.writer_pid_ns
    }
    fn period_us(&self) -> u32 {
        self.heartbeat_period_us
    }
}

/// When a reader asks whether one file's writer lives, and the last answer.
///
/// At open and at every directory listing ([`WriterCheck::at_listing`]);
/// on a read only when the heartbeat is late ([`WriterCheck::on_read`]), at
/// most every 10 ms: a live writer stamps every period, so a read of a
/// writer on time makes no system call. A writer whose heartbeat is late is
/// also looked up in `/proc` (a zombie?), at most every 100 ms.
#[derive(Debug)]
pub(crate) struct WriterCheck {
    alive: Option<bool>,
    /// A heartbeat older than this (ns) is late: the heartbeat policy's
    /// `late_after` of the file's period, at least the pid check interval.
    late_after_ns: u64,
    /// Monotonic ns before which a read does not check the pid again.
    next_pid_check_ns: u64,
    /// Monotonic ns before which a late writer is not looked up in `/proc`.
    next_zombie_check_ns: u64,
}

impl WriterCheck {
    /// The check of the writer of a file just opened (asked at once), whose
    /// heartbeat word holds `heartbeat_mono_ns`.
    pub(crate) fn new(header: &impl WriterHeader, heartbeat_mono_ns: u64, now: u64) -> WriterCheck {
        let period = Duration::from_micros(u64::from(header.period_us()));
        let late_after = heartbeat::late_after(period, Duration::from_nanos(PID_CHECK_INTERVAL_NS));
        let mut check = WriterCheck {
            alive: None,
            late_after_ns: late_after.as_nanos() as u64,
            next_pid_check_ns: 0,
            next_zombie_check_ns: 0,
        };
        check.at_listing(header, heartbeat_mono_ns, now);
        check
    }

    /// The last answer: `Some(false)` once the writer is known gone, `None`
    /// when that cannot be known ([`writer_alive`]).
    #[inline]
    pub(crate) fn alive(&self) -> Option<bool> {
        self.alive
    }

    /// Whether a heartbeat `heartbeat_age_ns` old is late.
    #[inline]
    pub(crate) fn is_late(&self, heartbeat_age_ns: u64) -> bool {
        heartbeat_age_ns > self.late_after_ns
    }

    /// Asks now (at open and at listings); a writer whose heartbeat is late
    /// is also checked for being a zombie.
    ///
    /// A writer found gone stays gone: its file is replaced by a rename (a
    /// new inode, a new entry), never reused, and a zombie that is reaped
    /// answers `ESRCH`. The `/proc` lookup keeps its 100 ms interval here
    /// too, so a listing with many late writers does not read `/proc` for
    /// each of them every time.
    pub(crate) fn at_listing(
        &mut self,
        header: &impl WriterHeader,
        heartbeat_mono_ns: u64,
        now: u64,
    ) {
        if self.alive == Some(false) {
            return;
        }
        let late = self.is_late(now.saturating_sub(heartbeat_mono_ns));
        let zombie_check = late && now >= self.next_zombie_check_ns;
        self.alive = writer_alive(header, zombie_check);
        if zombie_check {
            self.next_zombie_check_ns = now + ZOMBIE_CHECK_INTERVAL_NS;
        }
    }

    /// A read at `now` found the heartbeat `late`: asks again if the writer
    /// was alive and the last pid check is 10 ms old.
    #[inline]
    pub(crate) fn on_read(&mut self, header: &impl WriterHeader, late: bool, now: u64) {
        if late && self.alive == Some(true) && now >= self.next_pid_check_ns {
            self.check_late(header, now);
        }
    }

    #[cold]
    fn check_late(&mut self, header: &impl WriterHeader, now: u64) {
        let zombie_check = now >= self.next_zombie_check_ns;
        self.alive = writer_alive(header, zombie_check);
        self.next_pid_check_ns = now + PID_CHECK_INTERVAL_NS;
        if zombie_check {
            self.next_zombie_check_ns = now + ZOMBIE_CHECK_INTERVAL_NS;
        }
    }
}

/// Whether the writer process still exists, when that can be known: only in
/// the writer's own pid namespace (engines and routers often run in separate
/// containers that share `/dev/shm`; there the heartbeat alone decides), and
/// only for a pid a process can have: 0 or above `i32::MAX` (a corrupt or
/// hostile header) is unknown, never `kill(0 or -1, 0)`, which would ask
/// about a whole process group or every process (docs/FORMAT.md; the Go
/// reader's `writerAlive` is the same rule).
///
/// `heartbeat_late`: the writer's heartbeat is late, so it may be a zombie
/// (its threads are gone, it stamps nothing): then a writer that `kill`
/// finds is also looked up in `/proc`, and a zombie is gone. A writer whose
/// heartbeat is on time is not a zombie, and costs one system call, not
/// three (this runs for every engine at every directory listing).
pub(crate) fn writer_alive(header: &impl WriterHeader, heartbeat_late: bool) -> Option<bool> {
    let pid_ns = header.writer_pid_ns();
    if pid_ns == 0 || pid_ns != pid_namespace() {
        return None;
    }
    let pid = match i32::try_from(header.writer_pid()) {
        Ok(pid) if pid > 0 => pid,
        _ => return None,
    };
    match kill(Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => Some(!(heartbeat_late && is_zombie(pid))),
        Err(Errno::ESRCH) => Some(false),
        Err(_) => None,
    }
}

/// Whether `/proc/<pid>/stat` says the process has exited and waits to be
/// reaped (state `Z`, or `X` while it is being reaped). False when that
/// cannot be read (`/proc` mounted with `hidepid`, or a `/proc` of another
/// pid namespace than ours, where `<pid>` would name another process):
/// `kill`'s answer stands.
fn is_zombie(pid: i32) -> bool {
    if !proc_is_ours() {
        return false;
    }
    std::fs::read(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| matches!(stat_state(&stat), Some(b'Z' | b'X')))
}

/// Whether `/proc` numbers processes as this process's pid namespace does
/// (its `self` is our pid), checked once.
fn proc_is_ours() -> bool {
    static OURS: OnceLock<bool> = OnceLock::new();
    *OURS.get_or_init(|| {
        std::fs::read_link("/proc/self")
            .is_ok_and(|link| link.as_os_str() == std::process::id().to_string().as_str())
    })
}

/// The state letter of a `/proc/<pid>/stat` line, `<pid> (<comm>) <state>
/// …`: the first non-blank byte after the LAST `)`, since the command name
/// may itself hold `)` and spaces (and no later field holds a `)`).
fn stat_state(stat: &[u8]) -> Option<u8> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat[close + 1..]
        .iter()
        .copied()
        .find(|b| !b.is_ascii_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_after_the_last_parenthesis() {
        assert_eq!(stat_state(b"42 (vllm) S 1 42 42 0"), Some(b'S'));
        assert_eq!(stat_state(b"42 (a) Z (b) R 1 2 3"), Some(b'R'));
        assert_eq!(stat_state(b"42 (x) y) Z 1 42"), Some(b'Z'));
        assert_eq!(stat_state(b"42 ( ) ) X 0"), Some(b'X'));
        assert_eq!(stat_state(b"42 (no close"), None);
        assert_eq!(stat_state(b"42 (x)"), None);
    }

    #[test]
    fn this_process_is_alive_and_not_a_zombie() {
        let me = std::process::id() as i32;
        assert!(proc_is_ours(), "/proc is this pid namespace's");
        assert!(!is_zombie(me));
        let stat = std::fs::read(format!("/proc/{me}/stat")).unwrap();
        assert!(matches!(stat_state(&stat), Some(b'R' | b'S')));
    }
}
