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
    /// Prompt plus expected output tokens of those requests.
    ongoing_tokens = 1,
    /// Prefill tokens of those requests not yet prefilled.
    pending_prefill_tokens = 2,
    /// Tokens of those requests whose prefill is done (decoding).
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
    if slot[SLOT_PADDING_OFFSET..].iter().any(|b| *b != 0) {
        return Err(RouterError::corrupt(format!(
            "the padding of engine {engine_id}'s slot (bytes {SLOT_PADDING_OFFSET}..{RESERVATION_SLOT_SIZE}) is not zero"
        )));
    }
    let mut words = [0u64; RESERVATION_WORDS];
    for (word, chunk) in words
        .iter_mut()
        .zip(slot[SLOT_COUNTERS_OFFSET..SLOT_PADDING_OFFSET].chunks_exact(8))
    {
        *word = u64::from_le_bytes(chunk.try_into().expect("chunks_exact(8)"));
    }
    Ok((engine_id, Reservations::from_words(words)))
}

/// The engine ids and counters of consecutive slots (`slots` is `count ×`
/// [`RESERVATION_SLOT_SIZE`] bytes: a file's live slots, a Redis value's
/// slots): each slot as [`decode_reservation_slot`], and no engine twice
/// (else [`RouterError::Corrupt`] naming the slots).
pub fn decode_reservation_slots(
    slots: &[u8],
) -> Result<Vec<(EngineId, Reservations)>, RouterError> {
    if slots.len() % RESERVATION_SLOT_SIZE != 0 {
        return Err(RouterError::corrupt(format!(
            "{} bytes of slots is not a whole number of {RESERVATION_SLOT_SIZE}-byte slots",
            slots.len()
        )));
    }
    let mut engines = Vec::with_capacity(slots.len() / RESERVATION_SLOT_SIZE);
    let mut seen = std::collections::HashMap::with_capacity(engines.capacity());
    for (index, slot) in slots.chunks_exact(RESERVATION_SLOT_SIZE).enumerate() {
        let slot = slot
            .try_into()
            .expect("chunks_exact(RESERVATION_SLOT_SIZE)");
        let (engine_id, counters) = decode_reservation_slot(slot).map_err(|error| match error {
            RouterError::Corrupt { what } => RouterError::corrupt(format!("slot {index}: {what}")),
            other => other,
        })?;
        if let Some(first) = seen.insert(engine_id.clone(), index) {
            return Err(RouterError::corrupt(format!(
                "engine {engine_id} is in slots {first} and {index}"
            )));
        }
        engines.push((engine_id, counters));
    }
    Ok(engines)
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
    fn malformed_slots_are_corrupt() {
        let good = encode_reservation_slot(&EngineId::new("e-1").unwrap(), &sample());
        let cases: [(&str, fn(&mut [u8; RESERVATION_SLOT_SIZE])); 5] = [
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
