//! Fuzzing the cache digest's parsers as readers see them (docs/FORMAT.md,
//! "Cache residency"): arbitrary bytes, and valid digests with bytes,
//! header and control words and lengths mutated, decoded as a Redis value
//! ([`decode_digest_value`]) and written to disk and opened and read as a
//! file ([`DigestFile`]). Neither may panic, and each must succeed exactly
//! for the inputs the rules accept (checked here from raw bytes,
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

use std::sync::OnceLock;

use engine_state_shm_format::{
    decode_digest_value, encode_digest_value, CacheDigest, DigestFile, DigestOptions, DigestRecord,
    DigestWriter, EngineId, MAX_DIGEST_ENTRIES,
};
use proptest::prelude::*;
use scratch::SCRATCH;
use words::{u16_at, u32_at, u64_at};

const NAME: &str = "fuzzed-engine";

fn digest() -> CacheDigest {
    CacheDigest::new(4, 99, vec![3, 1 << 40, 7, u64::MAX - 1, 12])
}

/// A valid Redis value (5 entries).
fn valid_value() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        encode_digest_value(&DigestRecord {
            writer_pid: 17,
            generation: 3,
            created_unix_ns: 5,
            kv_block_size: 16,
            captured_unix_ns: 6,
            held: 9,
            digest: digest(),
        })
        .unwrap()
    })
}

/// A valid digest file (capacity 8, 5 entries), made by the real writer.
fn valid_file() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let state = tempfile::tempdir().unwrap();
        let options = DigestOptions {
            capacity: 8,
            generation: 3,
            ..DigestOptions::default()
        };
        let id = EngineId::new(NAME).unwrap();
        let writer = DigestWriter::create(state.path(), &id, &options, &digest(), 9, 6).unwrap();
        std::fs::read(writer.path()).unwrap()
    })
}

/// Whether the rules accept `b` (a value when `value`, else a file whose
/// sequence is even and nonzero): FORMAT.md's validation steps from raw bytes.
fn accepted(b: &[u8], value: bool) -> bool {
    if b.len() < 128 || &b[..8] != b"ESDIGEST" || u32_at(b, 8) != 1 {
        return false;
    }
    let capacity = u32_at(b, 20);
    let state = u64_at(b, 24);
    let header = u16_at(b, 12) == 128
        && u16_at(b, 14) == 8
        && u32_at(b, 52) == 512
        && (state == 1 || state == 2)
        && capacity <= MAX_DIGEST_ENTRIES as u64
        && b.len() as u64 == 128 + 8 * capacity;
    if !header {
        return false;
    }
    let (version, count, held) = (u64_at(b, 72), u64_at(b, 96), u64_at(b, 104));
    let seq = u64_at(b, 64);
    let control = version != 0 && count <= capacity && held >= count;
    let value_rules = !value || (state == 1 && count == capacity);
    let file_rules = value || (seq % 2 == 0 && seq != 0);
    if !(control && value_rules && file_rules) {
        return false;
    }
    let entries: Vec<u64> = (0..count as usize)
        .map(|i| u64_at(b, 128 + 8 * i))
        .collect();
    entries.windows(2).all(|w| w[0] < w[1])
}

fn check_value(bytes: &[u8]) -> Result<(), TestCaseError> {
    let expected = accepted(bytes, true);
    match decode_digest_value(bytes) {
        Ok(record) => {
            prop_assert!(expected, "accepted a value the rules refuse");
            prop_assert_eq!(record.digest.len() as u64, u64_at(bytes, 96));
            // What it accepts encodes back to the same bytes, but for the
            // words a reader ignores: `seq` and the reserved words (a
            // future version may give them a meaning, FORMAT.md).
            let mut meaningful = bytes.to_vec();
            for range in [56..64, 64..72, 112..128] {
                meaningful[range].fill(0);
            }
            prop_assert_eq!(encode_digest_value(&record).unwrap(), meaningful);
        }
        Err(error) => {
            prop_assert!(!expected, "refused a valid value: {}", error);
            prop_assert!(
                error.to_string().contains("; "),
                "says what to do: {}",
                error
            );
        }
    }
    Ok(())
}

fn check_file(bytes: &[u8]) -> Result<(), TestCaseError> {
    let path = SCRATCH.with(|dir| dir.path().join(NAME));
    std::fs::write(&path, bytes).unwrap();
    let expected = accepted(bytes, false);
    let read = DigestFile::open(&path).map(|file| (file.read(), file.capacity()));
    match read {
        Ok((Ok(digest), capacity)) => {
            prop_assert!(expected, "accepted a file the rules refuse");
            prop_assert_eq!(digest.len() as u64, u64_at(bytes, 96));
            prop_assert_eq!(capacity as u64, u32_at(bytes, 20));
        }
        Ok((Err(error), _)) => prop_assert!(!expected, "refused a valid file: {}", error),
        Err(error) => {
            prop_assert!(!expected, "refused a valid file: {}", error);
            prop_assert!(error.to_string().contains(NAME), "{}", error);
        }
    }
    Ok(())
}

/// Values at the edges of the checks.
fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(2),
        Just(3),
        Just(5),
        Just(8),
        Just(u64::MAX),
        Just(MAX_DIGEST_ENTRIES as u64 + 1),
        any::<u64>(),
    ]
}

fn mutated(valid: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    let len = valid.len();
    (
        prop::collection::vec((0..len / 8, interesting_u64()), 0..4),
        prop::collection::vec((0..len, any::<u8>()), 0..4),
        prop_oneof![Just(len), 0..len + 16],
    )
        .prop_map(move |(words, bytes, new_len)| {
            let mut out = valid.to_vec();
            for (word, value) in words {
                out[8 * word..8 * word + 8].copy_from_slice(&value.to_le_bytes());
            }
            for (at, value) in bytes {
                out[at] = value;
            }
            out.resize(new_len, 0);
            out
        })
}

proptest! {
    #[test]
    fn arbitrary_bytes_as_a_value(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        check_value(&bytes)?;
    }

    #[test]
    fn arbitrary_bytes_as_a_file(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        check_file(&bytes)?;
    }

    #[test]
    fn mutated_values(bytes in mutated(valid_value())) {
        check_value(&bytes)?;
    }

    #[test]
    fn mutated_files(bytes in mutated(valid_file())) {
        check_file(&bytes)?;
    }
}

#[test]
fn the_valid_inputs_are_accepted() {
    assert!(accepted(valid_value(), true));
    assert!(accepted(valid_file(), false));
    check_value(valid_value()).unwrap();
    check_file(valid_file()).unwrap();
}
