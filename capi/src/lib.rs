//! The C ABI of the engine-state reader: `libengine_state.so` /
//! `libengine_state.a` and the header `include/engine_state.h` (generated
//! from this crate by cbindgen; `make capi-header` regenerates it, and a
//! test fails when the committed one is stale).
//!
//! - [`es_open`] opens a source from a URI (`file:///dir` shared memory,
//!   `redis://…`) and an [`EsOptions`] (versioned by its `struct_size`);
//!   [`es_close`] frees it.
//! - [`es_read`] reads every engine into a caller's array of fixed-size
//!   [`EsEngine`]s (no allocation per read: the handle keeps and reuses one
//!   `Reading`); [`es_read_engine`] reads one engine by id; [`es_read_at`]
//!   ages a shared-memory read from a given `CLOCK_MONOTONIC` instant.
//! - [`es_error_count`] and [`es_engine_error`]: the per-engine errors of
//!   the last read (a bad file never stops the others from being read).
//! - [`es_decode_record`]: one Redis value fetched with the caller's own
//!   client, judged like the Redis source judges it.
//! - Cache digests (docs/FORMAT.md, "Cache residency"): with
//!   `EsOptions.read_cache_digests` a source reads them, and
//!   [`es_read_cache`] gives one engine's as an [`EsCacheDigest`] and its
//!   entries in the caller's array; [`es_read_cache_file`] reads a digest
//!   file, [`es_decode_cache_value`] a Redis value fetched with the
//!   caller's client; [`es_block_hashes`] makes a prompt's keys.
//! - Router replicas' shared reservations (docs/FORMAT.md, "Shared
//!   reservations"), read the way engines are: [`es_open_replicas`] (the
//!   engines' URI and the reader's own replica id, left out),
//!   [`es_read_replicas`] into the caller's [`EsReplica`] and
//!   [`EsReservation`] arrays, [`es_replica_error_count`] and
//!   [`es_replica_error`], [`es_close_replicas`]; [`es_read_router_file`]
//!   reads one replica's file.
//! - [`EsCode`]: every function returns one; [`es_last_error`] copies the
//!   message of the calling thread's last failed call, [`es_code_name`]
//!   names a code.
//!
//! Ownership and threads (also in the header): a handle belongs to its
//! caller until [`es_close`]; it may move between threads, and a call made
//! while another thread is inside a call on the same handle returns
//! [`EsCode::Busy`] instead of racing. Use one handle per thread. Panics
//! never unwind into C: they become [`EsCode::Panic`].
//!
//! This crate is `unsafe` by nature (raw pointers from C); every block says
//! which caller contract it relies on, and every pointer is checked for
//! null before use.
//!
//! ```
//! use engine_state::{es_close, es_open, es_read, EsCode, EsEngine, EsSource};
//! use engine_state_shm_format::{EngineId, ShmWriter, Snapshot, WriterOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let _writer = ShmWriter::create(dir.path(), &EngineId::new("e0")?, &WriterOptions::default(),
//!     &Snapshot { num_running: 2, ..Snapshot::default() })?;
//! let uri = std::ffi::CString::new(format!("file://{}", dir.path().display()))?;
//! let mut source: *mut EsSource = std::ptr::null_mut();
//! // SAFETY: a NUL-terminated URI, null options (defaults), a valid out-pointer.
//! assert_eq!(unsafe { es_open(uri.as_ptr(), std::ptr::null(), &mut source) }, EsCode::Ok);
//! let mut engines = [EsEngine::default(); 4];
//! let mut count = 0;
//! // SAFETY: an open handle, an array of 4 engines, a valid count pointer.
//! let code = unsafe { es_read(source, engines.as_mut_ptr(), engines.len(), &mut count) };
//! assert_eq!((code, count), (EsCode::Ok, 1));
//! assert_eq!(engines[0].snapshot.num_running, 2);
//! // SAFETY: the handle from es_open, closed once.
//! unsafe { es_close(source) };
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

mod c_string;
mod code;
mod digest;
mod engine;
mod ffi_call;
mod handle;
mod options;
mod record;
mod replicas;
mod reservation;
mod router_file;
mod source;
mod source_cache;

pub use crate::code::{es_code_name, EsCode};
pub use crate::digest::{
    es_block_hashes, es_decode_cache_value, es_read_cache_file, EsCacheDigest, EsCacheState,
    ES_BLOCK_TOKENS, ES_MAX_DIGEST_ENTRIES,
};
pub use crate::engine::{EsEngine, EsSnapshot, EsStatus, ES_ENGINE_ID_SIZE, ES_MAX_ENGINE_ID_LEN};
pub use crate::ffi_call::es_last_error;
pub use crate::options::{
    es_options_init, es_options_init_sized, EsOptions, ES_OPTIONS_V1_SIZE, ES_OPTIONS_V2_SIZE,
};
pub use crate::record::es_decode_record;
pub use crate::replicas::{
    es_close_replicas, es_open_replicas, es_read_replicas, es_replica_error,
    es_replica_error_count, EsReplicas,
};
pub use crate::reservation::{
    EsReplica, EsReservation, EsReservations, EsRouterFile, EsRouterState, ES_MAX_ROUTER_ENGINES,
};
pub use crate::router_file::es_read_router_file;
pub use crate::source::{
    es_close, es_engine_error, es_error_count, es_open, es_read, es_read_at, es_read_engine,
    EsSource,
};
pub use crate::source_cache::es_read_cache;

/// The version of this ABI: bumped when a struct or function changes
/// incompatibly (a new field gets a new struct or a `struct_size`, not a bump).
pub const ES_ABI_VERSION: u32 = 1;

/// `ES_ABI_VERSION` of the library actually loaded (compare it with the
/// header's `ES_ABI_VERSION` when linking dynamically).
#[no_mangle]
pub extern "C" fn es_abi_version() -> u32 {
    ES_ABI_VERSION
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soname_is_the_abi_version() {
        let soname = format!("-soname,libengine_state.so.{}\"", super::ES_ABI_VERSION);
        assert!(
            include_str!("../build.rs").contains(&soname),
            "capi/build.rs must set {soname}"
        );
    }
}
