//! Fuzzing the file parser as a reader sees it: arbitrary bytes, and valid
//! files with bytes, header words, lengths and engine ids mutated, written to
//! disk and opened with [`ShmFile::open`] (size check, mapping, header and
//! engine-id validation). It must never panic, and must succeed exactly for
//! the files whose header validates (checked here byte by byte, independently
//! of the crate's own `Header` parsing); a file it accepts must read without
//! panicking.
//!
//! 256 cases per property in `cargo test`; `make fuzz` runs many more
//! (`PROPTEST_CASES`, read by proptest's default config).

// Under `--cfg loom` the crate has no files (only the protocol is built).
#![cfg(not(loom))]

#[path = "fuzz_support/scratch.rs"]
mod scratch;

use std::path::PathBuf;
use std::sync::OnceLock;

use engine_state_shm_format::layout::{
    ENGINE_ID_FIELD_SIZE, ENGINE_ID_OFFSET, HEADER_SIZE, MAGIC, PAYLOAD_SIZE, STATE_ACTIVE,
    STATE_RETIRED,
};
use engine_state_shm_format::{
    EngineId, ShmFile, ShmWriter, Snapshot, WriterOptions, FILE_SIZE, LAYOUT_VERSION,
};
use proptest::prelude::*;
use scratch::SCRATCH;

/// The name every fuzzed file is opened under (and the id of the valid file).
const NAME: &str = "fuzzed-engine";

/// The bytes of a valid file of engine [`NAME`], made by the real writer.
fn valid() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let first = Snapshot {
            num_running: 3,
            step: 9,
            ..Snapshot::default()
        };
        let id = EngineId::new(NAME).unwrap();
        let _writer =
            ShmWriter::create(dir.path(), &id, &WriterOptions::default(), &first).unwrap();
        std::fs::read(dir.path().join(NAME)).unwrap()
    })
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap())
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// Whether `bytes` are a file a reader must accept under the name [`NAME`]:
/// the layout of `shm-format/src/layout.rs` read from raw bytes.
fn header_validates(bytes: &[u8]) -> bool {
    if bytes.len() != FILE_SIZE {
        return false;
    }
    let id_field = &bytes[ENGINE_ID_OFFSET..ENGINE_ID_OFFSET + ENGINE_ID_FIELD_SIZE];
    let id_len = id_field
        .iter()
        .position(|b| *b == 0)
        .unwrap_or(id_field.len());
    u64_at(bytes, 0) == MAGIC
        && u32_at(bytes, 8) == LAYOUT_VERSION
        && usize::from(u16_at(bytes, 12)) == HEADER_SIZE
        && usize::from(u16_at(bytes, 14)) == PAYLOAD_SIZE
        && [STATE_ACTIVE, STATE_RETIRED].contains(&u64_at(bytes, 24))
        && &id_field[..id_len] == NAME.as_bytes()
}

/// Writes `bytes` as the file [`NAME`] and opens it as a reader does.
fn open_as_reader(bytes: &[u8]) -> (PathBuf, Result<ShmFile, engine_state_shm_format::Error>) {
    let path = SCRATCH.with(|dir| dir.path().join(NAME));
    std::fs::write(&path, bytes).unwrap();
    let opened = ShmFile::open(&path);
    (path, opened)
}

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (path, opened) = open_as_reader(bytes);
    let expected = header_validates(bytes);
    match opened {
        Ok(file) => {
            prop_assert!(expected, "accepted a file whose header does not validate");
            prop_assert_eq!(file.engine_id().as_str(), NAME);
            prop_assert_eq!(file.path(), path.as_path());
            // Whatever the payload holds, reading it never panics.
            let _ = file.read();
            let _ = (file.seq(), file.heartbeat_mono_ns(), file.is_retired());
            let _ = (file.generation(), file.header(), file.is_truncated());
        }
        Err(error) => {
            prop_assert!(!expected, "refused a valid file: {}", error);
            // Every refusal names the file and says what to do.
            prop_assert!(error.to_string().contains(NAME), "{}", error);
        }
    }
    Ok(())
}

/// Values that hit the edges of the header checks.
fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(2),
        Just(3),
        Just(u64::MAX),
        Just(MAGIC),
        Just(u64::from(LAYOUT_VERSION) + 1),
        Just((PAYLOAD_SIZE as u64) << 16 | HEADER_SIZE as u64),
        any::<u64>(),
    ]
}

proptest! {
    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..=FILE_SIZE + 64)) {
        check(&bytes)?;
    }

    #[test]
    fn arbitrary_page_behind_a_valid_header(tail in prop::collection::vec(any::<u8>(), FILE_SIZE - HEADER_SIZE)) {
        let mut bytes = valid()[..HEADER_SIZE].to_vec();
        bytes.extend_from_slice(&tail);
        check(&bytes)?;
    }

    #[test]
    fn valid_file_with_header_or_id_bytes_changed(
        edits in prop::collection::vec((0..ENGINE_ID_OFFSET + ENGINE_ID_FIELD_SIZE, any::<u8>()), 1..8),
    ) {
        let mut bytes = valid().to_vec();
        for (at, byte) in edits {
            bytes[at] = byte;
        }
        check(&bytes)?;
    }

    #[test]
    fn valid_file_with_a_header_word_replaced(word in 0..HEADER_SIZE / 8, value in interesting_u64()) {
        let mut bytes = valid().to_vec();
        bytes[word * 8..word * 8 + 8].copy_from_slice(&value.to_le_bytes());
        check(&bytes)?;
    }

    #[test]
    fn valid_file_with_another_engine_id(id in prop::collection::vec(any::<u8>(), 0..=ENGINE_ID_FIELD_SIZE)) {
        let mut bytes = valid().to_vec();
        let field = &mut bytes[ENGINE_ID_OFFSET..ENGINE_ID_OFFSET + ENGINE_ID_FIELD_SIZE];
        field.fill(0);
        field[..id.len()].copy_from_slice(&id);
        check(&bytes)?;
    }

    #[test]
    fn valid_file_cut_or_extended(len in 0..=2 * FILE_SIZE) {
        let mut bytes = valid().to_vec();
        bytes.resize(len, 0);
        check(&bytes)?;
    }
}

#[test]
fn the_valid_file_validates() {
    assert!(header_validates(valid()));
    check(valid()).unwrap();
}
