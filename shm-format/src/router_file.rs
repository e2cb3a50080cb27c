//! A reader's view of one router replica's reservations file
//! (`<dir>.routers/<replica id>`, docs/FORMAT.md, "Shared reservations"):
//! opened read-only like an engine's file (never blocks, never follows a
//! link, refuses anything but a regular file), validated, mapped
//! `PROT_READ`, never written; a file truncated under the mapping reads as
//! torn, never `SIGBUS` (module `sigbus`).

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::engine_id::EngineId;
use crate::error::{Error, RouterError};
use crate::layout::STATE_RETIRED;
use crate::mapping::Mapping;
use crate::reservations::{decode_reservation_slots_into, Reservations, SLOT_WORDS};
use crate::router_layout::*;
use crate::seqlock::{self, Torn};
use crate::shm_file::{open_regular, read_prefix};

/// One consistent reading of a replica's reservations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterRecord {
    /// The replica (the file's name and its identity line).
    pub replica_id: EngineId,
    /// The file's generation (a restarted router's file has a higher one).
    pub generation: u64,
    /// The sequence the reading was published under (even).
    pub seq: u64,
    /// `CLOCK_MONOTONIC` of the writer's last change, in ns.
    pub changed_mono_ns: u64,
    /// The last heartbeat stamp (`CLOCK_MONOTONIC` ns of the writer's
    /// host), loaded after the seqlock read (it is outside it).
    pub heartbeat_mono_ns: u64,
    /// The live slots, in slot order: each engine once.
    pub engines: Vec<(EngineId, Reservations)>,
}

/// One router replica's reservations file, mapped read-only.
///
/// [`RouterFile::open`] checks the header, the size and the replica id, and
/// makes one read to refuse a file whose published contents break the
/// rules; later reads check the contents again (another process may write
/// into the file), and a malformed reading is a [`RouterError`] for this
/// replica alone.
#[derive(Debug)]
pub struct RouterFile {
    map: Mapping,
    path: PathBuf,
    header: RouterHeader,
    replica_id: EngineId,
    inode: u64,
}

impl RouterFile {
    /// Opens and validates `path`, in the order of docs/FORMAT.md, "Shared
    /// reservations": a regular file (else [`Error::RefusedEntry`]), magic,
    /// version, header fields, capacity bound, size, replica id (valid and
    /// the file's name), then one read (else [`Error::Router`], whose
    /// [`RouterError::kind`] is the class). A read that finds a write in
    /// progress does not fail the open.
    pub fn open(path: impl AsRef<Path>) -> Result<RouterFile, Error> {
        let path = path.as_ref();
        let file = open_regular(path)?;
        RouterFile::from_file(&file, path)
    }

    fn from_file(file: &File, path: &Path) -> Result<RouterFile, Error> {
        let router_error = |error: RouterError| Error::Router {
            path: path.to_owned(),
            error,
        };
        let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
        // The header alone (`pread`: mapping a short file would fault),
        // then the size it implies, before anything is mapped.
        let mut start = [0u8; ROUTER_HEADER_SIZE];
        let have = read_prefix(file, &mut start).map_err(|e| Error::io("read", path, e))?;
        let header = check_start(&start[..have], meta.len()).map_err(router_error)?;
        let map = Mapping::read_only_len(file, path, router_file_size(header.capacity as usize))?;
        let field = map.bytes::<{ REPLICA_ID_FIELD_SIZE / 8 }>(REPLICA_ID_OFFSET);
        let replica_id = EngineId::from_field(&field).map_err(|e| {
            router_error(RouterError::corrupt(format!(
                "its replica id is invalid: {e}"
            )))
        })?;
        if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
            if name != replica_id.as_str() {
                return Err(router_error(RouterError::corrupt(format!(
                    "it names replica {:?} but the file is called {name:?}",
                    replica_id.as_str()
                ))));
            }
        }
        let router = RouterFile {
            map,
            path: path.to_owned(),
            header,
            replica_id,
            inode: meta.ino(),
        };
        match router.read() {
            Ok(_) | Err(RouterError::Torn(_)) => Ok(router),
            Err(error) => Err(router_error(error)),
        }
    }

    /// A consistent copy of the reservations, checked (`count ≤
    /// capacity`, every live slot a valid engine id with zero padding, no
    /// engine twice); [`RouterError::Torn`] when no consistent copy could
    /// be had within the seqlock's retry bound, or the file was truncated
    /// or zeroed under the mapping.
    pub fn read(&self) -> Result<RouterRecord, RouterError> {
        let mut engines = Vec::new();
        let (seq, changed_mono_ns) = self.read_engines(&mut engines)?;
        Ok(self.record(seq, changed_mono_ns, engines))
    }

    /// [`RouterFile::read`] into `record`, reusing its engine list: the
    /// engine ids it already holds at the same slots are kept (see
    /// [`crate::decode_reservation_slots_into`]), so a poller that reads a
    /// replica again and again allocates only when its engines change.
    /// After an error `record.engines` is empty, its other fields unchanged.
    pub fn read_into(&self, record: &mut RouterRecord) -> Result<(), RouterError> {
        let mut engines = std::mem::take(&mut record.engines);
        let read = self.read_engines(&mut engines);
        match read {
            Ok((seq, changed_mono_ns)) => {
                *record = self.record(seq, changed_mono_ns, engines);
                Ok(())
            }
            Err(error) => {
                engines.clear();
                record.engines = engines;
                Err(error)
            }
        }
    }

    fn record(
        &self,
        seq: u64,
        changed_mono_ns: u64,
        engines: Vec<(EngineId, Reservations)>,
    ) -> RouterRecord {
        RouterRecord {
            replica_id: self.replica_id.clone(),
            generation: self.header.generation,
            seq,
            changed_mono_ns,
            // Relaxed, after the seqlock read: the stamp carries no other
            // data; a reader only ages it.
            heartbeat_mono_ns: self.heartbeat_mono_ns(),
            engines,
        }
    }

    /// The seqlock read, decoded into `engines`: the sequence and
    /// `changed_mono_ns`.
    fn read_engines(
        &self,
        engines: &mut Vec<(EngineId, Reservations)>,
    ) -> Result<(u64, u64), RouterError> {
        let capacity = self.header.capacity as usize;
        let count_word = self.map.word(ROUTER_COUNT_OFFSET);
        let changed_word = self.map.word(ROUTER_CHANGED_OFFSET);
        let slots = self
            .map
            .word_slice(ROUTER_SLOTS_OFFSET, capacity * SLOT_WORDS);
        let mut words: Vec<u64> = Vec::new();
        // The seqlock read (docs/FORMAT.md, "The seqlock protocol") over
        // count, changed_mono_ns and the first `count` slots: Relaxed loads
        // between `read_with`'s fences, which pair with the writer's (the
        // counted-words protocol loom checks:
        // `seqlock::loom_tests::counted_words_are_copied_whole`).
        let ((count, changed_mono_ns), seq) =
            seqlock::read_with(self.map.word(ROUTER_SEQ_OFFSET), || {
                let count = count_word.load(Ordering::Relaxed);
                let changed = changed_word.load(Ordering::Relaxed);
                // Untrusted until the sequence is checked: bounded before use.
                let live = (count.min(capacity as u64) as usize) * SLOT_WORDS;
                words.clear();
                words.extend(slots[..live].iter().map(|w| w.load(Ordering::Relaxed)));
                (count, changed)
            })
            .map_err(RouterError::Torn)?;
        // A writer's first write (sequence 2) comes before the file
        // appears: sequence 0 is a file truncated (zero pages) or zeroed.
        if seq == 0 || self.map.truncated() {
            return Err(RouterError::Torn(Torn { last_seq: seq }));
        }
        if count > capacity as u64 {
            return Err(RouterError::corrupt(format!(
                "count {count} is above the file's capacity of {capacity} slots"
            )));
        }
        decode_reservation_slots_into(bytemuck::cast_slice(&words), engines)?;
        Ok((seq, changed_mono_ns))
    }

    /// The last heartbeat stamp (one Relaxed load).
    #[inline]
    pub fn heartbeat_mono_ns(&self) -> u64 {
        self.map
            .word(ROUTER_HEARTBEAT_OFFSET)
            .load(Ordering::Relaxed)
    }

    /// The sequence word as it is now (one Relaxed load, orders nothing):
    /// a cheap "did anything change?" probe, as [`crate::ShmFile::seq`].
    #[inline]
    pub fn seq(&self) -> u64 {
        self.map.word(ROUTER_SEQ_OFFSET).load(Ordering::Relaxed)
    }

    /// The writer retired this file (closed, or replaced it): open the path
    /// again for the current one.
    #[inline]
    pub fn is_retired(&self) -> bool {
        self.map.word(ROUTER_STATE_WORD * 8).load(Ordering::Relaxed) == STATE_RETIRED
    }

    /// Another process truncated the file under this mapping (reads are
    /// [`RouterError::Torn`] from then on; open the path again).
    #[inline]
    pub fn is_truncated(&self) -> bool {
        self.map.truncated()
    }

    /// The header as it was at open (`state` may have changed since: see
    /// [`RouterFile::is_retired`]).
    pub fn header(&self) -> &RouterHeader {
        &self.header
    }

    /// The replica id recorded in the file (its name).
    pub fn replica_id(&self) -> &EngineId {
        &self.replica_id
    }

    /// The file's generation.
    pub fn generation(&self) -> u64 {
        self.header.generation
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's inode (with the generation, what tells a replacement apart).
    pub fn inode(&self) -> u64 {
        self.inode
    }
}

/// The header of a file whose first bytes are `start` and whose size is
/// `size`: magic and version first (a foreign or future file is told
/// apart from a short one), then the header's fields, then the size.
fn check_start(start: &[u8], size: u64) -> Result<RouterHeader, RouterError> {
    if start.len() >= 8 && start[..8] != ROUTER_MAGIC.to_le_bytes() {
        return Err(RouterError::NotRouter);
    }
    if start.len() >= 12 {
        let found = u32::from_le_bytes(start[8..12].try_into().expect("4 bytes"));
        if found != ROUTER_LAYOUT_VERSION {
            return Err(RouterError::UnknownVersion { found });
        }
    }
    let Ok(start) = <&[u8; ROUTER_HEADER_SIZE]>::try_from(start) else {
        return Err(RouterError::WrongSize {
            size,
            expected: ROUTER_FILE_SIZE as u64,
        });
    };
    let header = RouterHeader::from_le_bytes(start);
    header.check()?;
    let expected = router_file_size(header.capacity as usize) as u64;
    if size != expected {
        return Err(RouterError::WrongSize { size, expected });
    }
    Ok(header)
}
