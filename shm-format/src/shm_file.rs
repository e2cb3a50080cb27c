//! A reader's view of one engine-state file: opened read-only, validated,
//! mapped `PROT_READ`, never written.

use std::fs::{File, FileType, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use crate::engine_id::EngineId;
use crate::error::{Error, OPEN_FOR_READING};
use crate::layout::*;
use crate::mapping::Mapping;
use crate::seqlock::{self, Torn};
use crate::snapshot::Snapshot;

/// One engine-state file, mapped read-only.
///
/// [`ShmFile::open`] checks size, magic, layout version, header sizes and the
/// engine id before the mapping is used. Reads are lock-free: [`ShmFile::read`]
/// is the seqlock read of docs/FORMAT.md, "The seqlock protocol".
#[derive(Debug)]
pub struct ShmFile {
    pub(crate) map: Mapping,
    path: PathBuf,
    header: Header,
    engine_id: EngineId,
    inode: u64,
}

impl ShmFile {
    /// Opens and validates `path`.
    ///
    /// Never blocks and never leaves the directory: a symbolic link is not
    /// followed and anything but a regular file (a FIFO, a socket, a device, a
    /// directory) is refused with [`Error::RefusedEntry`].
    pub fn open(path: impl AsRef<Path>) -> Result<ShmFile, Error> {
        let path = path.as_ref();
        let file = open_regular(path)?;
        ShmFile::from_file(file, path)
    }

    /// Validates an open file and maps it read-only.
    pub(crate) fn from_file(file: File, path: &Path) -> Result<ShmFile, Error> {
        check_size(&file, path)?;
        let map = Mapping::read_only(&file, path)?;
        ShmFile::checked(map, &file, path)
    }

    /// Validates an open file and maps it read-write (for a writer retiring it).
    pub(crate) fn validate(file: &File, path: &Path) -> Result<ShmFile, Error> {
        check_size(file, path)?;
        let map = Mapping::read_write(file, path)?;
        ShmFile::checked(map, file, path)
    }

    fn checked(map: Mapping, file: &File, path: &Path) -> Result<ShmFile, Error> {
        let header = map.header();
        check_header(&header, path)?;
        let engine_id =
            EngineId::from_field(&map.bytes::<{ ENGINE_ID_FIELD_SIZE / 8 }>(ENGINE_ID_OFFSET))
                .map_err(|e| Error::CorruptHeader {
                    path: path.to_owned(),
                    what: e.to_string(),
                })?;
        if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
            if name != engine_id.as_str() {
                return Err(Error::CorruptHeader {
                    path: path.to_owned(),
                    what: format!(
                        "it names engine {:?} but the file is called {name:?}",
                        engine_id.as_str()
                    ),
                });
            }
        }
        let inode = file
            .metadata()
            .map_err(|e| Error::io("stat", path, e))?
            .ino();
        Ok(ShmFile {
            map,
            path: path.to_owned(),
            header,
            engine_id,
            inode,
        })
    }

    /// A consistent snapshot and the sequence it was published under, or
    /// [`Torn`] when no consistent copy could be had within the retry bound.
    #[inline]
    pub fn read(&self) -> Result<(Snapshot, u64), Torn> {
        let (words, seq) =
            seqlock::read(self.map.word(SEQ_OFFSET), self.map.words(PAYLOAD_OFFSET))?;
        // A writer publishes its first snapshot (sequence 2) before the file
        // appears, so sequence 0 is never a snapshot: the file was truncated
        // under the mapping (the `SIGBUS` handler mapped zero pages over it;
        // any load that faulted makes the final reload of the sequence 0) or
        // zeroed. A compare of a register, not a load: the read path keeps
        // its cost (BENCHMARKS.md).
        if seq == 0 {
            return Err(Torn { last_seq: seq });
        }
        Ok((Snapshot::from_words(words), seq))
    }

    /// Another process truncated the file under this reader's mapping (a
    /// read touched a page beyond its end). From then on the mapping reads
    /// zeros, [`ShmFile::read`] returns [`Torn`], and the file should be
    /// opened again (which reports what it is now, e.g. its wrong size).
    #[inline]
    pub fn is_truncated(&self) -> bool {
        self.map.truncated()
    }

    /// The seqlock sequence word as it is now (one Relaxed load, no fence):
    /// a cheap "did anything change?" probe. Even values are published
    /// snapshots, odd ones a write in progress. It orders nothing: to see the
    /// snapshot of a changed sequence, call [`ShmFile::read`], whose own
    /// loads pair with the writer's stores (docs/FORMAT.md, "The seqlock
    /// protocol").
    #[inline]
    pub fn seq(&self) -> u64 {
        self.map.word(SEQ_OFFSET).load(Ordering::Relaxed)
    }

    /// The last heartbeat stamp (`CLOCK_MONOTONIC` ns of the writer's host).
    #[inline]
    pub fn heartbeat_mono_ns(&self) -> u64 {
        self.map.word(HEARTBEAT_OFFSET).load(Ordering::Relaxed)
    }

    /// The writer retired this file (closed, or replaced by a new writer).
    #[inline]
    pub fn is_retired(&self) -> bool {
        self.map.word(STATE_WORD * 8).load(Ordering::Relaxed) == STATE_RETIRED
    }

    /// The header as it was at open (the `state` field may have changed since:
    /// see [`ShmFile::is_retired`]).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The engine id recorded in the file.
    pub fn engine_id(&self) -> &EngineId {
        &self.engine_id
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's inode (with the generation, what tells a replacement apart).
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// The file's generation.
    pub fn generation(&self) -> u64 {
        self.header.generation
    }
}

/// Opens `path` read-only in a way that cannot block or follow a link:
/// `O_NONBLOCK` (opening a FIFO without a writer would otherwise wait forever),
/// `O_NOFOLLOW` (a symbolic link fails with `ELOOP` instead of being
/// followed out of the directory), `O_CLOEXEC`; then `fstat` of the
/// descriptor itself (not of the path, which may have changed meanwhile)
/// refuses anything that is not a regular file. `O_NONBLOCK` changes nothing
/// for a regular file: the reader only maps it and `pread`s its first bytes.
///
/// Before the open, an `lstat` refuses what is no regular file without
/// opening it: opening a device node can have effects of its own (a tape
/// rewinds, a modem line hangs up), and a socket cannot be opened at all
/// (`ENXIO`), which would be reported as an I/O error rather than what it
/// is. (Swapped in between `lstat` and `open`, an entry is still refused
/// by the `fstat`.)
pub(crate) fn open_regular(path: &Path) -> Result<File, Error> {
    refuse_irregular_entry(path)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => Error::RefusedEntry {
                path: path.to_owned(),
                what: "symbolic link, not followed".to_owned(),
            },
            _ => Error::io(OPEN_FOR_READING, path, e),
        })?;
    let kind = file
        .metadata()
        .map_err(|e| Error::io("stat", path, e))?
        .file_type();
    if !kind.is_file() {
        return Err(refused(path, kind));
    }
    Ok(file)
}

/// The `lstat` before an open (see [`open_regular`]): refuses what is no
/// regular file without opening it. Gone or unreadable is not refused here:
/// the open that follows says which.
pub(crate) fn refuse_irregular_entry(path: &Path) -> Result<(), Error> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_file() => Err(refused(path, meta.file_type())),
        _ => Ok(()),
    }
}

/// The refusal of an entry of kind `kind` that is no regular file.
pub(crate) fn refused(path: &Path, kind: FileType) -> Error {
    Error::RefusedEntry {
        path: path.to_owned(),
        what: if kind.is_symlink() {
            "symbolic link, not followed".to_owned()
        } else {
            format!("not a regular file ({})", kind_name(kind))
        },
    }
}

fn kind_name(kind: FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else {
        "an unknown file type"
    }
}

fn check_size(file: &File, path: &Path) -> Result<(), Error> {
    let meta = file.metadata().map_err(|e| Error::io("stat", path, e))?;
    if !meta.is_file() {
        return Err(Error::io(
            "read",
            path,
            io::Error::other("not a regular file"),
        ));
    }
    if meta.len() == FILE_SIZE as u64 {
        return Ok(());
    }
    // Tell a foreign file, a future layout and a truncated file apart before
    // mapping anything.
    let mut start = [0u8; 12];
    let have = file
        .read_at(&mut start, 0)
        .map_err(|e| Error::io("read", path, e))?;
    if have >= 8 && u64::from_le_bytes(start[..8].try_into().expect("8 bytes")) != MAGIC {
        return Err(Error::NotEngineState {
            path: path.to_owned(),
        });
    }
    if have == 12 {
        let version = u32::from_le_bytes(start[8..12].try_into().expect("4 bytes"));
        if version != LAYOUT_VERSION {
            return Err(Error::UnknownVersion {
                path: path.to_owned(),
                found: version,
                supported: LAYOUT_VERSION,
            });
        }
    }
    Err(Error::WrongSize {
        path: path.to_owned(),
        size: meta.len(),
        expected: FILE_SIZE as u64,
    })
}

fn check_header(header: &Header, path: &Path) -> Result<(), Error> {
    if header.magic != MAGIC {
        return Err(Error::NotEngineState {
            path: path.to_owned(),
        });
    }
    if header.layout_version != LAYOUT_VERSION {
        return Err(Error::UnknownVersion {
            path: path.to_owned(),
            found: header.layout_version,
            supported: LAYOUT_VERSION,
        });
    }
    let corrupt = |what: String| {
        Err(Error::CorruptHeader {
            path: path.to_owned(),
            what,
        })
    };
    if header.header_size as usize != HEADER_SIZE || header.payload_size as usize != PAYLOAD_SIZE {
        return corrupt(format!(
            "header/payload size {}/{}, expected {HEADER_SIZE}/{PAYLOAD_SIZE}",
            header.header_size, header.payload_size
        ));
    }
    if header.state != STATE_ACTIVE && header.state != STATE_RETIRED {
        return corrupt(format!("state {}", header.state));
    }
    Ok(())
}

/// Reads up to `buf.len()` bytes from the start of `file` (fewer at its end).
pub(crate) fn read_prefix(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut have = 0;
    while have < buf.len() {
        match file.read_at(&mut buf[have..], have as u64) {
            Ok(0) => break,
            Ok(n) => have += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(have)
}

/// The first `N` bytes of `file` (a header), or `None` when it has fewer
/// or cannot be read.
pub(crate) fn read_start<const N: usize>(file: &File) -> Option<[u8; N]> {
    let mut start = [0u8; N];
    match read_prefix(file, &mut start) {
        Ok(n) if n == N => Some(start),
        _ => None,
    }
}
