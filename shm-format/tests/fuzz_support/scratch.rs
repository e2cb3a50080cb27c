//! The fuzz tests' scratch directory (`fuzz_file.rs`, `fuzz_digest.rs`,
//! `fuzz_router.rs`).

thread_local! {
    /// A scratch directory per test thread (the properties run in parallel),
    /// on tmpfs like the real state directory when there is one: a disk
    /// under /tmp makes the long `make fuzz` runs wait on writeback.
    pub static SCRATCH: tempfile::TempDir = {
        let shm = std::path::Path::new("/dev/shm");
        if shm.is_dir() {
            tempfile::tempdir_in(shm).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        }
    };
}
