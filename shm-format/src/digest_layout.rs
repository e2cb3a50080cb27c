//! The cache digest's bytes, digest layout version 1 (docs/FORMAT.md,
//! "Cache residency", whose table a test checks against these constants):
//! one engine's [`CacheDigest`](crate::CacheDigest) in its file
//! `<dir>.cache/<id>` and in its Redis value, which share these 128 bytes
//! of header and control words.
//!
//! ```text
//! offset  size  cache line 0: header (immutable after creation but `state`)
//!      0     8  magic                 b"ESDIGEST"
//!      8     4  layout_version        1 (the digest's own version)
//!     12     2  header_size           128
//!     14     2  entry_size            8
//!     16     4  writer_pid
//!     20     4  capacity              entries the file holds (a Redis value: count)
//!     24     8  state                 1 ACTIVE, 2 RETIRED (atomic u64)
//!     32     8  generation            the engine file's (the Redis record's) generation
//!     40     8  created_unix_ns
//!     48     4  kv_block_size         the engine's KV block size in tokens (display)
//!     52     4  block_tokens          512 (BLOCK_TOKENS)
//!     56     8  reserved
//!               cache line 1: seqlock and control words
//!     64     8  seq                   over 72..128 and the entries (0 in a Redis value)
//!     72     8  version               >= 1, +1 at each published change
//!     80     8  captured_mono_ns
//!     88     8  captured_unix_ns
//!     96     8  count                 valid entries, <= capacity
//!    104     8  held                  router blocks held at the capture (>= count)
//!    112    16  reserved
//!    128  8 × capacity  entries       u64 block hashes, strictly ascending, first `count` valid
//! ```
//!
//! `writer_pid`, `state` and `generation` sit at the offsets they have in an
//! engine's Redis record (16, 24 and 32), so the Redis owner check (the
//! record's, docs/FORMAT.md, "Cache residency") compares the same bytes.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use bytemuck::{Pod, Zeroable};

use crate::blocks::BLOCK_TOKENS;
use crate::error::DigestError;
use crate::layout::{STATE_ACTIVE, STATE_RETIRED};

/// First word of every digest file and value: the bytes `ESDIGEST`.
pub const DIGEST_MAGIC: u64 = u64::from_le_bytes(*b"ESDIGEST");
/// The digest layout version this crate reads and writes (the digest's own,
/// independent of the engine file's [`LAYOUT_VERSION`](crate::LAYOUT_VERSION)).
pub const DIGEST_LAYOUT_VERSION: u32 = 1;
/// Bytes before the entries: header (cache line 0) and control words (line 1).
pub const DIGEST_HEADER_SIZE: usize = 128;
/// Bytes per entry (one `u64` block hash).
pub const DIGEST_ENTRY_SIZE: usize = 8;
/// Size of the fixed header (cache line 0), as [`DigestHeader`].
pub const DIGEST_FIXED_HEADER_SIZE: usize = 64;
/// Word index of `state` inside the header.
pub const DIGEST_STATE_WORD: usize = 3;
/// Offset of the seqlock sequence word.
pub const DIGEST_SEQ_OFFSET: usize = 64;
/// Offset of the control words (`version` first), protected by the seqlock.
pub const DIGEST_CONTROL_OFFSET: usize = 72;
/// Number of control words (72..128): version, captured_mono_ns,
/// captured_unix_ns, count, held, two reserved.
pub const DIGEST_CONTROL_WORDS: usize = 7;
/// Index of `version` among the control words.
pub const CONTROL_VERSION: usize = 0;
/// Index of `captured_mono_ns` among the control words.
pub const CONTROL_CAPTURED_MONO_NS: usize = 1;
/// Index of `captured_unix_ns` among the control words.
pub const CONTROL_CAPTURED_UNIX_NS: usize = 2;
/// Index of `count` among the control words.
pub const CONTROL_COUNT: usize = 3;
/// Index of `held` among the control words.
pub const CONTROL_HELD: usize = 4;
/// Offset of the first entry.
pub const DIGEST_ENTRIES_OFFSET: usize = 128;
/// The most entries a digest may have (1 MiB of entries): writers refuse
/// more, readers refuse files and values claiming more, so every read is
/// bounded.
pub const MAX_DIGEST_ENTRIES: usize = 131_072;
/// The largest digest file or Redis value: header and [`MAX_DIGEST_ENTRIES`]
/// entries (a reader's `GETRANGE key 0 <this - 1>` fetches any valid value
/// and one byte more would tell an oversized one).
pub const MAX_DIGEST_SIZE: usize = DIGEST_HEADER_SIZE + DIGEST_ENTRY_SIZE * MAX_DIGEST_ENTRIES;
/// What the cache directory's name adds to the state directory's.
pub const CACHE_DIR_SUFFIX: &str = ".cache";

const _: () = assert!(DIGEST_SEQ_OFFSET == DIGEST_FIXED_HEADER_SIZE);
const _: () = assert!(DIGEST_CONTROL_OFFSET == DIGEST_SEQ_OFFSET + 8);
const _: () = assert!(DIGEST_CONTROL_OFFSET + 8 * DIGEST_CONTROL_WORDS == DIGEST_ENTRIES_OFFSET);
const _: () = assert!(DIGEST_ENTRIES_OFFSET == DIGEST_HEADER_SIZE);
const _: () = assert!(MAX_DIGEST_ENTRIES <= u32::MAX as usize);

/// Cache line 0 of a digest, as plain data.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct DigestHeader {
    /// [`DIGEST_MAGIC`].
    pub magic: u64,
    /// [`DIGEST_LAYOUT_VERSION`].
    pub layout_version: u32,
    /// [`DIGEST_HEADER_SIZE`].
    pub header_size: u16,
    /// [`DIGEST_ENTRY_SIZE`].
    pub entry_size: u16,
    /// Process id of the writer, in its own pid namespace.
    pub writer_pid: u32,
    /// Entries the file holds (a Redis value: its `count`).
    pub capacity: u32,
    /// [`STATE_ACTIVE`] or [`STATE_RETIRED`] (a Redis value: ACTIVE).
    pub state: u64,
    /// The generation of the engine file (or Redis record) this digest belongs to.
    pub generation: u64,
    /// `CLOCK_REALTIME` when the file was created, in ns since the epoch.
    pub created_unix_ns: u64,
    /// The engine's KV block size in tokens (display only).
    pub kv_block_size: u32,
    /// Tokens per router block: [`BLOCK_TOKENS`].
    pub block_tokens: u32,
    /// Zero.
    pub reserved: u64,
}

const _: () = assert!(core::mem::size_of::<DigestHeader>() == DIGEST_FIXED_HEADER_SIZE);
const _: () = assert!(core::mem::offset_of!(DigestHeader, layout_version) == 8);
const _: () = assert!(core::mem::offset_of!(DigestHeader, header_size) == 12);
const _: () = assert!(core::mem::offset_of!(DigestHeader, entry_size) == 14);
const _: () = assert!(core::mem::offset_of!(DigestHeader, writer_pid) == 16);
const _: () = assert!(core::mem::offset_of!(DigestHeader, capacity) == 20);
const _: () = assert!(core::mem::offset_of!(DigestHeader, state) == DIGEST_STATE_WORD * 8);
const _: () = assert!(core::mem::offset_of!(DigestHeader, generation) == 32);
const _: () = assert!(core::mem::offset_of!(DigestHeader, created_unix_ns) == 40);
const _: () = assert!(core::mem::offset_of!(DigestHeader, kv_block_size) == 48);
const _: () = assert!(core::mem::offset_of!(DigestHeader, block_tokens) == 52);
const _: () = assert!(core::mem::offset_of!(DigestHeader, reserved) == 56);

impl DigestHeader {
    /// The header of a new digest of `capacity` entries (ACTIVE).
    pub fn new(
        writer_pid: u32,
        capacity: u32,
        generation: u64,
        created_unix_ns: u64,
        kv_block_size: u32,
    ) -> DigestHeader {
        DigestHeader {
            magic: DIGEST_MAGIC,
            layout_version: DIGEST_LAYOUT_VERSION,
            header_size: DIGEST_HEADER_SIZE as u16,
            entry_size: DIGEST_ENTRY_SIZE as u16,
            writer_pid,
            capacity,
            state: STATE_ACTIVE,
            generation,
            created_unix_ns,
            kv_block_size,
            block_tokens: BLOCK_TOKENS as u32,
            reserved: 0,
        }
    }

    /// The header from its first 64 bytes (little-endian).
    pub fn from_le_bytes(bytes: &[u8; DIGEST_FIXED_HEADER_SIZE]) -> DigestHeader {
        bytemuck::pod_read_unaligned(bytes)
    }

    /// The header's 64 bytes (little-endian).
    pub fn to_le_bytes(&self) -> [u8; DIGEST_FIXED_HEADER_SIZE] {
        bytemuck::cast(*self)
    }

    /// Validation after magic and version (docs/FORMAT.md, "Cache
    /// residency"): sizes, block tokens, state, capacity bound. The magic
    /// and version are checked first by the caller (they decide which
    /// error a foreign or future digest gets).
    pub(crate) fn check(&self) -> Result<(), DigestError> {
        if self.magic != DIGEST_MAGIC {
            return Err(DigestError::NotDigest);
        }
        if self.layout_version != DIGEST_LAYOUT_VERSION {
            return Err(DigestError::UnknownVersion {
                found: self.layout_version,
            });
        }
        if usize::from(self.header_size) != DIGEST_HEADER_SIZE
            || usize::from(self.entry_size) != DIGEST_ENTRY_SIZE
        {
            return Err(DigestError::corrupt(format!(
                "header/entry size {}/{}, expected {DIGEST_HEADER_SIZE}/{DIGEST_ENTRY_SIZE}",
                self.header_size, self.entry_size
            )));
        }
        if self.block_tokens as usize != BLOCK_TOKENS {
            return Err(DigestError::corrupt(format!(
                "block_tokens {}, expected {BLOCK_TOKENS}",
                self.block_tokens
            )));
        }
        if self.state != STATE_ACTIVE && self.state != STATE_RETIRED {
            return Err(DigestError::corrupt(format!("state {}", self.state)));
        }
        if self.capacity as usize > MAX_DIGEST_ENTRIES {
            return Err(DigestError::corrupt(format!(
                "capacity {} is above the limit of {MAX_DIGEST_ENTRIES} entries",
                self.capacity
            )));
        }
        Ok(())
    }
}

/// Size in bytes of a digest file of `capacity` entries (and of a Redis
/// value of `capacity` entries).
pub const fn digest_size(capacity: usize) -> usize {
    DIGEST_HEADER_SIZE + DIGEST_ENTRY_SIZE * capacity
}

/// The directory of the cache digests of the engines publishing into
/// `state_dir`: its path with [`CACHE_DIR_SUFFIX`] appended
/// (`/dev/shm/agentic_engine_state` → `/dev/shm/agentic_engine_state.cache`).
/// A sibling, never inside `state_dir`, where a layout-1 reader would take
/// a digest for an engine's file. Trailing slashes of `state_dir` are
/// dropped first.
pub fn cache_dir(state_dir: &Path) -> PathBuf {
    sibling_dir(state_dir, CACHE_DIR_SUFFIX)
}

/// `state_dir`'s path, trailing slashes dropped, with `suffix` appended: the
/// sibling directories [`cache_dir`] and
/// [`routers_dir`](crate::routers_dir).
pub(crate) fn sibling_dir(state_dir: &Path, suffix: &str) -> PathBuf {
    let trimmed = state_dir.components().as_path();
    let mut name = OsString::from(trimmed.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

/// Checks the first `count` entries: strictly ascending (which also means
/// no duplicate). The error names the first offending index.
pub(crate) fn check_entries(entries: &[u64]) -> Result<(), DigestError> {
    match entries.windows(2).position(|pair| pair[0] >= pair[1]) {
        None => Ok(()),
        Some(i) => Err(DigestError::corrupt(format!(
            "entries {} and {} are not strictly ascending ({:#018x} then {:#018x})",
            i,
            i + 1,
            entries[i],
            entries[i + 1]
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_spells_esdigest() {
        assert_eq!(&DIGEST_MAGIC.to_le_bytes(), b"ESDIGEST");
    }

    /// Pins the header bytes: any change here is a layout change and must
    /// bump [`DIGEST_LAYOUT_VERSION`].
    #[test]
    fn golden_header_bytes() {
        let header = DigestHeader::new(0x0102_0304, 430, 3, 0x2122, 16);
        #[rustfmt::skip]
        let golden: [u8; DIGEST_FIXED_HEADER_SIZE] = [
            b'E', b'S', b'D', b'I', b'G', b'E', b'S', b'T',   // magic
            1, 0, 0, 0,  128, 0,  8, 0,                       // version, header, entry size
            0x04, 0x03, 0x02, 0x01,  0xae, 0x01, 0, 0,        // pid, capacity 430
            1, 0, 0, 0, 0, 0, 0, 0,                           // state ACTIVE
            3, 0, 0, 0, 0, 0, 0, 0,                           // generation
            0x22, 0x21, 0, 0, 0, 0, 0, 0,                     // created
            16, 0, 0, 0,  0, 2, 0, 0,                         // kv block size, block tokens 512
            0, 0, 0, 0, 0, 0, 0, 0,                           // reserved
        ];
        assert_eq!(header.to_le_bytes(), golden);
        assert_eq!(DigestHeader::from_le_bytes(&golden), header);
        assert_eq!(header.check(), Ok(()));
    }

    #[test]
    fn cache_dir_is_a_sibling() {
        let cases = [
            (
                "/dev/shm/agentic_engine_state",
                "/dev/shm/agentic_engine_state.cache",
            ),
            (
                "/dev/shm/agentic_engine_state/",
                "/dev/shm/agentic_engine_state.cache",
            ),
            ("relative/dir", "relative/dir.cache"),
        ];
        for (dir, expected) in cases {
            assert_eq!(cache_dir(Path::new(dir)), PathBuf::from(expected), "{dir}");
        }
        let dir = Path::new("/tmp/x");
        assert_ne!(cache_dir(dir).parent(), Some(dir));
    }

    #[test]
    fn entries_must_be_strictly_ascending() {
        assert_eq!(check_entries(&[]), Ok(()));
        assert_eq!(check_entries(&[1, 2, u64::MAX]), Ok(()));
        let err = check_entries(&[1, 3, 3]).unwrap_err();
        assert_eq!(err.kind(), "corrupt_cache");
        assert!(err.to_string().contains("entries 1 and 2"), "{err}");
        assert!(check_entries(&[5, 4]).is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(digest_size(0), 128);
        assert_eq!(digest_size(430), 128 + 3440);
        assert_eq!(MAX_DIGEST_SIZE, 128 + (1 << 20));
    }
}
