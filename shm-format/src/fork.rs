//! Fork detection without a system call on the hot path.
//!
//! vLLM forks its engine processes. A writer created before `fork()` must not
//! write (or retire) its file from the child: the child would be a second
//! writer. A `pthread_atfork` child handler bumps a counter; a writer remembers
//! the counter at creation and compares it (one Relaxed load) before writing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static FORKS: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

extern "C" fn in_child_after_fork() {
    // Runs in the child, single-threaded, right after fork(); an atomic add is
    // async-signal-safe. Relaxed: only this thread reads it until it spawns others.
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The number of `fork()`s this process is removed from its ancestor at first
/// call. Registers the atfork handler on first use.
pub fn fork_generation() -> u64 {
    REGISTER.call_once(|| {
        // SAFETY: `in_child_after_fork` is an `extern "C"` function with no
        // arguments that only does an atomic add, which is allowed in a child
        // after fork; registering handlers has no other precondition.
        let rc = unsafe { nix::libc::pthread_atfork(None, None, Some(in_child_after_fork)) };
        assert_eq!(rc, 0, "pthread_atfork failed");
    });
    FORKS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_sees_a_new_generation() {
        let parent = fork_generation();
        // SAFETY: the child only calls async-signal-safe code (an atomic load,
        // `_exit`) before exiting.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = if fork_generation() == parent + 1 {
                    0
                } else {
                    1
                };
                // SAFETY: `_exit` ends the child without running the parent's destructors.
                unsafe { nix::libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
                assert_eq!(fork_generation(), parent);
            }
        }
    }
}
