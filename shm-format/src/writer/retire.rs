//! Retirement: the writer marks its file retired, so readers still mapping
//! it stop at once, and removes it (FORMAT.md, "Creating, replacing and
//! retiring (writers)").

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;

use super::ShmWriter;
use crate::fork::fork_generation;
use crate::layout::*;

impl ShmWriter {
    /// Marks the file retired and removes it (if the path still names it).
    /// Idempotent; does nothing in a forked child.
    pub fn retire(&mut self) {
        if self.retired || fork_generation() != self.fork_generation {
            return;
        }
        self.retired = true;
        // Pairs with the readers' Relaxed state load followed by their
        // seqlock fences; readers only need to see it eventually.
        self.map
            .word(STATE_WORD * 8)
            .store(STATE_RETIRED, Ordering::Release);
        // We hold the lock, so no other writer can have replaced the path,
        // but a foreign hand may have: only remove our own inode (`lstat`:
        // not a link that points to it).
        if std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| (m.dev(), m.ino()) == (self.dev, self.inode))
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for ShmWriter {
    fn drop(&mut self) {
        self.retire();
    }
}
