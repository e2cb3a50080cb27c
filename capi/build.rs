//! Gives the shared library its soname, `libengine_state.so.1`, so programs
//! linked against it record the ABI version they were built for. The number
//! is `ES_ABI_VERSION` (src/lib.rs; a test checks they agree), bumped when
//! the ABI changes incompatibly (the header's "ABI version" paragraph, from
//! capi/cbindgen.toml, says when).

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libengine_state.so.1");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
