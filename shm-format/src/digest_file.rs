//! A reader's view of one cache digest file (`<dir>.cache/<id>`, docs/FORMAT.md,
//! "Cache residency"): opened read-only like an engine's file (never blocks,
//! never follows a link, refuses anything but a regular file), validated,
//! mapped `PROT_READ` at its own size, never written; a file truncated under
//! the mapping reads as torn, never `SIGBUS` (module `sigbus`).

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::digest::CacheDigest;
use crate::digest_layout::*;
use crate::digest_value::{check_control, record_digest, record_of_blocks, split, DigestRecord};
use crate::error::{DigestError, Error};
use crate::layout::STATE_RETIRED;
use crate::mapping::Mapping;
use crate::seqlock::{self, Torn};
use crate::shm_file::{open_regular, read_prefix};

/// One engine's cache digest file, mapped read-only.
///
/// [`DigestFile::open`] checks the header and the size, and makes one read
/// to refuse a file whose published contents break the rules; later reads
/// check the contents again (another process may write into the file).
#[derive(Debug)]
pub struct DigestFile {
    map: Mapping,
    path: PathBuf,
    header: DigestHeader,
    inode: u64,
}

impl DigestFile {
    /// Opens and validates `path`, in the order of docs/FORMAT.md, "Cache
    /// residency": a regular file (else [`Error::RefusedEntry`]), magic,
    /// version, header fields, capacity bound, size, then one read: `count
    /// ≤ capacity`, entries strictly ascending (else [`Error::Digest`],
    /// whose [`DigestError::kind`] is the class). A read that finds a
    /// write in progress does not fail the open.
    pub fn open(path: impl AsRef<Path>) -> Result<DigestFile, Error> {
        let path = path.as_ref();
        let file = open_regular(path)?;
        DigestFile::from_file(&file, path)
    }

    fn from_file(file: &File, path: &Path) -> Result<DigestFile, Error> {
        let digest_error = |error: DigestError| Error::Digest {
            path: path.to_owned(),
            error,
        };
        let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
        // The header alone (`pread`: mapping a short file would fault), then
        // the size it implies, before anything is mapped.
        let mut start = [0u8; DIGEST_HEADER_SIZE];
        let have = read_prefix(file, &mut start).map_err(|e| Error::io("read", path, e))?;
        let header = match split_header(&start[..have], meta.len()) {
            Ok(header) => header,
            Err(error) => return Err(digest_error(error)),
        };
        let size = digest_size(header.capacity as usize);
        let map = Mapping::read_only_len(file, path, size)?;
        let digest = DigestFile {
            map,
            path: path.to_owned(),
            header,
            inode: meta.ino(),
        };
        match digest.read_record() {
            Ok(_) | Err(DigestError::Torn(_)) => Ok(digest),
            Err(error) => Err(digest_error(error)),
        }
    }

    /// A consistent copy of the digest, checked (`count ≤ capacity`,
    /// entries strictly ascending, version ≥ 1); [`DigestError::Torn`] when
    /// no consistent copy could be had within the retry bound (or the file
    /// was truncated or zeroed under the mapping).
    #[inline]
    pub fn read(&self) -> Result<CacheDigest, DigestError> {
        self.read_record().map(|record| record.digest)
    }

    /// [`DigestFile::read`] with what the header and control words say
    /// about the digest (generation, `held`, capture time, ...).
    pub fn read_record(&self) -> Result<DigestRecord, DigestError> {
        let mut blocks = Vec::new();
        let control = self.read_words(&mut blocks)?;
        record_of_blocks(&self.header, &control, blocks)
    }

    /// [`DigestFile::read`] into `digest`, reusing its allocation: a reader
    /// that reads every version of a digest allocates only when one needs
    /// more entries than any before. After an error `digest` is empty, of
    /// version 0 (never a published digest), its allocation kept.
    #[inline]
    pub fn read_into(&self, digest: &mut CacheDigest) -> Result<(), DigestError> {
        let mut blocks = std::mem::take(digest).into_blocks();
        let checked = self
            .read_words(&mut blocks)
            .and_then(|control| check_entries(&blocks).map(|()| control));
        match checked {
            Ok(control) => {
                *digest = record_digest(&self.header, &control, blocks);
                Ok(())
            }
            Err(error) => {
                blocks.clear();
                *digest = CacheDigest::from_ascending(0, 0, blocks, 0, 0);
                Err(error)
            }
        }
    }

    /// One consistent copy of the control words, and of the entries into
    /// `blocks` (cleared first; its allocation reused), the control words
    /// checked; the entries' order is not. (Checking the order during the
    /// copy, branch-free, measured slower than the separate pass.)
    #[inline]
    fn read_words(
        &self,
        blocks: &mut Vec<u64>,
    ) -> Result<[u64; DIGEST_CONTROL_WORDS], DigestError> {
        let capacity = self.header.capacity as usize;
        let control_words = self
            .map
            .words::<DIGEST_CONTROL_WORDS>(DIGEST_CONTROL_OFFSET);
        let entries = self.map.word_slice(DIGEST_ENTRIES_OFFSET, capacity);
        let (control, seq) = seqlock::read_with(self.map.word(DIGEST_SEQ_OFFSET), || {
            let control: [u64; DIGEST_CONTROL_WORDS] =
                core::array::from_fn(|i| control_words[i].load(Ordering::Relaxed));
            // Untrusted until the sequence is checked: bounded before use.
            let count = (control[CONTROL_COUNT] as usize).min(capacity);
            blocks.clear();
            blocks.extend(entries[..count].iter().map(|w| w.load(Ordering::Relaxed)));
            control
        })
        .map_err(DigestError::Torn)?;
        // A writer publishes its first digest (sequence 2) before the file
        // appears: sequence 0 is a file truncated (zero pages) or zeroed.
        if seq == 0 || self.map.truncated() {
            return Err(DigestError::Torn(Torn { last_seq: seq }));
        }
        check_control(&self.header, &control)?;
        Ok(control)
    }

    /// The writer retired this file (closed, or replaced it): open the path
    /// again for the current one.
    #[inline]
    pub fn is_retired(&self) -> bool {
        self.map.word(DIGEST_STATE_WORD * 8).load(Ordering::Relaxed) == STATE_RETIRED
    }

    /// Another process truncated the file under this mapping (reads are
    /// [`DigestError::Torn`] from then on; open the path again).
    #[inline]
    pub fn is_truncated(&self) -> bool {
        self.map.truncated()
    }

    /// The sequence word as it is now (one Relaxed load, orders nothing):
    /// a cheap "did anything change?" probe, as [`crate::ShmFile::seq`].
    #[inline]
    pub fn seq(&self) -> u64 {
        self.map.word(DIGEST_SEQ_OFFSET).load(Ordering::Relaxed)
    }

    /// The header as it was at open (`state` may have changed since: see
    /// [`DigestFile::is_retired`]).
    pub fn header(&self) -> &DigestHeader {
        &self.header
    }

    /// The generation of the engine file this digest belongs to.
    pub fn generation(&self) -> u64 {
        self.header.generation
    }

    /// Entries the file holds.
    pub fn capacity(&self) -> usize {
        self.header.capacity as usize
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's inode.
    pub fn inode(&self) -> u64 {
        self.inode
    }
}

/// The header of a file whose first bytes are `start` and whose size is
/// `size`, validated like a value's (magic, version, fields, control words,
/// then the size), the entries excepted.
fn split_header(start: &[u8], size: u64) -> Result<DigestHeader, DigestError> {
    if start.len() < DIGEST_HEADER_SIZE {
        // Magic and version first, then "too short" (what `split` says of
        // any prefix shorter than a header).
        return Err(split(start).err().unwrap_or(DigestError::WrongSize {
            size,
            expected: DIGEST_HEADER_SIZE as u64,
        }));
    }
    let header = DigestHeader::from_le_bytes(
        start[..DIGEST_FIXED_HEADER_SIZE]
            .try_into()
            .expect("64 bytes"),
    );
    // Magic, version, header fields (`split` on the header alone would
    // also check the size, which the file's entries make larger).
    if header.magic != DIGEST_MAGIC {
        return Err(DigestError::NotDigest);
    }
    if header.layout_version != DIGEST_LAYOUT_VERSION {
        return Err(DigestError::UnknownVersion {
            found: header.layout_version,
        });
    }
    header.check()?;
    let expected = digest_size(header.capacity as usize) as u64;
    if size != expected {
        return Err(DigestError::WrongSize { size, expected });
    }
    Ok(header)
}
