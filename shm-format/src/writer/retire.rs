//! Retirement: the writer marks its file retired, so readers still mapping
//! it stop at once, and removes it (FORMAT.md, "Creating, replacing and
//! retiring (writers)").

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;

use super::ShmWriter;
use crate::fork::fork_generation;
use crate::layout::*;
use crate::mapping::Mapping;

impl ShmWriter {
    /// Marks the file retired and removes it (if the path still names it).
    /// Idempotent; does nothing in a forked child.
    pub fn retire(&mut self) {
        if self.retired || fork_generation() != self.fork_generation {
            return;
        }
        self.retired = true;
        retire_mapped(&self.map, STATE_WORD, &self.path, (self.dev, self.inode));
    }
}

/// What every writer's `retire` does (engine, digest and router files):
/// marks the mapped file retired (its state word, word `state_word` of the
/// header) and removes it when `path` still names it (`file`: its device
/// and inode).
pub(crate) fn retire_mapped(map: &Mapping, state_word: usize, path: &Path, file: (u64, u64)) {
    // Release: pairs with the readers' Relaxed state load followed by their
    // seqlock fences; readers only need to see it eventually.
    map.word(state_word * 8)
        .store(STATE_RETIRED, Ordering::Release);
    // We hold the lock, so no other writer can have replaced the path, but
    // a foreign hand may have: only remove our own inode (`lstat`: not a
    // link that points to it).
    if std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == file) {
        let _ = std::fs::remove_file(path);
    }
}

impl Drop for ShmWriter {
    fn drop(&mut self) {
        self.retire();
    }
}
