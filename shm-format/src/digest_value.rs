//! A cache digest as one value (docs/FORMAT.md, "Cache residency"): the
//! record a digest file's reader returns, and the bytes of the Redis value
//! `<prefix>cache:<id>`, which are the file's 128 bytes of header and
//! control words (`seq` 0, `capacity` = `count`) followed by `count`
//! entries.

use crate::digest::CacheDigest;
use crate::digest_layout::*;
use crate::error::DigestError;
use crate::layout::STATE_ACTIVE;

/// One digest with what its header and control words say about it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DigestRecord {
    /// The writer's pid, in its own pid namespace.
    pub writer_pid: u32,
    /// The generation of the engine file (Redis record) it belongs to: a
    /// reader uses the digest only when it equals the engine's.
    pub generation: u64,
    /// When the file was created (a Redis value: when its writer's digest
    /// started), ns since the epoch.
    pub created_unix_ns: u64,
    /// The engine's KV block size in tokens (display).
    pub kv_block_size: u32,
    /// `CLOCK_REALTIME` at the capture, ns since the epoch (display).
    pub captured_unix_ns: u64,
    /// Router blocks the engine held at the capture: `digest.len()`, or
    /// more when the digest was cut to its capacity.
    pub held: u64,
    /// The version, capture stamp and blocks. A record read or decoded
    /// gives its digest the record's `held` and `kv_block_size` too
    /// ([`CacheDigest::held`]); encoding writes the record's own fields.
    pub digest: CacheDigest,
}

impl DigestRecord {
    /// The fixed header of this record as a Redis value (`capacity` =
    /// `count`, ACTIVE).
    pub(crate) fn value_header(&self) -> DigestHeader {
        DigestHeader::new(
            self.writer_pid,
            self.digest.len() as u32,
            self.generation,
            self.created_unix_ns,
            self.kv_block_size,
        )
    }

    /// The control words (72..128) of this record.
    pub(crate) fn control_words(&self) -> [u64; DIGEST_CONTROL_WORDS] {
        let mut words = [0u64; DIGEST_CONTROL_WORDS];
        words[CONTROL_VERSION] = self.digest.version();
        words[CONTROL_CAPTURED_MONO_NS] = self.digest.captured_mono_ns();
        words[CONTROL_CAPTURED_UNIX_NS] = self.captured_unix_ns;
        words[CONTROL_COUNT] = self.digest.len() as u64;
        words[CONTROL_HELD] = self.held.max(self.digest.len() as u64);
        words
    }
}

/// The Redis value of `record`: `128 + 8 × count` bytes. `held` below the
/// count is written as the count. Fails with [`crate::Error::DigestCapacity`]
/// beyond [`MAX_DIGEST_ENTRIES`] entries.
pub fn encode_digest_value(record: &DigestRecord) -> Result<Vec<u8>, crate::Error> {
    let count = record.digest.len();
    if count > MAX_DIGEST_ENTRIES {
        return Err(crate::Error::DigestCapacity {
            count,
            capacity: MAX_DIGEST_ENTRIES,
        });
    }
    let mut out = Vec::with_capacity(digest_size(count));
    out.extend_from_slice(&record.value_header().to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // seq: 0 in a value
    for word in record.control_words() {
        out.extend_from_slice(&word.to_le_bytes());
    }
    for block in record.digest.blocks() {
        out.extend_from_slice(&block.to_le_bytes());
    }
    debug_assert_eq!(out.len(), digest_size(count));
    Ok(out)
}

/// Decodes a Redis value and validates it in the order of docs/FORMAT.md,
/// "Cache residency": magic, version, at least a header, the header's
/// fields (capacity at most [`MAX_DIGEST_ENTRIES`]), the size (exactly
/// `128 + 8 × capacity`), ACTIVE, `count` = `capacity`, the control words,
/// then the entries (strictly ascending). Never allocates more than the
/// value's own size.
pub fn decode_digest_value(bytes: &[u8]) -> Result<DigestRecord, DigestError> {
    let (header, control, entries) = split(bytes)?;
    if header.state != STATE_ACTIVE {
        return Err(DigestError::corrupt(format!(
            "state {} in a Redis value (only ACTIVE values are written)",
            header.state
        )));
    }
    let count = control[CONTROL_COUNT];
    if count != u64::from(header.capacity) {
        return Err(DigestError::corrupt(format!(
            "count {count} differs from capacity {} (a Redis value's are equal)",
            header.capacity
        )));
    }
    check_control(&header, &control)?;
    record(&header, &control, entries)
}

/// Header, control words and entry bytes of a digest's bytes: magic,
/// version, at least a header, the header's fields, the size its capacity
/// implies (the control words and entries are not checked).
pub(crate) fn split(
    bytes: &[u8],
) -> Result<(DigestHeader, [u64; DIGEST_CONTROL_WORDS], &[u8]), DigestError> {
    if bytes.len() < 8
        || u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) != DIGEST_MAGIC
    {
        return Err(DigestError::NotDigest);
    }
    if bytes.len() >= 12 {
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != DIGEST_LAYOUT_VERSION {
            return Err(DigestError::UnknownVersion { found: version });
        }
    }
    if bytes.len() < DIGEST_HEADER_SIZE {
        return Err(DigestError::WrongSize {
            size: bytes.len() as u64,
            expected: DIGEST_HEADER_SIZE as u64,
        });
    }
    let header = DigestHeader::from_le_bytes(
        bytes[..DIGEST_FIXED_HEADER_SIZE]
            .try_into()
            .expect("64 bytes"),
    );
    header.check()?;
    let expected = digest_size(header.capacity as usize);
    if bytes.len() != expected {
        return Err(DigestError::WrongSize {
            size: bytes.len() as u64,
            expected: expected as u64,
        });
    }
    let control: [u64; DIGEST_CONTROL_WORDS] = core::array::from_fn(|i| {
        let at = DIGEST_CONTROL_OFFSET + 8 * i;
        u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
    });
    Ok((header, control, &bytes[DIGEST_ENTRIES_OFFSET..]))
}

/// The control words' own rules: a version (≥ 1), `count ≤ capacity`,
/// `held ≥ count`.
pub(crate) fn check_control(
    header: &DigestHeader,
    control: &[u64; DIGEST_CONTROL_WORDS],
) -> Result<(), DigestError> {
    let count = control[CONTROL_COUNT];
    if count > u64::from(header.capacity) {
        return Err(DigestError::corrupt(format!(
            "count {count} is above the capacity of {} entries",
            header.capacity
        )));
    }
    if control[CONTROL_VERSION] == 0 {
        return Err(DigestError::corrupt(
            "version 0 (a published digest has version 1 or more)".to_owned(),
        ));
    }
    if control[CONTROL_HELD] < count {
        return Err(DigestError::corrupt(format!(
            "held {} is below count {count}",
            control[CONTROL_HELD]
        )));
    }
    Ok(())
}

/// The record of a checked header and control words and the entry bytes
/// (at least `count` entries), the entries' order checked.
pub(crate) fn record(
    header: &DigestHeader,
    control: &[u64; DIGEST_CONTROL_WORDS],
    entry_bytes: &[u8],
) -> Result<DigestRecord, DigestError> {
    let count = control[CONTROL_COUNT] as usize;
    let blocks: Vec<u64> = entry_bytes[..DIGEST_ENTRY_SIZE * count]
        .chunks_exact(DIGEST_ENTRY_SIZE)
        .map(|chunk| u64::from_le_bytes(chunk.try_into().expect("8 bytes")))
        .collect();
    record_of_blocks(header, control, blocks)
}

/// The record of a checked header and control words and `count` entries,
/// the entries' order checked.
pub(crate) fn record_of_blocks(
    header: &DigestHeader,
    control: &[u64; DIGEST_CONTROL_WORDS],
    blocks: Vec<u64>,
) -> Result<DigestRecord, DigestError> {
    check_entries(&blocks)?;
    Ok(DigestRecord {
        writer_pid: header.writer_pid,
        generation: header.generation,
        created_unix_ns: header.created_unix_ns,
        kv_block_size: header.kv_block_size,
        captured_unix_ns: control[CONTROL_CAPTURED_UNIX_NS],
        held: control[CONTROL_HELD],
        digest: record_digest(header, control, blocks),
    })
}

/// The digest of a checked header and control words and `count` entries
/// already checked ascending: it carries the record's `held` and
/// `kv_block_size`, so that what is handed on without its record (a
/// reader's `EngineState::cache`) still says them.
#[inline]
pub(crate) fn record_digest(
    header: &DigestHeader,
    control: &[u64; DIGEST_CONTROL_WORDS],
    blocks: Vec<u64>,
) -> CacheDigest {
    CacheDigest::from_ascending(
        control[CONTROL_VERSION],
        control[CONTROL_CAPTURED_MONO_NS],
        blocks,
        control[CONTROL_HELD],
        header.kv_block_size,
    )
}
