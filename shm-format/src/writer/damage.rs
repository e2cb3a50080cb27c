//! Damage detection: whether a writer's file is still the one readers see
//! at its path, holding what this writer wrote (ARCHITECTURE.md, "A file
//! truncated under a mapping"). The heartbeat thread checks it every few
//! periods and recreates the file when it is not ([`ShmWriter::create_after`]).

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

use super::Heartbeat;
#[cfg(doc)]
use super::ShmWriter;
use crate::engine_id::EngineId;
use crate::layout::*;
use crate::seqlock;
use crate::snapshot::Snapshot;

/// Shared by a writer's publishing thread and its [`Heartbeat`] handles, so
/// that the heartbeat's check can tell a sequence this writer stored from
/// one another process stored into the file (a stray 8-byte write through a
/// writable mapping). An odd one would otherwise keep the file torn for
/// every reader as long as the writer lives; an even one would make a
/// reader take old payload words for a new snapshot.
#[derive(Debug)]
pub(super) struct SeqRecord {
    /// The final (even) sequence of the publish in progress, else of the
    /// last one. Stored only by `publish`.
    pub(super) target: AtomicU64,
    /// Set by a publish that found in the word a value this writer did not
    /// store there.
    pub(super) foreign: AtomicBool,
    /// The final sequence of the last publish that completed (stored by
    /// `publish` after its final store into the word): an odd sequence
    /// `target - 1` while this is below `target` is a publish in progress
    /// (however long its thread was preempted), and the same odd value
    /// once this is `target` was stored by someone else.
    pub(super) done: AtomicU64,
}

impl SeqRecord {
    pub(super) fn new(seq: u64) -> SeqRecord {
        SeqRecord {
            target: AtomicU64::new(seq),
            foreign: AtomicBool::new(false),
            done: AtomicU64::new(seq),
        }
    }
}

/// The bytes a writer wrote at creation and never changes afterwards: the
/// header (all of it but `state`, which `retire` stores) and the engine id
/// field. `seq`, `heartbeat_mono_ns` and the payload change with every
/// publish (layout.rs).
#[derive(Clone, Copy, Debug)]
pub(super) struct Written {
    header: Header,
    engine_id: [u64; ENGINE_ID_FIELD_SIZE / 8],
}

impl Written {
    pub(super) fn new(header: Header, engine_id: &EngineId) -> Written {
        let field = engine_id.to_field();
        Written {
            header,
            engine_id: core::array::from_fn(|i| {
                u64::from_le_bytes(field[8 * i..8 * i + 8].try_into().expect("8 bytes"))
            }),
        }
    }
}

impl Heartbeat {
    /// Whether readers still see this file at its path: false when it was
    /// removed (alone or with its directory), replaced by another file or a
    /// symbolic link (readers never follow one), truncated or grown by
    /// another process (readers refuse a file that is not [`FILE_SIZE`]
    /// bytes, and one truncated to any size and grown back has lost part of
    /// what was written at creation), or when its sequence word holds a
    /// value this writer did not store (see [`Heartbeat::seq_is_ours`]).
    /// One `lstat` and about twenty loads, for a heartbeat thread every few
    /// periods. Any number of handles may check at once: a check stores
    /// nothing.
    pub fn in_place(&self) -> bool {
        // `lstat`, not `stat`: a link to this very file has its own inode.
        let Ok(meta) = std::fs::symlink_metadata(&self.path) else {
            return false;
        };
        if !meta.is_file()
            || (meta.dev(), meta.ino()) != self.file_id
            || meta.len() != FILE_SIZE as u64
        {
            return false;
        }
        // The size is right now, but the file may have been truncated and
        // grown back: its bytes past the cut are zeros (or this mapping's
        // were all replaced by zero pages when it faulted meanwhile).
        !self.map.truncated() && self.intact() && self.seq_is_ours()
    }

    /// Whether the sequence word holds a value this writer stored: at least
    /// the last one it completed before the publish in progress (if any),
    /// at most that publish's final one, odd only while that publish is in
    /// progress, and no publish found a value it did not store.
    fn seq_is_ours(&self) -> bool {
        let record = &*self.seq_record;
        // Relaxed: set by `publish`, read on its own.
        if record.foreign.load(Ordering::Relaxed) {
            return false;
        }
        // First, before the word: Acquire pairs with the Release store of
        // `done` in `publish`, which follows that publish's final store
        // into the word, so if this sees `done == target` the load of the
        // word below sees that final store (or a later publish's stores).
        let done = record.done.load(Ordering::Acquire);
        // Acquire: pairs with the Release store of `target` in `publish`,
        // which follows the previous publish's final store of `target - 2`
        // into the word: the load below sees that store or a later one.
        let low = record.target.load(Ordering::Acquire).saturating_sub(2);
        let seq = self.map.word(SEQ_OFFSET).load(Ordering::Relaxed);
        // Pairs with the `fence(Release)` in `publish` between its store of
        // `target` and that publish's stores into the word: if the load
        // above saw one of those, the load below sees its `target`.
        fence(Ordering::Acquire);
        let high = record.target.load(Ordering::Relaxed);
        if seq == 0 || seq < low || seq > high {
            return false;
        }
        // The only odd value in range is `high - 1`: ours while the publish
        // of `high` has not completed (`done` loaded before the word, so a
        // publish that completes meanwhile still counts as in progress).
        seq % 2 == 0 || done != high
    }

    /// Whether the mapping still holds what this writer wrote at creation
    /// and never changes (the header but `state`, and the engine id field),
    /// `state` is ACTIVE, and `seq` is not 0 (the first snapshot, published
    /// before the file was put in place, made it 2, and it only grows). A
    /// file truncated to N bytes (even N > 0, which keeps the page: no
    /// fault) and grown back reads zeros from byte N on: a cut anywhere
    /// before the engine id's end zeroes some of the id (non-empty, so its
    /// first byte is not 0) or of the header, and a later cut zeroed only
    /// zeros. Relaxed loads: only this process stores these words (`seq`
    /// too, on the publishing thread: only its being 0 matters here).
    fn intact(&self) -> bool {
        let expected = Header {
            state: STATE_ACTIVE,
            ..self.written.header
        };
        let id: &[std::sync::atomic::AtomicU64; ENGINE_ID_FIELD_SIZE / 8] =
            self.map.words(ENGINE_ID_OFFSET);
        self.map.header() == expected
            && id
                .iter()
                .zip(&self.written.engine_id)
                .all(|(word, written)| word.load(Ordering::Relaxed) == *written)
            && self.map.word(SEQ_OFFSET).load(Ordering::Relaxed) != 0
    }

    /// The latest snapshot published in this file (a seqlock read of the
    /// writer's own mapping), e.g. to carry it over into a recreated file.
    /// `None` if no consistent copy could be read (a write is in progress in
    /// a killed thread), if the file was truncated under the mapping (which
    /// then faulted and reads zero pages) and nothing was published since
    /// (sequence 0, never a snapshot), or if part of the file was zeroed in
    /// place (truncated to a few bytes and grown back before any fault: the
    /// payload may be cut anywhere, and nothing tells whether a publish
    /// rewrote it since, so none of it is trusted).
    pub fn snapshot(&self) -> Option<Snapshot> {
        let (words, seq) =
            seqlock::read(self.map.word(SEQ_OFFSET), self.map.words(PAYLOAD_OFFSET)).ok()?;
        // After the read (whose Acquire fence orders these loads after its
        // own): a cut that zeroed payload words read above zeroed the
        // engine id field past them as well. A mapping that faulted is
        // private zero pages: everything in it was published since.
        (seq != 0 && (self.map.truncated() || self.intact())).then(|| Snapshot::from_words(words))
    }
}
