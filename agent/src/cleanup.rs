//! Optional removal of files whose writer is gone (off by default: see the
//! `--cleanup-grace-s` help and docs/REDIS.md).

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_state_reader::{Reading, Status};
use engine_state_shm_format::{pid_namespace, ShmFile};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// Tracks how long each engine has been dead and removes its file after the grace period.
#[derive(Debug)]
pub struct Cleanup {
    grace: Duration,
    dead_since: HashMap<Arc<str>, (u64, Instant)>,
}

impl Cleanup {
    /// Removes files dead for longer than `grace`.
    pub fn new(grace: Duration) -> Cleanup {
        Cleanup {
            grace,
            dead_since: HashMap::new(),
        }
    }

    /// Notes which engines are dead in `reading`; removes the files dead for
    /// longer than the grace period. Returns the ids removed.
    pub fn run(&mut self, dir: &Path, reading: &Reading, now: Instant) -> Vec<Arc<str>> {
        let mut removed = Vec::new();
        let mut still_dead = HashMap::new();
        for engine in reading.engines.iter().filter(|e| e.status == Status::Dead) {
            let since = match self.dead_since.get(&engine.engine_id) {
                Some(&(generation, since)) if generation == engine.generation => since,
                _ => now,
            };
            if now.duration_since(since) >= self.grace
                && remove_if_dead(&dir.join(&*engine.engine_id), engine.generation)
            {
                tracing::info!(
                    "esagent: removed {} (writer gone for {:?})",
                    dir.join(&*engine.engine_id).display(),
                    self.grace
                );
                removed.push(engine.engine_id.clone());
                continue;
            }
            still_dead.insert(engine.engine_id.clone(), (engine.generation, since));
        }
        self.dead_since = still_dead;
        removed
    }
}

/// Removes `path` if it still is generation `generation`, retired or written
/// by a process that no longer exists, and no writer holds its lock.
fn remove_if_dead(path: &Path, generation: u64) -> bool {
    let Ok(file) = ShmFile::open(path) else {
        return false;
    };
    let header = *file.header();
    let writer_gone = file.is_retired()
        || (header.writer_pid_ns != 0
            && header.writer_pid_ns == pid_namespace()
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(header.writer_pid as i32), None)
                == Err(Errno::ESRCH));
    if header.generation != generation || !writer_gone {
        return false;
    }
    // The writer's lock: a live writer (or one taking the file over) holds it.
    let Ok(handle) = OpenOptions::new().read(true).write(true).open(path) else {
        return false;
    };
    let Ok(lock) = Flock::lock(handle, FlockArg::LockExclusiveNonblock) else {
        return false;
    };
    let same = match (lock.metadata(), std::fs::metadata(path)) {
        (Ok(locked), Ok(now)) => locked.ino() == now.ino() && locked.ino() == file.inode(),
        _ => false,
    };
    same && std::fs::remove_file(path).is_ok()
}
