//! Layout version 1 of engine-state: the fixed-layout engine [`Snapshot`], the
//! seqlock protocol that publishes it, and the shared-memory file it lives in.
//!
//! This crate owns the bytes and the rules that fill them (the request sums),
//! nothing else (no discovery, no staleness policy, no environment): the `engine-state-reader` crate builds on it.
//!
//! - [`Snapshot`]: sixteen `u64` words; its field list is written once
//!   ([`snapshot_fields!`]), and the request sums into it (remaining prefill,
//!   [`Snapshot::add_running`], [`Snapshot::add_waiting`], the idle flag) once.
//! - [`ShmWriter`]: the single writer of one engine's file; atomic creation,
//!   `flock` against a second writer, seqlock publish, [`Heartbeat`] handle for
//!   a timer thread, retirement.
//! - [`ShmFile`]: a reader's read-only mapping, validated at open; lock-free
//!   [`ShmFile::read`]. Opening never blocks or follows a link, and a file
//!   truncated under the mapping reads [`Torn`] instead of killing the
//!   process with `SIGBUS` (module `sigbus`).
//! - [`seqlock`]: the protocol itself over atomic words (checked with loom and
//!   Miri).
//! - [`heartbeat`]: the heartbeat policy (how often a writer stamps, when a
//!   reader or relay considers a stamp late), the one place its numbers live.
//! - [`layout`]: every offset, pinned by compile-time asserts and a
//!   golden-bytes test.
//! - Cache residency (docs/FORMAT.md, "Cache residency"): the in-memory
//!   [`CacheDigest`]; its bytes ([`digest_layout`]); its file in
//!   [`cache_dir`], written by a [`DigestWriter`] and read through a
//!   [`DigestFile`]; its Redis value ([`encode_digest_value`],
//!   [`decode_digest_value`]); its capacity ([`default_cache_capacity`])
//!   and overflow rule ([`cut_prefix_closed`]).
//! - Shared reservations (docs/FORMAT.md, "Shared reservations"): a router
//!   replica's [`Reservations`] per engine, in its 128-byte slot
//!   ([`encode_reservation_slot`], [`decode_reservation_slot`], shared with
//!   the Redis value); its file in [`routers_dir`] ([`router_layout`]),
//!   written by a [`RouterFileWriter`] and read through a [`RouterFile`].
//!
//! ```
//! use engine_state_shm_format::{EngineId, ShmFile, ShmWriter, Snapshot, WriterOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let id = EngineId::new("engine-0")?;
//! let mut writer = ShmWriter::create(dir.path(), &id, &WriterOptions::default(), &Snapshot::default())?;
//! writer.publish(&Snapshot { num_running: 3, num_waiting: 1, ..Snapshot::default() })?;
//!
//! let reader = ShmFile::open(dir.path().join("engine-0"))?;
//! let (snapshot, _seq) = reader.read().expect("no writer is mid-write");
//! assert_eq!(snapshot.num_running, 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(not(target_endian = "little"))]
compile_error!(
    "engine-state layout version 1 stores little-endian words; big-endian hosts are not supported"
);

mod aggregate;
pub mod blocks;
mod clock;
mod digest;
mod digest_capacity;
#[cfg(not(loom))]
mod digest_file;
pub mod digest_layout;
mod digest_value;
#[cfg(not(loom))]
mod digest_writer;
mod engine_id;
mod error;
mod fork;
pub mod heartbeat;
pub mod layout;
// Under `--cfg loom` only the protocol is built: loom's atomics cannot live in
// a mapping, and the model checks `seqlock` alone.
#[cfg(not(loom))]
mod mapping;
mod reservations;
#[cfg(not(loom))]
mod router_file;
pub mod router_layout;
#[cfg(not(loom))]
mod router_writer;
pub mod seqlock;
#[cfg(not(loom))]
mod shm_file;
#[cfg(not(loom))]
mod sigbus;
mod snapshot;
#[cfg(not(loom))]
mod writer;

pub use crate::aggregate::{RequestTokens, WaitingRequest};
pub use crate::clock::{monotonic_ns, pid_namespace, unix_ns, Clock};
pub use crate::digest::CacheDigest;
pub use crate::digest_capacity::{cut_prefix_closed, default_cache_capacity, DigestEntry};
#[cfg(not(loom))]
pub use crate::digest_file::DigestFile;
pub use crate::digest_layout::{
    cache_dir, digest_size, DigestHeader, DIGEST_HEADER_SIZE, DIGEST_LAYOUT_VERSION,
    MAX_DIGEST_ENTRIES, MAX_DIGEST_SIZE,
};
pub use crate::digest_value::{decode_digest_value, encode_digest_value, DigestRecord};
#[cfg(not(loom))]
pub use crate::digest_writer::{DigestOptions, DigestWriter};
pub use crate::engine_id::{EngineId, MAX_ENGINE_ID_LEN};
pub use crate::error::{DigestError, Error, RouterError};
pub use crate::fork::fork_generation;
pub use crate::layout::{Header, FILE_SIZE, LAYOUT_VERSION};
pub use crate::reservations::{
    decode_reservation_slot, decode_reservation_slots, decode_reservation_slots_into,
    encode_reservation_slot, Reservations, RESERVATION_SLOT_SIZE, RESERVATION_WORDS,
    SLOT_COUNTERS_OFFSET, SLOT_PADDING_OFFSET,
};
#[cfg(not(loom))]
pub use crate::router_file::{RouterFile, RouterRecord};
pub use crate::router_layout::{
    router_file_size, routers_dir, RouterHeader, MAX_ROUTER_ENGINES, ROUTERS_DIR_SUFFIX,
    ROUTER_FILE_SIZE, ROUTER_LAYOUT_VERSION,
};
#[cfg(not(loom))]
pub use crate::router_writer::{RouterFileWriter, RouterHeartbeat, RouterWriterOptions};
pub use crate::seqlock::Torn;
#[cfg(not(loom))]
pub use crate::shm_file::ShmFile;
pub use crate::snapshot::{Snapshot, FIELD_COUNT, FLAG_IDLE, FLAG_SHUTTING_DOWN, SNAPSHOT_WORDS};
#[cfg(not(loom))]
pub use crate::writer::{Heartbeat, ShmWriter, WriterOptions, WrongProcess, DEFAULT_FILE_MODE};

#[cfg(all(test, not(loom)))]
mod digest_hostile_tests;
#[cfg(all(test, not(loom)))]
mod digest_tests;
#[cfg(all(test, not(loom)))]
mod file_tests;
#[cfg(all(test, not(loom)))]
mod hostile_tests;
#[cfg(all(test, not(loom)))]
mod router_tests;
