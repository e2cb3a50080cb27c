//! The layout-version-1 shared-memory file: where every byte lives
//! (specified for every language in docs/FORMAT.md, whose tables a test
//! checks against these constants).
//!
//! ```text
//! offset  size  cache line 0: header (immutable after creation but `state`)
//!      0     8  magic                 b"ENGSTATE"
//!      8     4  layout_version        1
//!     12     2  header_size           64
//!     14     2  payload_size          128
//!     16     4  writer_pid
//!     20     4  publish_period_us
//!     24     8  state                 1 ACTIVE, 2 RETIRED (atomic u64)
//!     32     8  writer_pid_ns         inode of the writer's /proc/self/ns/pid (0: unknown)
//!     40     8  created_unix_ns
//!     48     8  generation            previous file's generation + 1 (1 for the first)
//!     56     8  reserved
//!               cache line 1: seqlock
//!     64     8  seq                   even: stable, odd: write in progress (atomic u64)
//!     72     8  heartbeat_mono_ns     stamped every period by the heartbeat thread (atomic u64)
//!               cache lines 2-3: payload
//!    128   128  16 snapshot words     (atomic u64, FORMAT.md "Snapshot words")
//!               cache line 4: identity (immutable)
//!    256    64  engine id             UTF-8, NUL padded (at most 63 bytes)
//!    320  3776  zero
//!   4096        end of file
//! ```
//!
//! The engine id does not fit in cache line 0 next to the fixed fields (63
//! bytes), so it has a line of its own after the payload (by design:
//! docs/FORMAT.md, "Choices made by design"). `state` is a whole `u64` word so
//! that readers, which load the header as eight atomic words, never use a
//! different atomic size than the writer on the same bytes.

use bytemuck::{Pod, Zeroable};

use crate::snapshot::SNAPSHOT_WORDS;

/// First word of every engine-state file: the bytes `ENGSTATE`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"ENGSTATE");
/// The layout version this crate reads and writes.
pub const LAYOUT_VERSION: u32 = 1;
/// Size of every layout-version-1 file: one page.
pub const FILE_SIZE: usize = 4096;
/// Size of the header (cache line 0).
pub const HEADER_SIZE: usize = 64;
/// Offset of the seqlock sequence word.
pub const SEQ_OFFSET: usize = 64;
/// Offset of the heartbeat word.
pub const HEARTBEAT_OFFSET: usize = 72;
/// Offset of the payload (cache line 2).
pub const PAYLOAD_OFFSET: usize = 128;
/// Size of the payload.
pub const PAYLOAD_SIZE: usize = SNAPSHOT_WORDS * 8;
/// Offset of the engine id line (cache line 4).
pub const ENGINE_ID_OFFSET: usize = 256;
/// Size of the engine id field, NUL padding included.
pub const ENGINE_ID_FIELD_SIZE: usize = 64;
/// Word index of `state` inside the header.
pub const STATE_WORD: usize = 3;

/// `state`: the writer is (or was last seen) publishing into this file.
pub const STATE_ACTIVE: u64 = 1;
/// `state`: the writer closed the file, or a new writer replaced it.
pub const STATE_RETIRED: u64 = 2;

/// Cache line 0 of the file, as plain data.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`LAYOUT_VERSION`].
    pub layout_version: u32,
    /// [`HEADER_SIZE`].
    pub header_size: u16,
    /// [`PAYLOAD_SIZE`].
    pub payload_size: u16,
    /// Process id of the writer, in its own pid namespace.
    pub writer_pid: u32,
    /// The writer's publish period, in microseconds.
    pub publish_period_us: u32,
    /// [`STATE_ACTIVE`] or [`STATE_RETIRED`].
    pub state: u64,
    /// Inode of the writer's `/proc/self/ns/pid`; 0 when unknown.
    pub writer_pid_ns: u64,
    /// `CLOCK_REALTIME` when the file was created, in ns since the epoch.
    pub created_unix_ns: u64,
    /// 1 for the first file of an engine id, previous + 1 for a replacement.
    pub generation: u64,
    /// Zero.
    pub reserved: u64,
}

const _: () = assert!(core::mem::size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(core::mem::offset_of!(Header, layout_version) == 8);
const _: () = assert!(core::mem::offset_of!(Header, header_size) == 12);
const _: () = assert!(core::mem::offset_of!(Header, payload_size) == 14);
const _: () = assert!(core::mem::offset_of!(Header, writer_pid) == 16);
const _: () = assert!(core::mem::offset_of!(Header, publish_period_us) == 20);
const _: () = assert!(core::mem::offset_of!(Header, state) == STATE_WORD * 8);
const _: () = assert!(core::mem::offset_of!(Header, writer_pid_ns) == 32);
const _: () = assert!(core::mem::offset_of!(Header, created_unix_ns) == 40);
const _: () = assert!(core::mem::offset_of!(Header, generation) == 48);
const _: () = assert!(SEQ_OFFSET == HEADER_SIZE && HEARTBEAT_OFFSET == SEQ_OFFSET + 8);
const _: () = assert!(PAYLOAD_OFFSET % 64 == 0 && PAYLOAD_OFFSET >= HEARTBEAT_OFFSET + 8);
const _: () = assert!(ENGINE_ID_OFFSET == PAYLOAD_OFFSET + PAYLOAD_SIZE);
const _: () = assert!(ENGINE_ID_OFFSET + ENGINE_ID_FIELD_SIZE <= FILE_SIZE);

impl Header {
    /// The header of a new layout-version-1 file.
    pub fn new(
        writer_pid: u32,
        writer_pid_ns: u64,
        publish_period_us: u32,
        created_unix_ns: u64,
        generation: u64,
    ) -> Header {
        Header {
            magic: MAGIC,
            layout_version: LAYOUT_VERSION,
            header_size: HEADER_SIZE as u16,
            payload_size: PAYLOAD_SIZE as u16,
            writer_pid,
            publish_period_us,
            state: STATE_ACTIVE,
            writer_pid_ns,
            created_unix_ns,
            generation,
            reserved: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_spells_engstate() {
        assert_eq!(&MAGIC.to_le_bytes(), b"ENGSTATE");
    }

    /// Pins the header bytes: any change here is a layout change and must bump
    /// [`LAYOUT_VERSION`].
    #[test]
    fn golden_header_bytes() {
        let header = Header::new(0x0102_0304, 0x1112_1314_1516_1718, 50_000, 0x2122, 3);
        let bytes: [u8; HEADER_SIZE] = bytemuck::cast(header);
        #[rustfmt::skip]
        let golden: [u8; HEADER_SIZE] = [
            b'E', b'N', b'G', b'S', b'T', b'A', b'T', b'E',   // magic
            1, 0, 0, 0,  64, 0,  128, 0,                      // version, header, payload size
            0x04, 0x03, 0x02, 0x01,  0x50, 0xc3, 0, 0,        // pid, period 50 000 us
            1, 0, 0, 0, 0, 0, 0, 0,                           // state ACTIVE
            0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,   // pid namespace
            0x22, 0x21, 0, 0, 0, 0, 0, 0,                     // created
            3, 0, 0, 0, 0, 0, 0, 0,                           // generation
            0, 0, 0, 0, 0, 0, 0, 0,                           // reserved
        ];
        assert_eq!(bytes, golden);
    }
}
