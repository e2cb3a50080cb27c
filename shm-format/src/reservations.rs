//! A router replica's reservations on one engine (docs/FORMAT.md, "Shared
//! reservations"): six `u64` counters, and the 128-byte slot that carries
//! them with the engine id, in a replica's shared-memory file and in its
//! Redis value alike ([`encode_reservation_slot`], [`decode_reservation_slot`]).

use bytemuck::{Pod, Zeroable};

use crate::engine_id::EngineId;
use crate::error::RouterError;
use crate::layout::ENGINE_ID_FIELD_SIZE;

/// Number of counters in [`Reservations`].
pub const RESERVATION_WORDS: usize = 6;
/// Bytes of one slot: engine id (64), the six counters (48), zero (16).
pub const RESERVATION_SLOT_SIZE: usize = 128;
/// Words of one slot.
pub(crate) const SLOT_WORDS: usize = RESERVATION_SLOT_SIZE / 8;
/// Offset of the counters inside a slot.
pub const SLOT_COUNTERS_OFFSET: usize = ENGINE_ID_FIELD_SIZE;
/// Offset of the zero padding inside a slot.
pub const SLOT_PADDING_OFFSET: usize = SLOT_COUNTERS_OFFSET + RESERVATION_WORDS * 8;

/// Emits `Reservations` and what must follow its field list: the one place
/// the counters' names and order are written.
macro_rules! define_reservations {
    ($($(#[$doc:meta])* $field:ident = $word:literal,)*) => {
        /// What one router replica has reserved on one engine and not yet
        /// seen completed: the router's shadow counters (the router's
        /// `ShadowCounters` is this type).
        ///
        /// The field names and their order are the contract
        /// ([`Reservations::FIELD_NAMES`]); the word index of each field is
        /// pinned by compile-time asserts and a golden-bytes test.
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        pub struct Reservations {
            $($(#[$doc])* pub $field: u64,)*
        }

        $(const _: () = assert!(core::mem::offset_of!(Reservations, $field) == $word * 8);)*

        impl Reservations {
            /// The counters' names, in word order.
            pub const FIELD_NAMES: [&'static str; RESERVATION_WORDS] = [$(stringify!($field)),*];
        }
    };
}

define_reservations! {
    /// Requests reserved and not yet completed.
    num_requests = 0,
    /// Prompt tokens (`input_len`) of those requests.
    ongoing_tokens = 1,
    /// Prefill still to do (`input_len` − cache hit) of those requests
    /// before their `prefill_done`.
    pending_prefill_tokens = 2,
    /// Prompt tokens of those requests after their `prefill_done` (their
    /// decode context).
    ongoing_decode_tokens = 3,
    /// Those requests still prefilling.
    num_prefilling = 4,
    /// Largest remaining prefill of any of those requests.
    max_prefill_remaining = 5,
}

const _: () = assert!(core::mem::size_of::<Reservations>() == RESERVATION_WORDS * 8);
const _: () = assert!(SLOT_PADDING_OFFSET + 16 == RESERVATION_SLOT_SIZE);

impl Reservations {
    /// The counters as words, in layout order.
    #[inline]
    pub fn to_words(&self) -> [u64; RESERVATION_WORDS] {
        bytemuck::cast(*self)
    }

    /// Counters from their words, in layout order.
    #[inline]
    pub fn from_words(words: [u64; RESERVATION_WORDS]) -> Reservations {
        bytemuck::cast(words)
    }

    /// Every counter and its value, in word order.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
        Self::FIELD_NAMES.into_iter().zip(self.to_words())
    }

    /// All counters are zero: nothing reserved.
    #[inline]
    pub fn is_zero(&self) -> bool {
        *self == Reservations::default()
    }
}

/// The 128 little-endian bytes of one slot: `engine_id` NUL padded to 64
/// bytes, the six counters, 16 zero bytes.
pub fn encode_reservation_slot(
    engine_id: &EngineId,
    counters: &Reservations,
) -> [u8; RESERVATION_SLOT_SIZE] {
    let mut slot = [0u8; RESERVATION_SLOT_SIZE];
    slot[..SLOT_COUNTERS_OFFSET].copy_from_slice(&engine_id.to_field());
    for (chunk, word) in slot[SLOT_COUNTERS_OFFSET..SLOT_PADDING_OFFSET]
        .chunks_exact_mut(8)
        .zip(counters.to_words())
    {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    slot
}

/// The engine id and counters of one slot. An engine id that is not a valid
/// [`EngineId`] (bytes after its NUL included) or nonzero padding is
/// [`RouterError::Corrupt`].
pub fn decode_reservation_slot(
    slot: &[u8; RESERVATION_SLOT_SIZE],
) -> Result<(EngineId, Reservations), RouterError> {
    let field = &slot[..SLOT_COUNTERS_OFFSET];
    let len = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    if len == field.len() {
        return Err(RouterError::corrupt(
            "a slot's engine id fills its 64 bytes (no NUL)".to_owned(),
        ));
    }
    if field[len..].iter().any(|b| *b != 0) {
        return Err(RouterError::corrupt(format!(
            "a slot's engine id has bytes after its NUL at byte {len}"
        )));
    }
    let engine_id = EngineId::from_field(field)
        .map_err(|err| RouterError::corrupt(format!("a slot holds an invalid engine id: {err}")))?;
    let counters =
        decode_counters(&bytemuck::cast(*slot), &engine_id).map_err(RouterError::corrupt)?;
    Ok((engine_id, counters))
}

/// The engine ids and counters of consecutive slots (`slots` is `count ×`
/// [`RESERVATION_SLOT_SIZE`] bytes: a file's live slots, a Redis value's
/// slots): each slot as [`decode_reservation_slot`], and no engine twice
/// (else [`RouterError::Corrupt`] naming the slots).
pub fn decode_reservation_slots(
    slots: &[u8],
) -> Result<Vec<(EngineId, Reservations)>, RouterError> {
    let mut engines = Vec::new();
    decode_reservation_slots_into(slots, &mut engines)?;
    Ok(engines)
}

/// [`decode_reservation_slots`] into `engines`, reusing it: a slot whose
/// engine id field holds the id `engines` already has at that index keeps
/// it (no validation, no allocation: it was validated when it was
/// decoded), so reading a replica again costs little more than its loads
/// while its engines stay the same. On error `engines` is empty.
pub fn decode_reservation_slots_into(
    slots: &[u8],
    engines: &mut Vec<(EngineId, Reservations)>,
) -> Result<(), RouterError> {
    let decoded = decode_into(slots, engines);
    if decoded.is_err() {
        engines.clear();
    }
    decoded
}

fn decode_into(
    slots: &[u8],
    engines: &mut Vec<(EngineId, Reservations)>,
) -> Result<(), RouterError> {
    if slots.len() % RESERVATION_SLOT_SIZE != 0 {
        return Err(RouterError::corrupt(format!(
            "{} bytes of slots is not a whole number of {RESERVATION_SLOT_SIZE}-byte slots",
            slots.len()
        )));
    }
    engines.truncate(slots.len() / RESERVATION_SLOT_SIZE);
    // A prefix of a list without duplicates has none: only a new id needs
    // the check.
    let mut new_ids = false;
    for (index, slot) in slots.chunks_exact(RESERVATION_SLOT_SIZE).enumerate() {
        let slot: &[u8; RESERVATION_SLOT_SIZE] = slot
            .try_into()
            .expect("chunks_exact(RESERVATION_SLOT_SIZE)");
        match engines.get_mut(index) {
            Some((engine_id, counters)) if holds_id(&bytemuck::cast(*slot), engine_id) => {
                *counters = decode_counters(&bytemuck::cast(*slot), engine_id)
                    .map_err(|what| RouterError::corrupt(format!("slot {index}: {what}")))?;
            }
            known => {
                let decoded = decode_reservation_slot(slot).map_err(|error| match error {
                    RouterError::Corrupt { what } => {
                        RouterError::corrupt(format!("slot {index}: {what}"))
                    }
                    other => other,
                })?;
                match known {
                    Some(entry) => *entry = decoded,
                    None => engines.push(decoded),
                }
                new_ids = true;
            }
        }
    }
    if new_ids {
        // No engine twice: sorted by (id, slot), a duplicate is a
        // neighbour (no hashing, no copy of an id).
        let mut order: Vec<(&str, usize)> = engines
            .iter()
            .enumerate()
            .map(|(index, (engine_id, _))| (engine_id.as_str(), index))
            .collect();
        order.sort_unstable();
        if let Some(pair) = order.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            return Err(RouterError::corrupt(format!(
                "engine {} is in slots {} and {}",
                pair[0].0, pair[0].1, pair[1].1
            )));
        }
    }
    Ok(())
}

/// Whether the slot's engine id field is exactly `engine_id`, NUL padded
/// (compared as words: the hot path of a poller's read).
#[inline]
fn holds_id(words: &[u64; SLOT_WORDS], engine_id: &EngineId) -> bool {
    let expected: [u64; ENGINE_ID_FIELD_SIZE / 8] = bytemuck::cast(engine_id.to_field());
    words[..ENGINE_ID_FIELD_SIZE / 8] == expected
}

/// The counters of a slot (as little-endian words) whose engine id is
/// `engine_id`, its padding checked.
#[inline]
fn decode_counters(
    words: &[u64; SLOT_WORDS],
    engine_id: &EngineId,
) -> Result<Reservations, String> {
    const FIRST: usize = SLOT_COUNTERS_OFFSET / 8;
    const PADDING: usize = SLOT_PADDING_OFFSET / 8;
    if words[PADDING..].iter().any(|w| *w != 0) {
        return Err(format!(
            "the padding of engine {engine_id}'s slot (bytes \
             {SLOT_PADDING_OFFSET}..{RESERVATION_SLOT_SIZE}) is not zero"
        ));
    }
    // Little-endian host (lib.rs refuses others): the words are the values.
    Ok(Reservations::from_words(
        words[FIRST..PADDING].try_into().expect("six words"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Reservations {
        Reservations {
            num_requests: 1,
            ongoing_tokens: 0x0202,
            pending_prefill_tokens: 0x0303_0303,
            ongoing_decode_tokens: 4,
            num_prefilling: 5,
            max_prefill_remaining: 0x0606_0000_0000_0006,
        }
    }

    #[test]
    fn field_names_follow_word_order() {
        assert_eq!(
            Reservations::FIELD_NAMES,
            [
                "num_requests",
                "ongoing_tokens",
                "pending_prefill_tokens",
                "ongoing_decode_tokens",
                "num_prefilling",
                "max_prefill_remaining",
            ]
        );
        let fields: Vec<_> = sample().fields().collect();
        assert_eq!(fields[2], ("pending_prefill_tokens", 0x0303_0303));
        assert!(Reservations::default().is_zero());
        assert!(!sample().is_zero());
    }

    /// Pins the slot's bytes: a change here is a layout change.
    #[test]
    fn golden_slot_bytes() {
        let slot = encode_reservation_slot(&EngineId::new("e-1").unwrap(), &sample());
        let mut golden = [0u8; RESERVATION_SLOT_SIZE];
        golden[..3].copy_from_slice(b"e-1");
        #[rustfmt::skip]
        let counters: [u8; 48] = [
            1, 0, 0, 0, 0, 0, 0, 0,
            2, 2, 0, 0, 0, 0, 0, 0,
            3, 3, 3, 3, 0, 0, 0, 0,
            4, 0, 0, 0, 0, 0, 0, 0,
            5, 0, 0, 0, 0, 0, 0, 0,
            6, 0, 0, 0, 0, 0, 6, 6,
        ];
        golden[64..112].copy_from_slice(&counters);
        assert_eq!(slot, golden);
        let (id, counters) = decode_reservation_slot(&slot).unwrap();
        assert_eq!(id.as_str(), "e-1");
        assert_eq!(counters, sample());
    }

    #[test]
    fn slots_decode_in_order_and_refuse_a_duplicate() {
        let a = encode_reservation_slot(&EngineId::new("a").unwrap(), &sample());
        let b = encode_reservation_slot(&EngineId::new("b").unwrap(), &Reservations::default());
        let engines = decode_reservation_slots(&[a, b].concat()).unwrap();
        assert_eq!(engines.len(), 2);
        assert_eq!((engines[0].0.as_str(), engines[0].1), ("a", sample()));
        assert_eq!(engines[1].0.as_str(), "b");
        assert_eq!(decode_reservation_slots(&[]).unwrap(), []);
        let err = decode_reservation_slots(&[a, b, a].concat()).unwrap_err();
        assert_eq!(err.kind(), "corrupt_router");
        assert!(
            err.to_string().contains("engine a is in slots 0 and 2"),
            "{err}"
        );
        let mut bad = b;
        bad[120] = 9;
        let err = decode_reservation_slots(&[a, bad].concat()).unwrap_err();
        assert!(err.to_string().contains("slot 1: the padding"), "{err}");
        let err = decode_reservation_slots(&a[..100]).unwrap_err();
        assert!(err.to_string().contains("not a whole number"), "{err}");
    }

    #[test]
    fn decoding_into_reuses_known_ids_and_still_checks_new_ones() {
        let slot =
            |id: &str, n| encode_reservation_slot(&EngineId::new(id).unwrap(), &counters_n(n));
        let mut engines = Vec::new();
        decode_reservation_slots_into(&[slot("a", 1), slot("b", 2)].concat(), &mut engines)
            .unwrap();
        let first = engines[0].0.as_str().as_ptr();
        decode_reservation_slots_into(&[slot("a", 3), slot("c", 4)].concat(), &mut engines)
            .unwrap();
        assert_eq!(engines[0], (EngineId::new("a").unwrap(), counters_n(3)));
        assert_eq!(
            engines[0].0.as_str().as_ptr(),
            first,
            "the known id was kept"
        );
        assert_eq!(engines[1], (EngineId::new("c").unwrap(), counters_n(4)));
        // Fewer slots: the list is cut; a new id that repeats a kept one is refused.
        decode_reservation_slots_into(&slot("a", 5), &mut engines).unwrap();
        assert_eq!(engines.len(), 1);
        let err =
            decode_reservation_slots_into(&[slot("a", 1), slot("a", 1)].concat(), &mut engines)
                .unwrap_err();
        assert!(
            err.to_string().contains("engine a is in slots 0 and 1"),
            "{err}"
        );
        assert!(engines.is_empty(), "emptied on error");
        // A kept id's padding is still checked.
        decode_reservation_slots_into(&slot("a", 1), &mut engines).unwrap();
        let mut bad = slot("a", 1);
        bad[127] = 1;
        let err = decode_reservation_slots_into(&bad, &mut engines).unwrap_err();
        assert!(
            err.to_string().contains("slot 0: the padding of engine a"),
            "{err}"
        );
        // An id with a byte after its NUL is not the kept one.
        decode_reservation_slots_into(&slot("a", 1), &mut engines).unwrap();
        let mut after = slot("a", 1);
        after[5] = b'z';
        let err = decode_reservation_slots_into(&after, &mut engines).unwrap_err();
        assert!(err.to_string().contains("bytes after its NUL"), "{err}");
    }

    fn counters_n(n: u64) -> Reservations {
        Reservations::from_words([n; RESERVATION_WORDS])
    }

    #[test]
    fn malformed_slots_are_corrupt() {
        let good = encode_reservation_slot(&EngineId::new("e-1").unwrap(), &sample());
        type Damage = fn(&mut [u8; RESERVATION_SLOT_SIZE]);
        let cases: [(&str, Damage); 5] = [
            ("empty", |s| s[..3].fill(0)),
            ("outside [A-Za-z0-9._-]", |s| s[1] = b'/'),
            ("no NUL", |s| s[..64].fill(b'a')),
            ("bytes after its NUL", |s| s[10] = b'x'),
            ("padding", |s| s[127] = 1),
        ];
        for (what, damage) in cases {
            let mut slot = good;
            damage(&mut slot);
            let err = decode_reservation_slot(&slot).unwrap_err();
            assert_eq!(err.kind(), "corrupt_router", "{what}");
            assert!(err.to_string().contains(what), "{what}: {err}");
        }
    }
}
