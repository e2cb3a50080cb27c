//! Whether a file's writer process still lives (docs/FORMAT.md, "Liveness
//! and staleness"): `kill(pid, 0)`, and for a writer whose heartbeat is
//! late, its state in `/proc/<pid>/stat`, since a killed writer that its
//! parent has not reaped yet (a zombie) still answers `kill`.

use std::sync::OnceLock;

use engine_state_shm_format::{pid_namespace, Header};
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;

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
pub(crate) fn writer_alive(header: &Header, heartbeat_late: bool) -> Option<bool> {
    if header.writer_pid_ns == 0 || header.writer_pid_ns != pid_namespace() {
        return None;
    }
    let pid = match i32::try_from(header.writer_pid) {
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
