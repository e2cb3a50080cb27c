//! docs/REDIS.md's table of a router replica's value (after `<!-- table:
//! redis-router-value -->`) and the encoder cannot drift: each documented
//! field is set alone to a value whose bytes are all non-zero, and the bytes
//! that change in the encoded value must be the row's.

use std::path::Path;

use engine_state_redis::{RouterValue, ROUTER_VALUE_HEADER_SIZE, ROUTER_VALUE_MAGIC};
use engine_state_shm_format::{EngineId, Reservations, RESERVATION_SLOT_SIZE};

fn redis_md() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/REDIS.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `(offset, size, field, meaning)` of the table's body rows, backticks stripped.
fn rows(doc: &str) -> Vec<(usize, usize, String, String)> {
    let marker = "<!-- table: redis-router-value -->";
    let start = doc
        .find(marker)
        .expect("docs/REDIS.md has the table marker");
    doc[start + marker.len()..]
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| l.trim_start().starts_with('|'))
        .skip(2)
        .map(|l| {
            let cells: Vec<String> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().replace('`', ""))
                .collect();
            let number = |c: &str| c.parse().unwrap_or_else(|_| panic!("{c:?} in {l}"));
            (
                number(&cells[0]),
                number(&cells[1]),
                cells[2].clone(),
                cells[4].clone(),
            )
        })
        .collect()
}

/// The byte range in which `a` and `b` differ (empty: equal).
fn changed(a: &[u8], b: &[u8]) -> (usize, usize) {
    assert_eq!(a.len(), b.len());
    let first = a.iter().zip(b).position(|(x, y)| x != y);
    let last = a.iter().zip(b).rposition(|(x, y)| x != y);
    match (first, last) {
        (Some(first), Some(last)) => (first, last + 1 - first),
        _ => (0, 0),
    }
}

#[test]
fn the_router_value_table_is_the_encoder() {
    let rows = rows(&redis_md());
    let one_slot = |counters: Reservations, engine: &str| RouterValue {
        engines: vec![(EngineId::new(engine).unwrap(), counters)],
        ..RouterValue::default()
    };
    let base = one_slot(Reservations::default(), "e");
    let encoded = base.encode();
    // Contiguous header rows, then the slots.
    let mut at = 0;
    for (offset, size, field, meaning) in &rows {
        assert_eq!(*offset, at, "{field} should start at {at}");
        at += size;
        let (v32, v64) = (0x1111_1111u32, 0x1111_1111_1111_1111u64);
        let range = match field.as_str() {
            "magic" => {
                assert_eq!(encoded[0..8], ROUTER_VALUE_MAGIC);
                assert!(meaning.contains("ESROUTER"));
                (0, 8)
            }
            "layout_version" => {
                assert!(meaning.starts_with(&encoded[8].to_string()), "{meaning}");
                (8, 4)
            }
            "header_size" => {
                assert!(meaning.starts_with(&ROUTER_VALUE_HEADER_SIZE.to_string()));
                assert_eq!(encoded[12], ROUTER_VALUE_HEADER_SIZE as u8);
                (12, 2)
            }
            "slot_size" => {
                assert!(meaning.starts_with(&RESERVATION_SLOT_SIZE.to_string()));
                assert_eq!(encoded[14], RESERVATION_SLOT_SIZE as u8);
                (14, 2)
            }
            "writer_pid" => changed(
                &encoded,
                &RouterValue {
                    writer_pid: v32,
                    ..base.clone()
                }
                .encode(),
            ),
            "heartbeat_period_us" => changed(
                &encoded,
                &RouterValue {
                    heartbeat_period_us: v32,
                    ..base.clone()
                }
                .encode(),
            ),
            "state" => changed(
                &encoded,
                &RouterValue {
                    state: v64,
                    ..base.clone()
                }
                .encode(),
            ),
            "generation" => changed(
                &encoded,
                &RouterValue {
                    generation: v64,
                    ..base.clone()
                }
                .encode(),
            ),
            "heartbeat_seq" => changed(
                &encoded,
                &RouterValue {
                    heartbeat_seq: v64,
                    ..base.clone()
                }
                .encode(),
            ),
            "heartbeat_mono_ns" => changed(
                &encoded,
                &RouterValue {
                    heartbeat_mono_ns: v64,
                    ..base.clone()
                }
                .encode(),
            ),
            "ttl_ms" => changed(
                &encoded,
                &RouterValue {
                    ttl_ms: v32,
                    ..base.clone()
                }
                .encode(),
            ),
            "count" => {
                let two = RouterValue {
                    engines: vec![
                        (EngineId::new("e").unwrap(), Reservations::default()),
                        (EngineId::new("f").unwrap(), Reservations::default()),
                    ],
                    ..base.clone()
                }
                .encode();
                assert_eq!(encoded[60..64], 1u32.to_le_bytes());
                assert_eq!(two[60..64], 2u32.to_le_bytes());
                assert_eq!(changed(&encoded, &two[..encoded.len()]).0, 60);
                (60, 4)
            }
            "slots" => {
                // The engine id's field and the six counters, in the named order.
                let names = Reservations::FIELD_NAMES.join(", ");
                assert!(meaning.contains(&names), "{meaning} should name {names}");
                let id = changed(
                    &encoded,
                    &one_slot(Reservations::default(), "eeeeeeee").encode(),
                );
                assert_eq!(id, (ROUTER_VALUE_HEADER_SIZE + 1, 7), "the id follows 'e'");
                for (word, name) in Reservations::FIELD_NAMES.iter().enumerate() {
                    let mut words = [0u64; 6];
                    words[word] = v64;
                    let got = changed(
                        &encoded,
                        &one_slot(Reservations::from_words(words), "e").encode(),
                    );
                    assert_eq!(got, (64 + 64 + 8 * word, 8), "{name}");
                }
                assert_eq!(encoded.len(), 64 + RESERVATION_SLOT_SIZE);
                (64, RESERVATION_SLOT_SIZE)
            }
            other => panic!("docs/REDIS.md documents an unknown field {other:?}"),
        };
        assert_eq!(range, (*offset, *size), "{field}");
    }
    assert_eq!(at, ROUTER_VALUE_HEADER_SIZE + RESERVATION_SLOT_SIZE);
}
