//! Change detection for the relay (docs/REDIS.md, "The node agent"): which
//! engines published a snapshot, heartbeat far enough, or had their file
//! replaced since this reader last read them, at two loads from one cache
//! line per engine when nothing changed.

use std::path::Path;
use std::time::Duration;

use engine_state_shm_format::{heartbeat, monotonic_ns};

use super::entry::Entry;
use super::ShmDir;
use crate::error::Error;
use crate::state::Reading;

impl ShmDir {
    /// Like [`ShmDir::read_at`], but reads only the engines that published a
    /// snapshot this reader has not read yet (by any read) or, with
    /// `heartbeat_step`, whose heartbeat stamp is at least that much newer
    /// than the one last read. The test costs two Relaxed loads from one
    /// cache line per engine (sequence and heartbeat words) — no clock read,
    /// no system call — so it can run every millisecond over a thousand
    /// engines. With a step, an engine whose heartbeat is late (four steps)
    /// is also checked for retirement: when a restarted engine replaced its
    /// file, the new file is opened and reported (its first snapshot). Dead
    /// writers (their heartbeat stops), files retired by a clean close and
    /// unreadable files are not reported here (`out.errors` stays empty): a
    /// periodic [`ShmDir::read_at`] sees those.
    pub fn read_changed_at(
        &mut self,
        out: &mut Reading,
        now_mono_ns: u64,
        heartbeat_step: Option<Duration>,
    ) -> Result<(), Error> {
        out.clear();
        self.rescan_if_due(monotonic_ns())?;
        let step_ns = heartbeat_step.map_or(u64::MAX, |d| d.as_nanos() as u64);
        // Late (the heartbeat policy's `replaced_after`, a few periods at a
        // caller's step) without a heartbeat. From the step, not from each
        // entry's own period: one load fewer per engine and poll.
        let late_ns = heartbeat_step.map_or(u64::MAX, |d| {
            u64::try_from(heartbeat::replaced_after(d).as_nanos()).unwrap_or(u64::MAX)
        });
        for entry in &mut self.engines {
            let seq = entry.file.seq();
            // Odd: a write is in progress; the next call sees it finished.
            let published = seq != entry.seen_seq && seq % 2 == 0;
            let heartbeat = entry.file.heartbeat_mono_ns();
            let beat = heartbeat.saturating_sub(entry.seen_heartbeat_ns) >= step_ns;
            // A writer that stopped may have retired its file for a restarted
            // engine's new one (the old file never changes again).
            let replaced = !published
                && !beat
                && now_mono_ns.saturating_sub(heartbeat) > late_ns
                && entry.replaced(&self.dir);
            if published || beat || replaced {
                out.engines
                    .push(entry.read(&self.dir, now_mono_ns, &self.options));
            }
        }
        Ok(())
    }
}

impl Entry {
    /// Whether the file is retired and a replacement was opened now (see
    /// [`Entry::reopen_if_replaced`]).
    fn replaced(&mut self, dir: &Path) -> bool {
        if !self.file.is_retired() {
            return false;
        }
        let inode = self.file.inode();
        self.reopen_if_replaced(dir);
        self.file.inode() != inode
    }
}
