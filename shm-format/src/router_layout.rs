//! A router replica's reservations file, router layout version 1
//! (docs/FORMAT.md, "Shared reservations", whose table a test checks
//! against these constants): one file per replica in [`routers_dir`],
//! named after the replica id.
//!
//! ```text
//! offset  size  cache line 0: header (immutable after creation but `state`)
//!      0     8  magic                 b"ESROUTER"
//!      8     4  layout_version        1 (the router file's own version)
//!     12     2  header_size           64
//!     14     2  slot_size             128
//!     16     4  writer_pid
//!     20     4  heartbeat_period_us
//!     24     8  state                 1 ACTIVE, 2 RETIRED (atomic u64)
//!     32     8  writer_pid_ns         inode of the writer's /proc/self/ns/pid (0: unknown)
//!     40     8  created_unix_ns
//!     48     8  generation            previous file's generation + 1 (1 for the first)
//!     56     4  capacity              slots in the file (at most MAX_ROUTER_ENGINES)
//!     60     4  reserved
//!               cache line 1: seqlock and control words
//!     64     8  seq                   over count, changed_mono_ns and the slots
//!     72     8  heartbeat_mono_ns     stamped every period (atomic u64, outside the seqlock)
//!     80     8  count                 live slots: [0, count)
//!     88     8  changed_mono_ns       CLOCK_MONOTONIC of the last change
//!     96    32  zero
//!               cache line 2: identity (immutable)
//!    128    64  replica id            UTF-8, NUL padded (at most 63 bytes)
//!    192  128 × capacity  slots       engine id (64), six counters (48), zero (16)
//! ```
//!
//! `writer_pid`, `state`, `writer_pid_ns` and `generation` sit where they
//! sit in an engine file, so creation, replacement and liveness checks are
//! the engine file's.

use std::path::{Path, PathBuf};

use bytemuck::{Pod, Zeroable};

use crate::error::RouterError;
use crate::layout::{ENGINE_ID_FIELD_SIZE, STATE_ACTIVE, STATE_RETIRED};
use crate::reservations::RESERVATION_SLOT_SIZE;

/// First word of every router reservations file: the bytes `ESROUTER`.
pub const ROUTER_MAGIC: u64 = u64::from_le_bytes(*b"ESROUTER");
/// The router layout version this crate reads and writes (the file's own,
/// independent of the engine file's [`LAYOUT_VERSION`](crate::LAYOUT_VERSION)).
pub const ROUTER_LAYOUT_VERSION: u32 = 1;
/// Size of the fixed header (cache line 0), as [`RouterHeader`].
pub const ROUTER_HEADER_SIZE: usize = 64;
/// Word index of `state` inside the header.
pub const ROUTER_STATE_WORD: usize = 3;
/// Offset of the seqlock sequence word.
pub const ROUTER_SEQ_OFFSET: usize = 64;
/// Offset of the heartbeat word.
pub const ROUTER_HEARTBEAT_OFFSET: usize = 72;
/// Offset of `count`.
pub const ROUTER_COUNT_OFFSET: usize = 80;
/// Offset of `changed_mono_ns`.
pub const ROUTER_CHANGED_OFFSET: usize = 88;
/// Offset of the replica id (cache line 2).
pub const REPLICA_ID_OFFSET: usize = 128;
/// Size of the replica id field, NUL padding included.
pub const REPLICA_ID_FIELD_SIZE: usize = ENGINE_ID_FIELD_SIZE;
/// Offset of the first slot.
pub const ROUTER_SLOTS_OFFSET: usize = 192;
/// The most engines one replica's file holds (its writer's capacity); a
/// reader refuses files claiming more.
pub const MAX_ROUTER_ENGINES: usize = 256;
/// Size of a file with [`MAX_ROUTER_ENGINES`] slots: what a writer creates.
pub const ROUTER_FILE_SIZE: usize = router_file_size(MAX_ROUTER_ENGINES);
/// What the routers directory's name adds to the state directory's.
pub const ROUTERS_DIR_SUFFIX: &str = ".routers";

const _: () = assert!(ROUTER_SEQ_OFFSET == ROUTER_HEADER_SIZE);
const _: () = assert!(ROUTER_HEARTBEAT_OFFSET == ROUTER_SEQ_OFFSET + 8);
const _: () = assert!(ROUTER_COUNT_OFFSET == ROUTER_HEARTBEAT_OFFSET + 8);
const _: () = assert!(ROUTER_CHANGED_OFFSET == ROUTER_COUNT_OFFSET + 8);
const _: () = assert!(REPLICA_ID_OFFSET == ROUTER_SEQ_OFFSET + 64);
const _: () = assert!(ROUTER_SLOTS_OFFSET == REPLICA_ID_OFFSET + REPLICA_ID_FIELD_SIZE);
const _: () = assert!(ROUTER_SLOTS_OFFSET % 64 == 0 && RESERVATION_SLOT_SIZE % 64 == 0);
const _: () = assert!(ROUTER_FILE_SIZE == 32_960);

/// Size in bytes of a router file of `capacity` slots.
pub const fn router_file_size(capacity: usize) -> usize {
    ROUTER_SLOTS_OFFSET + RESERVATION_SLOT_SIZE * capacity
}

/// Offset of slot `index`.
pub const fn router_slot_offset(index: usize) -> usize {
    ROUTER_SLOTS_OFFSET + RESERVATION_SLOT_SIZE * index
}

/// Cache line 0 of a router file, as plain data.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct RouterHeader {
    /// [`ROUTER_MAGIC`].
    pub magic: u64,
    /// [`ROUTER_LAYOUT_VERSION`].
    pub layout_version: u32,
    /// [`ROUTER_HEADER_SIZE`].
    pub header_size: u16,
    /// [`RESERVATION_SLOT_SIZE`].
    pub slot_size: u16,
    /// Process id of the writer, in its own pid namespace.
    pub writer_pid: u32,
    /// The writer's heartbeat period, in microseconds.
    pub heartbeat_period_us: u32,
    /// [`STATE_ACTIVE`] or [`STATE_RETIRED`].
    pub state: u64,
    /// Inode of the writer's `/proc/self/ns/pid`; 0 when unknown.
    pub writer_pid_ns: u64,
    /// `CLOCK_REALTIME` when the file was created, in ns since the epoch.
    pub created_unix_ns: u64,
    /// 1 for the first file of a replica id, previous + 1 for a replacement.
    pub generation: u64,
    /// Slots in the file.
    pub capacity: u32,
    /// Zero (not validated).
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<RouterHeader>() == ROUTER_HEADER_SIZE);
const _: () = assert!(core::mem::offset_of!(RouterHeader, layout_version) == 8);
const _: () = assert!(core::mem::offset_of!(RouterHeader, header_size) == 12);
const _: () = assert!(core::mem::offset_of!(RouterHeader, slot_size) == 14);
const _: () = assert!(core::mem::offset_of!(RouterHeader, writer_pid) == 16);
const _: () = assert!(core::mem::offset_of!(RouterHeader, heartbeat_period_us) == 20);
const _: () = assert!(core::mem::offset_of!(RouterHeader, state) == ROUTER_STATE_WORD * 8);
const _: () = assert!(core::mem::offset_of!(RouterHeader, writer_pid_ns) == 32);
const _: () = assert!(core::mem::offset_of!(RouterHeader, created_unix_ns) == 40);
const _: () = assert!(core::mem::offset_of!(RouterHeader, generation) == 48);
const _: () = assert!(core::mem::offset_of!(RouterHeader, capacity) == 56);
const _: () = assert!(core::mem::offset_of!(RouterHeader, reserved) == 60);
// The words creation and liveness share with the engine file's header.
const _: () = assert!(ROUTER_STATE_WORD == crate::layout::STATE_WORD);
const _: () = assert!(
    core::mem::offset_of!(RouterHeader, writer_pid)
        == core::mem::offset_of!(crate::layout::Header, writer_pid)
);
const _: () = assert!(
    core::mem::offset_of!(RouterHeader, writer_pid_ns)
        == core::mem::offset_of!(crate::layout::Header, writer_pid_ns)
);
const _: () = assert!(
    core::mem::offset_of!(RouterHeader, generation)
        == core::mem::offset_of!(crate::layout::Header, generation)
);

impl RouterHeader {
    /// The header of a new router file of `capacity` slots (ACTIVE).
    pub fn new(
        writer_pid: u32,
        writer_pid_ns: u64,
        heartbeat_period_us: u32,
        created_unix_ns: u64,
        generation: u64,
        capacity: u32,
    ) -> RouterHeader {
        RouterHeader {
            magic: ROUTER_MAGIC,
            layout_version: ROUTER_LAYOUT_VERSION,
            header_size: ROUTER_HEADER_SIZE as u16,
            slot_size: RESERVATION_SLOT_SIZE as u16,
            writer_pid,
            heartbeat_period_us,
            state: STATE_ACTIVE,
            writer_pid_ns,
            created_unix_ns,
            generation,
            capacity,
            reserved: 0,
        }
    }

    /// The header from its first 64 bytes (little-endian).
    pub fn from_le_bytes(bytes: &[u8; ROUTER_HEADER_SIZE]) -> RouterHeader {
        bytemuck::pod_read_unaligned(bytes)
    }

    /// The header's 64 bytes (little-endian).
    pub fn to_le_bytes(&self) -> [u8; ROUTER_HEADER_SIZE] {
        bytemuck::cast(*self)
    }

    /// Validation (docs/FORMAT.md, "Shared reservations"): magic first,
    /// then version (they decide which error a foreign or future file
    /// gets), sizes, state, capacity bound. `reserved` is not validated (a
    /// later version may give it a meaning).
    pub(crate) fn check(&self) -> Result<(), RouterError> {
        if self.magic != ROUTER_MAGIC {
            return Err(RouterError::NotRouter);
        }
        if self.layout_version != ROUTER_LAYOUT_VERSION {
            return Err(RouterError::UnknownVersion {
                found: self.layout_version,
            });
        }
        if usize::from(self.header_size) != ROUTER_HEADER_SIZE
            || usize::from(self.slot_size) != RESERVATION_SLOT_SIZE
        {
            return Err(RouterError::corrupt(format!(
                "header/slot size {}/{}, expected {ROUTER_HEADER_SIZE}/{RESERVATION_SLOT_SIZE}",
                self.header_size, self.slot_size
            )));
        }
        if self.state != STATE_ACTIVE && self.state != STATE_RETIRED {
            return Err(RouterError::corrupt(format!("state {}", self.state)));
        }
        if self.capacity as usize > MAX_ROUTER_ENGINES {
            return Err(RouterError::corrupt(format!(
                "capacity {} is above the limit of {MAX_ROUTER_ENGINES} engines",
                self.capacity
            )));
        }
        Ok(())
    }
}

/// The directory of the reservations of the router replicas sharing the
/// engines publishing into `state_dir`: its path with
/// [`ROUTERS_DIR_SUFFIX`] appended (`/dev/shm/agentic_engine_state` →
/// `/dev/shm/agentic_engine_state.routers`). A sibling, never inside
/// `state_dir`, where an engine reader would take a replica's file for an
/// engine's. Trailing slashes of `state_dir` are dropped first.
pub fn routers_dir(state_dir: &Path) -> PathBuf {
    crate::digest_layout::sibling_dir(state_dir, ROUTERS_DIR_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_spells_esrouter() {
        assert_eq!(&ROUTER_MAGIC.to_le_bytes(), b"ESROUTER");
    }

    /// Pins the header bytes: any change here is a layout change and must
    /// bump [`ROUTER_LAYOUT_VERSION`].
    #[test]
    fn golden_header_bytes() {
        let header = RouterHeader::new(0x0102_0304, 0x1112_1314_1516_1718, 50_000, 0x2122, 3, 256);
        #[rustfmt::skip]
        let golden: [u8; ROUTER_HEADER_SIZE] = [
            b'E', b'S', b'R', b'O', b'U', b'T', b'E', b'R',   // magic
            1, 0, 0, 0,  64, 0,  128, 0,                      // version, header, slot size
            0x04, 0x03, 0x02, 0x01,  0x50, 0xc3, 0, 0,        // pid, heartbeat 50 000 us
            1, 0, 0, 0, 0, 0, 0, 0,                           // state ACTIVE
            0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,   // pid namespace
            0x22, 0x21, 0, 0, 0, 0, 0, 0,                     // created
            3, 0, 0, 0, 0, 0, 0, 0,                           // generation
            0, 1, 0, 0,  0, 0, 0, 0,                          // capacity 256, reserved
        ];
        assert_eq!(header.to_le_bytes(), golden);
        assert_eq!(RouterHeader::from_le_bytes(&golden), header);
        assert_eq!(header.check(), Ok(()));
    }

    #[test]
    fn header_checks_name_what_is_wrong() {
        let good = RouterHeader::new(1, 0, 50_000, 0, 1, 256);
        type Damage = fn(&mut RouterHeader);
        let cases: [(Damage, &str); 5] = [
            (|h| h.magic = crate::layout::MAGIC, "not_router"),
            (|h| h.layout_version = 2, "unknown_version"),
            (|h| h.slot_size = 64, "corrupt_router"),
            (|h| h.state = 0, "corrupt_router"),
            (|h| h.capacity = 257, "corrupt_router"),
        ];
        for (damage, kind) in cases {
            let mut header = good;
            damage(&mut header);
            assert_eq!(header.check().unwrap_err().kind(), kind, "{header:?}");
        }
        let err = RouterHeader {
            layout_version: 2,
            ..good
        }
        .check()
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("version 2") && err.contains("reads version 1"),
            "{err}"
        );
    }

    #[test]
    fn routers_dir_is_a_sibling() {
        for (dir, expected) in [
            (
                "/dev/shm/agentic_engine_state",
                "/dev/shm/agentic_engine_state.routers",
            ),
            (
                "/dev/shm/agentic_engine_state/",
                "/dev/shm/agentic_engine_state.routers",
            ),
            ("relative/dir", "relative/dir.routers"),
        ] {
            assert_eq!(
                routers_dir(Path::new(dir)),
                PathBuf::from(expected),
                "{dir}"
            );
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(router_file_size(0), 192);
        assert_eq!(ROUTER_FILE_SIZE, 192 + 256 * 128);
    }
}
