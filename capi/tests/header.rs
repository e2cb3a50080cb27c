//! `include/engine_state.h` is what cbindgen makes of this crate now: a
//! change to the ABI that is not in the committed header fails here (and in
//! `make lint`). `ENGINE_STATE_BLESS=1` rewrites it (`make capi-header`).

use std::path::Path;

#[test]
fn the_committed_header_is_what_cbindgen_makes() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen could not parse capi/src")
        .write(&mut generated);
    let path = crate_dir.join("include/engine_state.h");
    if std::env::var_os("ENGINE_STATE_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale (the extern \"C\" API changed): regenerate it with `make capi-header` \
         (ENGINE_STATE_BLESS=1 cargo test -p engine-state-capi --test header), review the diff \
         and commit it",
        path.display()
    );
}

/// The C struct's fields are the snapshot's, as the Rust owner of the list
/// (shm-format's `snapshot_fields!`, `Snapshot::FIELD_NAMES`) names them, in
/// word order, then the reserved words: C callers read them by these names.
#[test]
fn the_header_snapshot_fields_are_the_rust_fields() {
    let header = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("include/engine_state.h"),
    )
    .unwrap();
    let body = header
        .split("typedef struct EsSnapshot {")
        .nth(1)
        .and_then(|rest| rest.split("} EsSnapshot;").next())
        .expect("engine_state.h defines EsSnapshot");
    let fields: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter_map(|line| line.strip_prefix("uint64_t "))
        .map(|declaration| declaration.trim_end_matches(';'))
        .collect();
    let mut expected: Vec<String> = engine_state_shm_format::Snapshot::FIELD_NAMES
        .iter()
        .map(|name| name.to_string())
        .collect();
    expected.push(format!(
        "reserved[{}]",
        engine_state_shm_format::SNAPSHOT_WORDS - engine_state_shm_format::FIELD_COUNT
    ));
    assert_eq!(fields, expected);
}

/// `EsReservations` carries the counters under shm-format's names
/// (`Reservations::FIELD_NAMES`), in word order.
#[test]
fn the_header_reservation_fields_are_the_rust_fields() {
    let header = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("include/engine_state.h"),
    )
    .unwrap();
    let body = header
        .split("typedef struct EsReservations {")
        .nth(1)
        .and_then(|rest| rest.split("} EsReservations;").next())
        .expect("engine_state.h defines EsReservations");
    let fields: Vec<&str> = body
        .lines()
        .map(str::trim)
        .filter_map(|line| line.strip_prefix("uint64_t "))
        .map(|declaration| declaration.trim_end_matches(';'))
        .collect();
    assert_eq!(fields, engine_state_shm_format::Reservations::FIELD_NAMES);
}
