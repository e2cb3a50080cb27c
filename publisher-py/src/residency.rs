//! `engine_state._native._ResidencyTracker`: which 512-token router blocks
//! one vLLM engine holds in its prefix cache, for the cache-residency digest
//! (docs/VLLM.md, "Cache residency").
//!
//! A router block is *held* when every one of its KV blocks is in the block
//! pool's cached-hash map (in use, or free and not yet evicted: a request
//! with that prefix would hit) and so is every block before it (vLLM's
//! prefix lookup stops at the first miss). The tracker keeps one entry per
//! router block whose own KV blocks are cached, keyed by vLLM's block hashes
//! (`Request.block_hashes`, each a chained hash over the whole prefix up to
//! its block): the hash at a 512-token boundary names one token prefix, so it
//! maps to the one router hash (`engine_state_shm_format::blocks`) computed
//! from that prefix's tokens. A request that reaches a boundary whose vLLM
//! hash is already mapped (a prefix hit, a resumed preemption) adopts the
//! router hash: each router block is hashed once while it stays cached.
//!
//! What it reads: at each capture the running requests (their block-hash
//! list's length and, only when it grew past a boundary, the tokens to hash),
//! and once more the requests that left `running` since the last capture or
//! that `note` reported admitted (a request can be admitted and finish
//! between two captures), through a strong reference held until then.
//! Evictions: `verify` mode checks every KV block of every entry in the
//! cached-hash map at each capture; `evictions` mode checks only the entries
//! whose KV blocks `note_allocation` saw leave the free queue (the pool's
//! `get_new_blocks` evicts only blocks it takes from the queue's head), and
//! everything when the map itself was replaced (`reset_prefix_cache`) or
//! `note_all_suspect` says so.
//!
//! It knows no vLLM attribute name of its own: the adapter
//! (`engine_state/vllm/_adapter.py`) passes them in.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use engine_state_shm_format::blocks::{next_block_hash, BLOCK_TOKENS, CHAIN_SEED};
use engine_state_shm_format::{cut_prefix_closed, DigestEntry};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

use crate::incremental::{ByAddress, IncrementalCapture};
use crate::publisher::Publisher;

/// A KV block's cached-map key (vLLM's block hash with its KV cache group
/// id), by its first eight bytes: vLLM's block hashes are hash outputs
/// (sha256 by default), already uniform, so two keys of one pool share
/// these bytes with a probability of about n² / 2⁶⁵ (3·10⁻¹⁰ for 100,000
/// cached blocks). Kept as a word, the tracker holds no Python object and
/// allocates nothing per KV block. [`key_of`] makes it.
type Key = u64;

/// Mixes a key (already uniform) for the maps' buckets.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0 ^ value).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type ByKey<V> = HashMap<Key, V, BuildHasherDefault<KeyHasher>>;
type KeySet = HashSet<Key, BuildHasherDefault<KeyHasher>>;

/// The [`Key`] of the cached-map key `hash` + `suffix` (a block hash of a
/// request's `block_hashes`, and the group suffix), or of a whole cached-map
/// key (with an empty suffix): its first eight bytes, zero-padded.
fn key_of(hash: &[u8], suffix: &[u8]) -> Key {
    let mut word = [0u8; 8];
    let n = hash.len().min(8);
    word[..n].copy_from_slice(&hash[..n]);
    let m = suffix.len().min(8 - n);
    word[n..n + m].copy_from_slice(&suffix[..m]);
    u64::from_le_bytes(word)
}

/// One router block whose KV blocks were all cached at the last check.
struct Entry {
    /// Position in the prompt: 0 for the first 512 tokens.
    depth: u32,
    /// The router hash of the block before it (`CHAIN_SEED` at depth 0).
    parent: u64,
    /// The capture that last saw a request reach it.
    last_used: u64,
    /// Its KV blocks' keys, in order (the last one is the boundary's).
    keys: Vec<Key>,
    /// The same KV blocks' whole cached-map keys (verify mode only: it
    /// looks each up at every capture, exactly, not by its first word).
    full_keys: Vec<Py<PyBytes>>,
}

/// What the tracker knows of one request it follows.
struct Followed {
    request: Py<PyAny>,
    /// Its block-hash list (vLLM assigns it once, in `Request.__init__`, and
    /// changes it in place only), or None when it is not a list (then read
    /// at each capture).
    hashes: Option<Py<PyList>>,
    /// Not keyed by tokens alone (LoRA, multimodal, cache salt, prompt
    /// embeddings): left out.
    excluded: bool,
    /// Router blocks of the request already mapped to entries.
    done: usize,
    /// The router hash of its last mapped block (`CHAIN_SEED` for none).
    parent: u64,
    /// The capture that last found it in `running`.
    seen: u64,
    /// The cached-map keys of its next router block already found cached
    /// while it runs (its blocks are in use then: never evicted), so that a
    /// chunked prefill checks each KV block once.
    pending: Vec<Key>,
    /// The key after `pending`, found not cached yet (kept: its hash is
    /// computed once).
    blocked: Option<Py<PyBytes>>,
}

/// A running request as of the last capture, in `running`'s order, for the
/// capture's fast path: while the request is the same object, it needs a
/// look only once its computed tokens reach `next`. Kept apart from
/// `Followed` (contiguous, two words) so that a capture of requests that
/// grew no router block touches neither the followed map nor the request's
/// block-hash list. Only followed requests are listed (the followed map
/// holds a strong reference to each: an address here names one object).
#[derive(Clone, Copy)]
struct Hot {
    /// The request's address (0: none).
    address: usize,
    /// Computed tokens at which its next router block is full (`usize::MAX`
    /// for an excluded request).
    next: usize,
}

/// How evictions are followed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Verify,
    Evictions,
}

#[pyclass(module = "engine_state._native", name = "_ResidencyTracker")]
pub(crate) struct ResidencyTracker {
    kv_block_size: usize,
    /// KV blocks per router block.
    per_block: usize,
    suffix: Vec<u8>,
    mode: Mode,
    block_hashes_attr: Py<PyString>,
    tokens_attr: Py<PyString>,
    computed_attr: Py<PyString>,
    namespace_attrs: Vec<Py<PyString>>,
    next_attr: Py<PyString>,
    hash_attr: Py<PyString>,
    /// Router hash -> entry.
    entries: HashMap<u64, Entry>,
    /// Every KV key of every entry -> the entry's router hash.
    by_key: ByKey<u64>,
    /// Requests followed, by object address (the strong reference keeps the
    /// address from being reused).
    followed: ByAddress<Followed>,
    /// Evictions mode: the cached-map keys `get_new_blocks` was about to
    /// evict since the last capture, with the entry each belongs to: the
    /// capture drops the entry unless the key is cached again.
    suspects: Vec<(u64, Py<PyBytes>)>,
    all_suspect: bool,
    /// The address of the cached-hash map seen at the last capture.
    map_addr: usize,
    /// This capture may take a running request's computed blocks as cached
    /// without looking them up (evictions mode, when no eviction outside
    /// `get_new_blocks` was reported: those take only free blocks).
    trust_running: bool,
    epoch: u64,
    /// The running requests of the last capture, in order (see [`Hot`]).
    hot: Vec<Hot>,
    /// The vector `hot` was built in at the capture before (reused).
    spare_hot: Vec<Hot>,
    /// The incremental capture's reads of `running` (reused).
    reads: Vec<(usize, i64)>,
    /// Requests `note` reported since the last capture.
    noted: Vec<usize>,
    /// Requests that may have left `running` (this capture's candidates).
    left: Vec<usize>,
    /// Captures that had to look at every followed request to find those
    /// that left `running` (none expected).
    full_scans: u64,
    /// The token buffer one router block is read into (reused).
    tokens: Vec<u32>,
    digest: Vec<u64>,
    /// The router hashes in `digest`.
    held_set: HashSet<u64>,
    /// Entries whose parent is not held (not in the digest).
    orphans: usize,
    /// Entries added and whether one was removed since the last derive.
    added: Vec<u64>,
    removed: bool,
    held: usize,
    changed: bool,
    hash_calls: u64,
    adopted: u64,
    lookups: u64,
}

#[pymethods]
impl ResidencyTracker {
    /// `kv_block_size`: the engine's KV block size in tokens (must divide
    /// 512). `group_suffix`: the bytes vLLM appends to a block hash for the
    /// cache's one KV cache group. `mode`: "verify" or "evictions".
    /// `namespace_attrs`: request attributes that, when neither None nor an
    /// empty sequence, mean the request's KV is not keyed by tokens alone.
    /// `next_attr`/`hash_attr`: a free-queue block's link to the next one and
    /// its cached-map key (evictions mode).
    #[new]
    #[pyo3(signature = (*, kv_block_size, group_suffix, mode, block_hashes_attr, tokens_attr, computed_attr, namespace_attrs, next_attr, hash_attr))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        kv_block_size: usize,
        group_suffix: Vec<u8>,
        mode: &str,
        block_hashes_attr: &str,
        tokens_attr: &str,
        computed_attr: &str,
        namespace_attrs: Vec<String>,
        next_attr: &str,
        hash_attr: &str,
    ) -> PyResult<ResidencyTracker> {
        if kv_block_size == 0 || BLOCK_TOKENS % kv_block_size != 0 {
            return Err(PyValueError::new_err(format!(
                "a KV block size of {kv_block_size} tokens does not divide the router block \
                 ({BLOCK_TOKENS} tokens): residency cannot be tracked"
            )));
        }
        let mode = match mode {
            "verify" => Mode::Verify,
            "evictions" => Mode::Evictions,
            other => {
                return Err(PyValueError::new_err(format!(
                    "unknown residency mode {other:?}: use \"verify\" or \"evictions\""
                )))
            }
        };
        let intern = |name: &str| PyString::intern(py, name).unbind();
        Ok(ResidencyTracker {
            kv_block_size,
            per_block: BLOCK_TOKENS / kv_block_size,
            suffix: group_suffix,
            mode,
            block_hashes_attr: intern(block_hashes_attr),
            tokens_attr: intern(tokens_attr),
            computed_attr: intern(computed_attr),
            namespace_attrs: namespace_attrs.iter().map(|n| intern(n)).collect(),
            next_attr: intern(next_attr),
            hash_attr: intern(hash_attr),
            entries: HashMap::new(),
            by_key: ByKey::default(),
            followed: ByAddress::default(),
            suspects: Vec::new(),
            all_suspect: false,
            map_addr: 0,
            trust_running: false,
            epoch: 0,
            hot: Vec::new(),
            spare_hot: Vec::new(),
            reads: Vec::new(),
            noted: Vec::new(),
            left: Vec::new(),
            full_scans: 0,
            tokens: Vec::with_capacity(BLOCK_TOKENS),
            digest: Vec::new(),
            held_set: HashSet::new(),
            orphans: 0,
            added: Vec::new(),
            removed: false,
            held: 0,
            changed: false,
            hash_calls: 0,
            adopted: 0,
            lookups: 0,
        })
    }

    /// Requests `schedule()` just moved into `running`: followed (from their
    /// first block again) until the next capture at least, even if they
    /// finish before it.
    fn note(&mut self, requests: &Bound<'_, PyAny>) -> PyResult<()> {
        for request in requests.try_iter()? {
            let request = request?;
            let address = request.as_ptr() as usize;
            for hot in self.hot.iter_mut().filter(|h| h.address == address) {
                hot.address = 0;
            }
            self.noted.push(address);
            let followed = self.follow(&request)?;
            followed.done = 0;
            followed.parent = CHAIN_SEED;
            followed.pending.clear();
            followed.blocked = None;
        }
        Ok(())
    }

    /// Evictions mode: `count` blocks are about to be taken from the head of
    /// the free queue (`first`: the head's first block); the cached-map keys
    /// they hold are evicted, and the entries they belong to become suspects.
    fn note_allocation(&mut self, first: &Bound<'_, PyAny>, count: usize) -> PyResult<()> {
        let next = self.next_attr.bind(first.py());
        let hash = self.hash_attr.bind(first.py());
        let mut block = first.clone();
        for _ in 0..count {
            let key = block.getattr(hash)?;
            if !key.is_none() {
                if let Ok(bytes) = key.downcast_into::<PyBytes>() {
                    if let Some(&router) = self.by_key.get(&key_of(bytes.as_bytes(), &[])) {
                        self.suspects.push((router, bytes.unbind()));
                    }
                }
            }
            let following = block.getattr(next)?;
            if following.is_none() {
                break;
            }
            block = following;
        }
        Ok(())
    }

    /// Evictions mode: the next capture checks every entry (blocks evicted
    /// by another path, e.g. a connector's `evict_blocks`).
    fn note_all_suspect(&mut self) {
        self.all_suspect = true;
    }

    /// Follows the engine up to now: checks entries against `cached` (the
    /// pool's cached-hash map, a dict), maps the new full router blocks of
    /// the `running` requests and of the requests followed since the last
    /// capture, then derives the prefix-closed digest. True when the digest
    /// changed. `reads`: the hook's incremental capture, when it has just
    /// read `running` (its computed tokens are taken from it, not read
    /// again).
    #[pyo3(signature = (running, cached, reads=None))]
    fn capture(
        &mut self,
        running: &Bound<'_, PyAny>,
        cached: &Bound<'_, PyDict>,
        reads: Option<PyRefMut<'_, IncrementalCapture>>,
    ) -> PyResult<bool> {
        self.epoch += 1;
        let epoch = self.epoch;
        let mut dirty = self.check(cached)?;
        let py = running.py();
        let list = running.downcast::<PyList>()?;
        let hashes_attr = self.block_hashes_attr.clone_ref(py).into_bound(py);
        let computed_attr = self.computed_attr.clone_ref(py).into_bound(py);
        let mut read = std::mem::take(&mut self.reads);
        match reads {
            Some(mut capture) => capture.take_running_reads(list, &mut read),
            None => read.clear(),
        }
        let previous = std::mem::take(&mut self.hot);
        let mut hot = std::mem::take(&mut self.spare_hot);
        hot.clear();
        hot.reserve(list.len());
        let mut cursor = 0;
        for (position, request) in list.iter().enumerate() {
            let address = request.as_ptr() as usize;
            let mut computed = read
                .get(position)
                .filter(|(at, _)| *at == address)
                .map(|&(_, computed)| computed.max(0) as usize);
            // The common case: a request the last capture saw running, with
            // no new full router block. vLLM keeps `running` in order (it
            // drops finished and preempted requests and appends admitted
            // ones), so its entry is at the cursor or after it: those
            // skipped over left `running`. (Were `running` reordered, a
            // request found behind the cursor takes the slow path.)
            let window = &previous[cursor..];
            if let Some(at) = window.iter().position(|h| h.address == address) {
                let last = previous[cursor + at];
                // Those skipped over may have left `running`.
                self.left.extend(window[..at].iter().map(|h| h.address));
                cursor += at + 1;
                if last.next == usize::MAX {
                    hot.push(last);
                    continue;
                }
                let now = match computed {
                    Some(now) => now,
                    None => request.getattr(&computed_attr)?.extract()?,
                };
                if now < last.next {
                    hot.push(last);
                    continue;
                }
                computed = Some(now);
            }
            if let Some(followed) = self.followed.get_mut(&address) {
                followed.seen = epoch;
                if !followed.excluded {
                    let available = match &followed.hashes {
                        Some(list) => list.bind(py).len(),
                        None => request.getattr(&hashes_attr)?.len()?,
                    };
                    if available / self.per_block > followed.done {
                        let mut followed = self.followed.remove(&address).expect("followed");
                        let advanced =
                            self.advance(&mut followed, &request, cached, true, computed);
                        self.followed.insert(address, followed);
                        dirty |= advanced?;
                    }
                }
            } else {
                self.follow(&request)?.seen = epoch;
                let mut followed = self.followed.remove(&address).expect("followed");
                let advanced = self.advance(&mut followed, &request, cached, true, computed);
                self.followed.insert(address, followed);
                dirty |= advanced?;
            }
            let followed = &self.followed[&address];
            hot.push(Hot {
                address,
                next: if followed.excluded {
                    usize::MAX
                } else {
                    (followed.done + 1) * BLOCK_TOKENS
                },
            });
        }
        // Every running request is followed now. Those that left `running`
        // since the last capture are among the last capture's running
        // requests that this one did not find in order, and the requests
        // `note` reported since (admitted, and maybe finished already):
        // those not seen by this capture's slow path. Mapped a last time,
        // then dropped.
        self.left
            .extend(previous[cursor..].iter().map(|h| h.address));
        self.left.append(&mut self.noted);
        let mut left = std::mem::take(&mut self.left);
        if self.followed.len() > hot.len() {
            left.sort_unstable();
            left.dedup();
            left.retain(|address| self.followed.get(address).is_some_and(|f| f.seen != epoch));
            if self.followed.len() - left.len() > hot.len() {
                // (Not expected: a request followed and neither running nor
                // a candidate.) Every request, as a full capture would.
                left = self.unseen(list, epoch);
                self.full_scans += 1;
            }
        } else {
            left.clear();
        }
        for address in left.drain(..) {
            let mut followed = self.followed.remove(&address).expect("followed");
            let request = followed.request.clone_ref(py).into_bound(py);
            // Its blocks may be free now: check every one.
            followed.pending.clear();
            followed.blocked = None;
            dirty |= self.advance(&mut followed, &request, cached, false, None)?;
        }
        self.left = left;
        self.hot = hot;
        self.spare_hot = previous;
        self.reads = read;
        self.changed = dirty;
        if dirty {
            self.derive();
        }
        Ok(dirty)
    }

    /// The held router blocks (prefix-closed), ascending, as of the last
    /// capture, at most `capacity` of them: when more are held, those
    /// nearest the prompt's start first, then the most recently used
    /// (`held` counts them all).
    #[pyo3(signature = (capacity=None))]
    fn blocks(&self, capacity: Option<usize>) -> Vec<u64> {
        match capacity {
            Some(capacity) if capacity < self.digest.len() => self.cut(capacity),
            _ => self.digest.clone(),
        }
    }

    /// Publishes the digest as of the last capture through `publisher`
    /// (`Publisher.publish_cache`: at most `capacity` blocks, cut as
    /// `blocks` does, and how many were held), without a Python list. True
    /// when the publisher wrote a new digest version. The digest's header
    /// carries the tracker's KV block size.
    fn publish(&self, publisher: &Bound<'_, Publisher>, capacity: usize) -> PyResult<bool> {
        // Checked in `new`: divides 512.
        let tokens = Some(self.kv_block_size as u32);
        let mut publisher = publisher.try_borrow_mut()?;
        if capacity < self.digest.len() {
            publisher.publish_cache_blocks(&self.cut(capacity), self.held as u64, capacity, tokens)
        } else {
            publisher.publish_cache_blocks(&self.digest, self.held as u64, capacity, tokens)
        }
    }

    /// Router blocks held at the last capture.
    #[getter]
    fn held(&self) -> usize {
        self.held
    }

    /// Router blocks whose own KV blocks are cached (held or not: a block
    /// whose predecessor was evicted is not held).
    #[getter]
    fn entries(&self) -> usize {
        self.entries.len()
    }

    /// True when the last capture changed the digest.
    #[getter]
    fn changed(&self) -> bool {
        self.changed
    }

    /// Router blocks hashed so far (each hashes 512 tokens).
    #[getter]
    fn hash_calls(&self) -> u64 {
        self.hash_calls
    }

    /// Router blocks a request reached that were already mapped (no hashing).
    #[getter]
    fn adopted(&self) -> u64 {
        self.adopted
    }

    /// Captures that looked at every followed request to find those that
    /// left `running` (0 while vLLM keeps `running` as the tracker expects).
    #[getter]
    fn full_scans(&self) -> u64 {
        self.full_scans
    }

    /// Cached-map lookups so far.
    #[getter]
    fn lookups(&self) -> u64 {
        self.lookups
    }

    /// Requests currently followed.
    #[getter]
    fn followed(&self) -> usize {
        self.followed.len()
    }

    #[getter]
    fn kv_block_size(&self) -> usize {
        self.kv_block_size
    }

    /// Forgets everything (the next capture starts from the running requests).
    fn clear(&mut self) {
        self.entries.clear();
        self.by_key.clear();
        self.followed.clear();
        self.hot.clear();
        self.noted.clear();
        self.left.clear();
        self.suspects.clear();
        self.digest.clear();
        self.held_set.clear();
        self.orphans = 0;
        self.added.clear();
        self.removed = false;
        self.held = 0;
    }
}

impl ResidencyTracker {
    /// The followed requests not in `running` (marking those in it seen by
    /// this capture, `epoch`).
    fn unseen(&mut self, running: &Bound<'_, PyList>, epoch: u64) -> Vec<usize> {
        for request in running.iter() {
            if let Some(followed) = self.followed.get_mut(&(request.as_ptr() as usize)) {
                followed.seen = epoch;
            }
        }
        self.followed
            .iter()
            .filter(|(_, f)| f.seen != epoch)
            .map(|(&address, _)| address)
            .collect()
    }

    /// The followed state of `request`, created if new.
    fn follow(&mut self, request: &Bound<'_, PyAny>) -> PyResult<&mut Followed> {
        let address = request.as_ptr() as usize;
        if !self.followed.contains_key(&address) {
            let excluded = self.excluded(request)?;
            let hashes = request
                .getattr(self.block_hashes_attr.bind(request.py()))?
                .downcast_into::<PyList>()
                .ok()
                .map(Bound::unbind);
            self.followed.insert(
                address,
                Followed {
                    request: request.clone().unbind(),
                    hashes,
                    excluded,
                    done: 0,
                    parent: CHAIN_SEED,
                    seen: 0,
                    pending: Vec::new(),
                    blocked: None,
                },
            );
        }
        Ok(self.followed.get_mut(&address).expect("inserted"))
    }

    /// True when the request's KV is not keyed by its tokens alone.
    fn excluded(&self, request: &Bound<'_, PyAny>) -> PyResult<bool> {
        for name in &self.namespace_attrs {
            let Ok(value) = request.getattr(name.bind(request.py())) else {
                continue;
            };
            if value.is_none() {
                continue;
            }
            if let Ok(list) = value.downcast::<PyList>() {
                if list.is_empty() {
                    continue;
                }
            }
            if let Ok(text) = value.downcast::<PyString>() {
                if text.to_str()?.is_empty() {
                    continue;
                }
            }
            return Ok(true);
        }
        Ok(false)
    }

    /// Drops the entries whose KV blocks left the cached map; true when one did.
    ///
    /// Verify mode: every KV block of every entry, looked up by its whole
    /// key. Evictions mode when the map was replaced or `note_all_suspect`
    /// was called: every KV block of every entry, against the keys of the
    /// map read once (by their first word). Otherwise only the keys
    /// `note_allocation` saw evicted: an entry whose other blocks were not
    /// taken from the free queue still has them.
    fn check(&mut self, cached: &Bound<'_, PyDict>) -> PyResult<bool> {
        let address = cached.as_ptr() as usize;
        let everything = self.mode == Mode::Verify || self.all_suspect || address != self.map_addr;
        self.map_addr = address;
        self.all_suspect = false;
        self.trust_running = !everything;
        let mut gone = Vec::new();
        if self.mode == Mode::Verify {
            let py = cached.py();
            for (&router, entry) in &self.entries {
                for key in &entry.full_keys {
                    self.lookups += 1;
                    if !cached.contains(key.bind(py))? {
                        gone.push(router);
                        break;
                    }
                }
            }
        } else if everything {
            self.suspects.clear();
            let mut present: KeySet =
                KeySet::with_capacity_and_hasher(cached.len(), Default::default());
            for (key, _) in cached.iter() {
                present.insert(key_of(key.downcast::<PyBytes>()?.as_bytes(), &[]));
            }
            for (&router, entry) in &self.entries {
                self.lookups += entry.keys.len() as u64;
                if !entry.keys.iter().all(|key| present.contains(key)) {
                    gone.push(router);
                }
            }
        } else {
            let py = cached.py();
            for (router, key) in std::mem::take(&mut self.suspects) {
                if !self.entries.contains_key(&router) {
                    continue;
                }
                self.lookups += 1;
                if !cached.contains(key.bind(py))? {
                    gone.push(router);
                }
            }
        }
        let dirty = !gone.is_empty();
        for router in gone {
            self.remove(router);
        }
        Ok(dirty)
    }

    fn remove(&mut self, router: u64) {
        if let Some(entry) = self.entries.remove(&router) {
            for key in &entry.keys {
                self.by_key.remove(key);
            }
            self.removed = true;
        }
    }

    /// Maps the request's full router blocks past those already mapped, as
    /// far as they are cached; true when an entry was added. `computed`: a
    /// running request's computed tokens (None: not running, or not read
    /// yet).
    fn advance(
        &mut self,
        followed: &mut Followed,
        request: &Bound<'_, PyAny>,
        cached: &Bound<'_, PyDict>,
        running: bool,
        computed: Option<usize>,
    ) -> PyResult<bool> {
        if followed.excluded {
            return Ok(false);
        }
        let py = request.py();
        let hashes = match &followed.hashes {
            Some(list) => list.bind(py).clone().into_any(),
            None => request.getattr(self.block_hashes_attr.bind(py))?,
        };
        let mut kv_blocks = hashes.len()?;
        if running {
            // vLLM caches a running request's blocks as it schedules them:
            // none past its computed tokens.
            let computed = match computed {
                Some(computed) => computed,
                None => request.getattr(self.computed_attr.bind(py))?.extract()?,
            };
            kv_blocks = kv_blocks.min(computed / self.kv_block_size);
        }
        let available = kv_blocks / self.per_block;
        if available <= followed.done {
            return Ok(false);
        }
        let m = self.per_block;
        let list = hashes.downcast::<PyList>().ok();
        let hash_at = |i: usize| -> PyResult<Bound<'_, PyBytes>> {
            let item = match &list {
                Some(list) => list.get_item(i)?,
                None => hashes.get_item(i)?,
            };
            let hash = item.downcast_into::<PyBytes>()?;
            if hash.as_bytes().len() < 8 {
                // Keys are a hash's first 8 bytes (see `Key`).
                return Err(PyValueError::new_err(format!(
                    "a block hash of {} bytes: cache residency needs hashes of at least 8 bytes \
                     (vLLM's sha256 and xxhash options give 32 and 8)",
                    hash.as_bytes().len()
                )));
            }
            Ok(hash)
        };
        let mut added = false;
        while followed.done < available {
            let depth = followed.done;
            let last = (depth + 1) * m - 1;
            let boundary = key_of(hash_at(last)?.as_bytes(), &self.suffix);
            if let Some(&router) = self.by_key.get(&boundary) {
                let entry = self.entries.get_mut(&router).expect("keys name entries");
                if entry.depth as usize == depth && entry.parent == followed.parent {
                    entry.last_used = self.epoch;
                    self.adopted += 1;
                    followed.pending.clear();
                    followed.blocked = None;
                    followed.parent = router;
                    followed.done += 1;
                    continue;
                }
                // A vLLM hash names one prefix, so this cannot happen; should
                // it, the entry is not trusted.
                self.remove(router);
            }
            // Not mapped: are all its KV blocks cached?
            let mut keys = std::mem::take(&mut followed.pending);
            // vLLM caches a running request's blocks when it schedules them,
            // and they are in use (allocation evicts free blocks only): no
            // lookup needed then, except for the router block's last KV
            // block. vLLM caches only up to the tokens known at schedule
            // time, so a block its last decoded token completed since (under
            // async scheduling, before the next schedule) is full but not yet
            // cached; the blocks before it were completed, and cached, by an
            // earlier schedule.
            let trusted = running && self.trust_running;
            for i in depth * m + keys.len()..=last {
                let hash = hash_at(i)?;
                if !trusted || i == last {
                    let full = match followed.blocked.take() {
                        Some(full) => full.into_bound(py),
                        None => self.full_key(&hash)?,
                    };
                    self.lookups += 1;
                    if !cached.contains(&full)? {
                        if running {
                            followed.pending = keys;
                            followed.blocked = Some(full.unbind());
                        }
                        return Ok(added);
                    }
                }
                keys.push(key_of(hash.as_bytes(), &self.suffix));
            }
            let tokens = request.getattr(self.tokens_attr.bind(py))?;
            read_tokens(&tokens, depth * BLOCK_TOKENS, &mut self.tokens)?;
            let router = next_block_hash(followed.parent, &self.tokens);
            self.hash_calls += 1;
            // The same prefix under other vLLM hashes (cannot happen with
            // one hash seed): one entry.
            self.remove(router);
            for &key in &keys {
                self.by_key.insert(key, router);
            }
            let full_keys = if self.mode == Mode::Verify {
                (depth * m..=last)
                    .map(|i| Ok(self.full_key(&hash_at(i)?)?.unbind()))
                    .collect::<PyResult<Vec<_>>>()?
            } else {
                Vec::new()
            };
            self.added.push(router);
            self.entries.insert(
                router,
                Entry {
                    depth: depth as u32,
                    parent: followed.parent,
                    last_used: self.epoch,
                    keys,
                    full_keys,
                },
            );
            added = true;
            followed.parent = router;
            followed.done += 1;
        }
        Ok(added)
    }

    /// The cached-map key of one vLLM block hash: the hash and the group
    /// suffix, as Python bytes (what the map is looked up with).
    fn full_key<'py>(&self, hash: &Bound<'py, PyBytes>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = hash.as_bytes();
        PyBytes::new_with(hash.py(), bytes.len() + self.suffix.len(), |out| {
            out[..bytes.len()].copy_from_slice(bytes);
            out[bytes.len()..].copy_from_slice(&self.suffix);
            Ok(())
        })
    }

    /// The prefix-closed set: an entry is held when its parent is (depth 0:
    /// always).
    fn derive(&mut self) {
        let added = std::mem::take(&mut self.added);
        if !self.removed && self.orphans == 0 {
            // Additions only, each after its parent: the digest grows.
            let mut grown = true;
            for router in &added {
                let Some(entry) = self.entries.get(router) else {
                    continue;
                };
                if entry.depth == 0 || self.held_set.contains(&entry.parent) {
                    if self.held_set.insert(*router) {
                        let at = self.digest.partition_point(|h| h < router);
                        self.digest.insert(at, *router);
                    }
                } else {
                    grown = false;
                    break;
                }
            }
            if grown {
                self.held = self.digest.len();
                return;
            }
        }
        self.removed = false;
        let mut by_depth: Vec<(u32, u64, u64)> = self
            .entries
            .iter()
            .map(|(&router, e)| (e.depth, router, e.parent))
            .collect();
        by_depth.sort_unstable();
        let mut held: HashSet<u64> = HashSet::with_capacity(by_depth.len());
        for (depth, router, parent) in by_depth {
            if depth == 0 || held.contains(&parent) {
                held.insert(router);
            }
        }
        let mut digest: Vec<u64> = held.iter().copied().collect();
        digest.sort_unstable();
        self.held = digest.len();
        self.orphans = self.entries.len() - self.held;
        self.digest = digest;
        self.held_set = held;
    }

    /// The overflow rule (docs/FORMAT.md, "Cache residency"): by depth
    /// ascending, then most recently used first; prefix-closed because every
    /// block's parent is shallower.
    fn cut(&self, capacity: usize) -> Vec<u64> {
        // The format's overflow rule (docs/FORMAT.md, "Capacity and
        // overflow"); the digest is in hash order, so ties keep hash order.
        // (A capture that failed after dropping entries leaves the digest
        // naming them: those are not listed.)
        let mut entries: Vec<DigestEntry> = self
            .digest
            .iter()
            .filter_map(|&hash| {
                let entry = self.entries.get(&hash)?;
                Some(DigestEntry {
                    hash,
                    depth: entry.depth,
                    last_used: entry.last_used,
                })
            })
            .collect();
        cut_prefix_closed(&mut entries, capacity);
        let mut kept: Vec<u64> = entries.into_iter().map(|e| e.hash).collect();
        kept.sort_unstable();
        kept
    }
}

/// The 512 token ids from `start` of a request's token list, into `block`.
fn read_tokens(tokens: &Bound<'_, PyAny>, start: usize, block: &mut Vec<u32>) -> PyResult<()> {
    block.clear();
    if let Ok(list) = tokens.downcast::<PyList>() {
        if start + BLOCK_TOKENS > list.len() {
            return Err(PyValueError::new_err(format!(
                "a request's token list has {} tokens, fewer than its block hashes cover",
                list.len()
            )));
        }
        for i in start..start + BLOCK_TOKENS {
            block.push(list_token(list, i)?);
        }
    } else {
        for i in start..start + BLOCK_TOKENS {
            block.push(tokens.get_item(i)?.extract::<u32>()?);
        }
    }
    Ok(())
}

/// Item `i` of a token list as a token id: an exact `int` is read in
/// place (no reference taken, no Python code run); anything else through a
/// checked read (its `__index__` may run Python code, which may change the
/// list: the next item's read checks the length again).
fn list_token(list: &Bound<'_, PyList>, i: usize) -> PyResult<u32> {
    let ptr = list.as_ptr();
    // SAFETY:
    // - `ptr` is a live list (`list` holds a strong reference) and the GIL is
    //   held (`list` is bound to it), so no other thread changes it;
    // - `i < PyList_GET_SIZE` is checked right before the unchecked read, and
    //   nothing runs between the check and the read;
    // - the item is borrowed only until `PyLong_AsLong` returns; for an exact
    //   int that call runs no Python code (no `__index__`), so nothing can
    //   drop the item or change the list meanwhile.
    unsafe {
        if (i as pyo3::ffi::Py_ssize_t) < pyo3::ffi::PyList_GET_SIZE(ptr) {
            let item = pyo3::ffi::PyList_GET_ITEM(ptr, i as pyo3::ffi::Py_ssize_t);
            if pyo3::ffi::PyLong_CheckExact(item) != 0 {
                let value = pyo3::ffi::PyLong_AsLong(item);
                if (0..=u32::MAX as std::os::raw::c_long).contains(&value) {
                    return Ok(value as u32);
                }
            }
        }
    }
    // A non-int, a value out of range (the checked read raises its error,
    // clearing the one `PyLong_AsLong` may have set) or a list that shrank.
    let _ = PyErr::take(list.py());
    list.get_item(i)?.extract::<u32>()
}
