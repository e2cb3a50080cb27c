use super::*;

fn id(s: &str) -> EngineId {
    EngineId::new(s).unwrap()
}

fn counters(base: u64) -> Reservations {
    Reservations::from_words(core::array::from_fn(|i| base + i as u64))
}

fn sample() -> RouterValue {
    RouterValue {
        writer_pid: 0x0102_0304,
        heartbeat_period_us: 50_000,
        state: STATE_ACTIVE,
        generation: 0x1112,
        heartbeat_seq: 0x2122,
        heartbeat_mono_ns: 0x3132_3334,
        ttl_ms: 2000,
        engines: vec![(id("e-1"), counters(1)), (id("e-2"), counters(0x100))],
    }
}

/// Pins the value's bytes: any change is a layout change.
#[test]
fn golden_bytes() {
    let bytes = sample().encode();
    #[rustfmt::skip]
    let header: [u8; ROUTER_VALUE_HEADER_SIZE] = [
        b'E', b'S', b'R', b'O', b'U', b'T', b'E', b'R',   // magic
        1, 0, 0, 0,  64, 0,  128, 0,                      // version, header, slot size
        0x04, 0x03, 0x02, 0x01,  0x50, 0xc3, 0, 0,        // pid, period 50 000 us
        1, 0, 0, 0, 0, 0, 0, 0,                           // state ACTIVE
        0x12, 0x11, 0, 0, 0, 0, 0, 0,                     // generation
        0x22, 0x21, 0, 0, 0, 0, 0, 0,                     // heartbeat_seq
        0x34, 0x33, 0x32, 0x31, 0, 0, 0, 0,               // heartbeat_mono_ns
        0xd0, 0x07, 0, 0,  2, 0, 0, 0,                    // ttl_ms 2000, count 2
    ];
    assert_eq!(bytes.len(), 64 + 2 * 128);
    assert_eq!(bytes[..64], header);
    // Slot 0: engine id NUL padded, then the six counters 1..=6, then zeros.
    let slot = &bytes[64..192];
    assert_eq!(&slot[..4], b"e-1\0");
    assert!(slot[4..64].iter().all(|b| *b == 0));
    for (i, word) in slot[64..112].chunks_exact(8).enumerate() {
        assert_eq!(word, (1 + i as u64).to_le_bytes(), "counter {i}");
    }
    assert!(slot[112..].iter().all(|b| *b == 0));
    assert_eq!(&bytes[192..196], b"e-2\0");
    assert_eq!(bytes[192 + 64], 0x00);
    assert_eq!(bytes[192 + 65], 0x01, "num_requests 0x100");
    assert_eq!(RouterValue::decode("k", &bytes).unwrap(), sample());
    let empty = RouterValue {
        engines: Vec::new(),
        ..sample()
    };
    assert_eq!(empty.encode().len(), 64);
    assert_eq!(RouterValue::decode("k", &empty.encode()).unwrap(), empty);
}

#[test]
fn keys() {
    assert_eq!(
        (
            crate::router_registry_key("p:"),
            crate::router_key("p:", "r0")
        ),
        ("p:routers".to_owned(), "p:router:r0".to_owned())
    );
}

#[test]
fn malformed_values_are_clear_errors() {
    let good = sample().encode();
    let with = |change: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = good.clone();
        change(&mut bytes);
        bytes
    };
    let cases: Vec<(Vec<u8>, &str, &str)> = vec![
        (
            b"hello".to_vec(),
            "foreign",
            "5 bytes without the ESROUTER magic",
        ),
        (
            with(&|b| b[0..8].copy_from_slice(b"ENGSTATE")),
            "foreign",
            "without the ESROUTER magic",
        ),
        (
            with(&|b| b[8] = 9),
            "version",
            "layout version 9, but this build reads version 1",
        ),
        (
            good[..40].to_vec(),
            "foreign",
            "40 bytes with header size 64 and slot size 128, expected at least 64",
        ),
        (with(&|b| b[14] = 64), "foreign", "slot size 64"),
        (
            with(&|b| b.truncate(300)),
            "foreign",
            "300 bytes, but its count 2 makes 320",
        ),
        (
            with(&|b| b.push(0)),
            "foreign",
            "321 bytes, but its count 2 makes 320",
        ),
        (
            with(&|b| b[60] = 3),
            "foreign",
            "320 bytes, but its count 3 makes 448",
        ),
        (
            with(&|b| b[60..64].copy_from_slice(&257u32.to_le_bytes())),
            "corrupt",
            "count 257 is more than MAX_ROUTER_ENGINES (256)",
        ),
        (
            with(&|b| b[24] = 5),
            "corrupt",
            "state 5 is neither 1 nor 2",
        ),
        (
            with(&|b| b[64 + 1] = b'/'),
            "corrupt",
            "slot 0: a slot holds an invalid engine id",
        ),
        (
            with(&|b| b[192..195].copy_from_slice(b"e-1")),
            "corrupt",
            "engine e-1 is in slots 0 and 1",
        ),
        (
            with(&|b| b[192 + 127] = 1),
            "corrupt",
            "slot 1: the padding",
        ),
        (with(&|b| b[64..128].fill(b'a')), "corrupt", "no NUL"),
    ];
    for (bytes, class, says) in cases {
        let error = RouterValue::decode("fleet:router:r1", &bytes).unwrap_err();
        let got = match &error {
            Error::ForeignValue { .. } => "foreign",
            Error::UnknownVersion { .. } => "version",
            Error::CorruptRouter { .. } => "corrupt",
            _ => "other",
        };
        let text = error.to_string();
        assert_eq!(got, class, "{text}");
        assert!(
            text.contains(says) && text.contains("fleet:router:r1"),
            "{says}: {text}"
        );
    }
}

/// The decoder against arbitrary and mutated bytes: it never panics,
/// accepts exactly the well-formed values, which encode back to the same
/// bytes.
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    /// A well-formed value, said independently of `decode` (slot contents
    /// are shm-format's rule, checked with its decoder).
    fn well_formed(bytes: &[u8]) -> bool {
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
        if bytes.len() < 64
            || bytes[0..8] != *b"ESROUTER"
            || bytes[8..12] != 1u32.to_le_bytes()
            || bytes[12..14] != 64u16.to_le_bytes()
            || bytes[14..16] != 128u16.to_le_bytes()
            || !matches!(word(24), 1 | 2)
        {
            return false;
        }
        let count = u32::from_le_bytes(bytes[60..64].try_into().unwrap()) as usize;
        count <= 256
            && bytes.len() == 64 + 128 * count
            && decode_reservation_slots(&bytes[64..]).is_ok()
    }

    fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
        match RouterValue::decode("fuzz:router:x", bytes) {
            Ok(value) => {
                prop_assert!(well_formed(bytes), "accepted a malformed value");
                prop_assert_eq!(&value.encode()[..], bytes);
            }
            Err(error) => {
                prop_assert!(!well_formed(bytes), "refused a value: {}", error);
                prop_assert!(error.to_string().contains("fuzz:router:x"));
            }
        }
        Ok(())
    }

    fn engine_id() -> impl Strategy<Value = EngineId> {
        "[A-Za-z0-9_-][A-Za-z0-9._-]{0,62}".prop_map(|s| EngineId::new(&s).unwrap())
    }

    /// A valid value with arbitrary fields and up to 8 distinct engines.
    fn value() -> impl Strategy<Value = RouterValue> {
        (
            any::<[u64; 3]>(),
            any::<[u32; 3]>(),
            1u64..=2,
            prop::collection::btree_map(engine_id(), any::<[u64; 6]>(), 0..8),
        )
            .prop_map(|(longs, ints, state, engines)| RouterValue {
                writer_pid: ints[0],
                heartbeat_period_us: ints[1],
                state,
                generation: longs[0],
                heartbeat_seq: longs[1],
                heartbeat_mono_ns: longs[2],
                ttl_ms: ints[2],
                engines: engines
                    .into_iter()
                    .map(|(id, words)| (id, Reservations::from_words(words)))
                    .collect(),
            })
    }

    /// A valid value with some bytes overwritten, then maybe cut or extended.
    fn mutated() -> impl Strategy<Value = Vec<u8>> {
        (
            value(),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            prop_oneof![Just(None), any::<prop::sample::Index>().prop_map(Some)],
        )
            .prop_map(|(value, writes, cut)| {
                let mut bytes = value.encode();
                for (at, byte) in writes {
                    let at = at.index(bytes.len());
                    bytes[at] = byte;
                }
                if let Some(cut) = cut {
                    bytes.truncate(cut.index(bytes.len() + 1));
                }
                bytes
            })
    }

    proptest! {
        #[test]
        fn every_valid_value_round_trips(value in value()) {
            let bytes = value.encode();
            prop_assert!(well_formed(&bytes));
            prop_assert_eq!(RouterValue::decode("k", &bytes).unwrap(), value);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
            check(&bytes)?;
        }

        #[test]
        fn a_magic_prefix_with_arbitrary_rest_is_decided_by_its_shape(
            rest in prop::collection::vec(any::<u8>(), 0..400)
        ) {
            let mut bytes = ROUTER_VALUE_MAGIC.to_vec();
            bytes.extend(rest);
            check(&bytes)?;
        }

        #[test]
        fn mutated_values_are_accepted_only_when_still_well_formed(bytes in mutated()) {
            check(&bytes)?;
        }
    }
}
