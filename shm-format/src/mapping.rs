//! A mapped engine-state file (an engine's, or a cache digest's) seen as
//! atomic words.
//!
//! The `unsafe` of the crate lives here (turning offsets into the mapping
//! into `&AtomicU64`), in `sigbus` (surviving a file truncated under a
//! mapping) and in `fork` (registering the `pthread_atfork` handler; its
//! tests fork a child).

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::Error;
use crate::layout::{FILE_SIZE, HEADER_SIZE};
use crate::sigbus::{self, Slot};

/// A shared mapping of an engine-state file: `FILE_SIZE` bytes for an
/// engine's file, the size fixed at creation for a cache digest's.
#[derive(Debug)]
pub(crate) struct Mapping {
    map: MmapRaw,
    /// Bytes mapped (every access is checked against it).
    len: usize,
    /// Where the `SIGBUS` handler flags this mapping when the file was
    /// truncated under it.
    slot: &'static Slot,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Before `map` is dropped (unmapped): a later mapping at the same
        // address must never be taken for this one.
        sigbus::unregister(self.slot);
    }
}

impl Mapping {
    /// Maps `file` read-only (`PROT_READ`). The caller checked its size.
    pub(crate) fn read_only(file: &File, path: &Path) -> Result<Mapping, Error> {
        Mapping::read_only_len(file, path, FILE_SIZE)
    }

    /// Maps `file` read-write and shared. The caller checked or reserved its size.
    pub(crate) fn read_write(file: &File, path: &Path) -> Result<Mapping, Error> {
        Mapping::read_write_len(file, path, FILE_SIZE)
    }

    /// Maps the first `len` bytes of `file` read-only (`PROT_READ`). The
    /// caller checked its size.
    pub(crate) fn read_only_len(file: &File, path: &Path, len: usize) -> Result<Mapping, Error> {
        let map = MmapOptions::new()
            .len(len)
            .map_raw_read_only(file)
            .map_err(|e| Error::io("map", path, e))?;
        let slot = sigbus::register(map.as_ptr() as usize, len, false);
        Ok(Mapping { map, len, slot })
    }

    /// Maps the first `len` bytes of `file` read-write and shared. The
    /// caller checked or reserved its size.
    pub(crate) fn read_write_len(file: &File, path: &Path, len: usize) -> Result<Mapping, Error> {
        let map = MmapOptions::new()
            .len(len)
            .map_raw(file)
            .map_err(|e| Error::io("map", path, e))?;
        let slot = sigbus::register(map.as_ptr() as usize, len, true);
        Ok(Mapping { map, len, slot })
    }

    /// Whether the file was truncated under this mapping: a load touched a
    /// page beyond the file's end and the `SIGBUS` handler replaced the
    /// mapping with zero pages. Every load from the mapping before this call
    /// has completed (reading the old bytes, or zero).
    #[inline]
    pub(crate) fn truncated(&self) -> bool {
        self.slot.truncated()
    }

    /// The `u64` word at byte `offset`.
    ///
    /// Panics if `offset` is not 8-aligned or not inside the file.
    #[inline]
    pub(crate) fn word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset % 8 == 0 && offset + 8 <= self.len,
            "word offset {offset} out of layout"
        );
        // SAFETY:
        // - the mapping is `self.len` bytes (length passed to mmap), so
        //   `offset..offset + 8` is inside it; the file was at least that long
        //   when checked (reader) or reserved (writer) and a writer never
        //   truncates it; if another process truncates it anyway, an access
        //   faults once and the `sigbus` handler maps zero pages over the
        //   range (still `self.len` accessible bytes at this address);
        // - mmap returns a page-aligned address and `offset` is a multiple of 8,
        //   so the pointer is aligned for `AtomicU64`, which has the size and
        //   alignment of `u64`;
        // - the mapping lives as long as `self`, and the returned reference
        //   borrows `self`;
        // - every access to these bytes, in every process, goes through atomic
        //   `u64` operations of the same size (this module is the only way in),
        //   so there is no data race and no mixed-size access;
        // - on a read-only mapping only Relaxed loads are done (readers never
        //   store, swap or compare-and-swap).
        unsafe { &*(self.map.as_ptr().add(offset) as *const AtomicU64) }
    }

    /// `N` consecutive words starting at byte `offset`.
    #[inline]
    pub(crate) fn words<const N: usize>(&self, offset: usize) -> &[AtomicU64; N] {
        assert!(
            offset % 8 == 0 && offset + 8 * N <= self.len,
            "words {offset}+{N} out of layout"
        );
        // SAFETY: as in `word`, for the `8 * N` bytes at `offset`, which are
        // inside the mapping (asserted above); `[AtomicU64; N]` has the layout
        // of `[u64; N]`.
        unsafe { &*(self.map.as_ptr().add(offset) as *const [AtomicU64; N]) }
    }

    /// `n` consecutive words starting at byte `offset` (a run whose length
    /// is known only at run time: a cache digest's entries).
    #[inline]
    pub(crate) fn word_slice(&self, offset: usize, n: usize) -> &[AtomicU64] {
        assert!(
            offset % 8 == 0 && n <= self.len / 8 && offset <= self.len - 8 * n,
            "words {offset}+{n} out of the mapping"
        );
        // SAFETY: as in `word`, for the `8 * n` bytes at `offset`, which are
        // inside the mapping (asserted above, without overflow); a slice of
        // `AtomicU64` has the layout of a slice of `u64`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(offset) as *const AtomicU64, n) }
    }

    /// The header words, each loaded Relaxed (only `state` changes after creation).
    pub(crate) fn header(&self) -> crate::layout::Header {
        let words: &[AtomicU64; HEADER_SIZE / 8] = self.words(0);
        let copy: [u64; HEADER_SIZE / 8] =
            core::array::from_fn(|i| words[i].load(Ordering::Relaxed));
        bytemuck::cast(copy)
    }

    /// Bytes `offset..offset + 8 * N`, loaded as Relaxed words (little-endian).
    pub(crate) fn bytes<const N: usize>(&self, offset: usize) -> Vec<u8> {
        let words: &[AtomicU64; N] = self.words(offset);
        words
            .iter()
            .flat_map(|w| w.load(Ordering::Relaxed).to_le_bytes())
            .collect()
    }

    /// Stores `bytes` (a multiple of 8 long) at `offset` as Relaxed words.
    pub(crate) fn store_bytes(&self, offset: usize, bytes: &[u8]) {
        assert!(bytes.len() % 8 == 0);
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            let value = u64::from_le_bytes(chunk.try_into().expect("chunks_exact(8)"));
            self.word(offset + 8 * i).store(value, Ordering::Relaxed);
        }
    }
}
