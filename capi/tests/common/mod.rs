//! What the C ABI's integration tests share.

use std::ffi::CString;
use std::ptr::null_mut;

use engine_state::{es_open, es_options_init_sized, EsCode, EsOptions, EsSource};

/// `es_open` of `uri` with options of `struct_size` bytes (a program built
/// against that header version) and `read_cache_digests` set to `digests`.
pub fn open_source(uri: &str, digests: bool, struct_size: usize) -> *mut EsSource {
    let uri = CString::new(uri).unwrap();
    let mut options = EsOptions::default();
    // SAFETY: a writable EsOptions of its size.
    let code = unsafe { es_options_init_sized(&mut options, std::mem::size_of::<EsOptions>()) };
    assert_eq!(code, EsCode::Ok);
    options.read_cache_digests = u32::from(digests);
    options.struct_size = struct_size;
    let mut source = null_mut();
    // SAFETY: a C string, initialized options and a writable out pointer.
    let code = unsafe { es_open(uri.as_ptr(), &options, &mut source) };
    assert_eq!(code, EsCode::Ok);
    source
}
