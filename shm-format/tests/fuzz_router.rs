//! Fuzzing a router replica's reservations file as peers read it
//! (docs/FORMAT.md, "Shared reservations"): arbitrary bytes, and a valid
//! file with bytes and its length mutated, written to disk and opened and
//! read with [`RouterFile`]; and arbitrary slot lists decoded with
//! [`decode_reservation_slots`]. None may panic, and each must succeed
//! exactly for the inputs the rules accept (checked here from raw bytes,
//! independently of the crate's own parsing).
//!
//! 256 cases per property in `cargo test`; `make fuzz` runs many more
//! (`PROPTEST_CASES`, read by proptest's default config).

// Under `--cfg loom` the crate has no files (only the protocol is built).
#![cfg(not(loom))]

#[path = "fuzz_support/scratch.rs"]
mod scratch;
#[path = "fuzz_support/words.rs"]
mod words;

use std::collections::HashSet;
use std::sync::OnceLock;

use engine_state_shm_format::{
    decode_reservation_slots, EngineId, Reservations, RouterFile, RouterFileWriter,
    RouterWriterOptions,
};
use proptest::prelude::*;
use scratch::SCRATCH;
use words::{u16_at, u32_at, u64_at};

const NAME: &str = "fuzzed-router";

/// A valid file of three engines, made by the real writer.
fn valid_file() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let state = tempfile::tempdir().unwrap();
        let id = EngineId::new(NAME).unwrap();
        let mut writer =
            RouterFileWriter::create(state.path(), &id, &RouterWriterOptions::default()).unwrap();
        for (n, engine) in ["e-0", "engine.1", "E_2"].into_iter().enumerate() {
            let counters = Reservations::from_words([n as u64 + 1; 6]);
            writer.set(engine, &counters).unwrap();
        }
        std::fs::read(writer.path()).unwrap()
    })
}

/// An engine (or replica) id by the rules, from its NUL-padded field; the
/// bytes after the first NUL must be NUL when `strict` (a slot's field).
fn field_id(field: &[u8], strict: bool) -> Option<&str> {
    let len = field.iter().position(|b| *b == 0)?;
    if strict && field[len..].iter().any(|b| *b != 0) {
        return None;
    }
    let id = &field[..len];
    let valid = !id.is_empty()
        && id[0] != b'.'
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    valid.then(|| std::str::from_utf8(id).unwrap())
}

/// Whether `slots` (whole slots) are live slots by the rules.
fn slots_accepted(slots: &[u8]) -> bool {
    let mut seen = HashSet::new();
    slots.chunks(128).all(|slot| {
        slot.len() == 128
            && slot[112..].iter().all(|b| *b == 0)
            && field_id(&slot[..64], true).is_some_and(|id| seen.insert(id.to_owned()))
    })
}

/// Whether a reader must accept this file named [`NAME`] (validation steps
/// 1–9; nobody writes it meanwhile, so an odd sequence stays torn).
fn file_accepted(b: &[u8]) -> bool {
    if b.len() < 64 || b[..8] != *b"ESROUTER" || u32_at(b, 8) != 1 {
        return false;
    }
    let capacity = u32_at(b, 56);
    let header = u16_at(b, 12) == 64
        && u16_at(b, 14) == 128
        && matches!(u64_at(b, 24), 1 | 2)
        && capacity <= 256
        && b.len() as u64 == 192 + 128 * capacity;
    if !header {
        return false;
    }
    let (seq, count) = (u64_at(b, 64), u64_at(b, 80));
    field_id(&b[128..192], false) == Some(NAME)
        && seq != 0
        && seq % 2 == 0
        && count <= capacity
        && slots_accepted(&b[192..192 + 128 * count as usize])
}

fn read(bytes: &[u8]) -> bool {
    SCRATCH.with(|dir| {
        let path = dir.path().join(NAME);
        std::fs::write(&path, bytes).unwrap();
        RouterFile::open(&path)
            .and_then(|file| {
                file.read()
                    .map_err(|error| engine_state_shm_format::Error::Router {
                        path: path.clone(),
                        error,
                    })
            })
            .is_ok()
    })
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        prop_assert_eq!(read(&bytes), file_accepted(&bytes));
    }

    #[test]
    fn a_mutated_file_is_read_exactly_when_the_rules_accept_it(
        mutations in proptest::collection::vec((0usize..192 + 4 * 128, any::<u8>()), 1..4),
        cut in proptest::option::of(0usize..33_000),
    ) {
        let mut bytes = valid_file().to_vec();
        prop_assert!(file_accepted(&bytes));
        for (at, value) in mutations {
            bytes[at] = value;
        }
        if let Some(len) = cut {
            bytes.resize(len, 0);
        }
        prop_assert_eq!(read(&bytes), file_accepted(&bytes));
    }

    #[test]
    fn slot_lists_decode_exactly_when_the_rules_accept_them(
        ids in proptest::collection::vec("[a-c.]{0,3}", 0..5),
        flips in proptest::collection::vec((0usize..5 * 128, any::<u8>()), 0..2),
    ) {
        let mut slots: Vec<u8> = ids
            .iter()
            .flat_map(|id| {
                let mut slot = [0u8; 128];
                slot[..id.len()].copy_from_slice(id.as_bytes());
                slot
            })
            .collect();
        for (at, value) in flips {
            if at < slots.len() {
                slots[at] = value;
            }
        }
        let decoded = decode_reservation_slots(&slots);
        prop_assert_eq!(decoded.is_ok(), slots_accepted(&slots), "{:?}", decoded);
    }
}
