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
