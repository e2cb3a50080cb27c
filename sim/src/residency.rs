//! Cache residency of one modelled engine: which 512-token router blocks its
//! prefix cache holds in full, published as a [`CacheDigest`] the way the
//! vLLM hook publishes it (docs/FORMAT.md, "Cache residency").
//!
//! Router block `b` of a request covers its 16-token KV blocks
//! `32b .. 32b + 32`; it is held when all 32 of their hashes are cached (in
//! use, or free and not yet evicted), so a request with that prefix would
//! hit it, and it is listed only with every block before it (prefix-closed).
//! The pool reports each KV hash that becomes cached or stops being cached
//! ([`Residency::cached`], [`Residency::evicted`]); a router block counts
//! its cached KV hashes, so a capture costs nothing unless the set changed,
//! and then a copy of the held blocks; the digest (prefix-closed, sorted) is
//! made only from captures a router reads ([`Capture::digest`]).
//! Router blocks are known from the requests the engine was given
//! ([`crate::EngineRequest::router_block_hashes`]): a block is remembered
//! while a live request names it or any of its KV hashes is cached.

use std::cell::{Cell, OnceCell};
use std::rc::Rc;
use std::sync::Arc;

use engine_state_shm_format::CacheDigest;

use crate::kv::U64Map;
use crate::profile::KV_BLOCK_TOKENS;

/// KV blocks per router block (512 / 16).
pub(crate) const KV_PER_ROUTER_BLOCK: usize =
    engine_state_shm_format::blocks::BLOCK_TOKENS / KV_BLOCK_TOKENS as usize;

#[derive(Clone, Debug)]
struct RouterBlock {
    /// The router block before it in its prompt (`None`: the first).
    parent: Option<u64>,
    /// Its KV hashes, to forget their owner with it.
    kv: [u64; KV_PER_ROUTER_BLOCK],
    /// How many of `kv` are cached.
    cached: usize,
    /// Live requests that name it.
    refs: u32,
}

/// The router blocks one engine knows of and how much of each it caches.
#[derive(Clone, Debug, Default)]
pub(crate) struct Residency {
    /// KV hash → the router block it is part of.
    owner: U64Map<u64>,
    blocks: U64Map<RouterBlock>,
    /// The blocks all of whose KV hashes are cached.
    full: U64Map<Held>,
    /// The set of held blocks may have changed since `latest` was built.
    dirty: bool,
    version: u64,
    latest: Option<Rc<Capture>>,
}

impl Residency {
    /// A request arrived naming these router blocks over its KV hashes
    /// (`kv[32b .. 32b + 32]` for router block `b`); `is_cached` says which
    /// KV hashes the pool caches now.
    pub(crate) fn add_request(
        &mut self,
        router: &[u64],
        kv: &[u64],
        is_cached: impl Fn(u64) -> bool,
    ) {
        let mut parent = None;
        for (b, &hash) in router.iter().enumerate() {
            let block = self.blocks.entry(hash).or_insert_with(|| {
                let kv: [u64; KV_PER_ROUTER_BLOCK] = kv
                    [b * KV_PER_ROUTER_BLOCK..(b + 1) * KV_PER_ROUTER_BLOCK]
                    .try_into()
                    .expect("a router block covers 32 KV blocks");
                let cached = kv.iter().filter(|&&h| is_cached(h)).count();
                for &h in kv.iter() {
                    self.owner.insert(h, hash);
                }
                if cached == KV_PER_ROUTER_BLOCK {
                    self.full.insert(hash, Held::new(parent));
                    self.dirty = true;
                }
                RouterBlock {
                    parent,
                    kv,
                    cached,
                    refs: 0,
                }
            });
            block.refs += 1;
            parent = Some(hash);
        }
    }

    /// A request that named these router blocks left the engine.
    pub(crate) fn remove_request(&mut self, router: &[u64]) {
        for hash in router {
            let block = self.blocks.get_mut(hash).expect("named by a live request");
            block.refs -= 1;
            if block.refs == 0 && block.cached == 0 {
                self.forget(*hash);
            }
        }
    }

    /// A KV hash became cached (the first block cached under it).
    #[inline]
    pub(crate) fn cached(&mut self, kv_hash: u64) {
        let Some(&owner) = self.owner.get(&kv_hash) else {
            return;
        };
        let block = self.blocks.get_mut(&owner).expect("owners have blocks");
        block.cached += 1;
        if block.cached == KV_PER_ROUTER_BLOCK {
            self.full.insert(owner, Held::new(block.parent));
            self.dirty = true;
        }
    }

    /// A KV hash is no longer cached (its last block was evicted).
    #[inline]
    pub(crate) fn evicted(&mut self, kv_hash: u64) {
        let Some(&owner) = self.owner.get(&kv_hash) else {
            return;
        };
        let block = self.blocks.get_mut(&owner).expect("owners have blocks");
        if block.cached == KV_PER_ROUTER_BLOCK {
            self.full.remove(&owner);
            self.dirty = true;
        }
        block.cached -= 1;
        if block.cached == 0 && block.refs == 0 {
            self.forget(owner);
        }
    }

    fn forget(&mut self, hash: u64) {
        let block = self.blocks.remove(&hash).expect("known");
        for h in block.kv.iter() {
            if self.owner.get(h) == Some(&hash) {
                self.owner.remove(h);
            }
        }
    }

    /// The held set as of `now_ns`: the same capture while no block became
    /// held or stopped being held, a new version when one did. Cheap (a copy
    /// of the held blocks); the digest is made from it when first read.
    pub(crate) fn capture(&mut self, now_ns: u64) -> Rc<Capture> {
        if let (false, Some(latest)) = (self.dirty, &self.latest) {
            return Rc::clone(latest);
        }
        self.dirty = false;
        self.version += 1;
        let capture = Rc::new(Capture {
            version: self.version,
            captured_ns: now_ns,
            // A clone of the table as it is: no rehashing.
            full: self.full.clone(),
            digest: OnceCell::new(),
        });
        self.latest = Some(Rc::clone(&capture));
        capture
    }
}

/// A held router block: its parent, and whether it is listed (decided
/// when a capture's digest is made).
#[derive(Clone, Debug)]
struct Held {
    parent: Option<u64>,
    listed: Cell<Option<bool>>,
}

impl Held {
    fn new(parent: Option<u64>) -> Held {
        Held {
            parent,
            listed: Cell::new(None),
        }
    }
}

/// One capture of the held router blocks.
#[derive(Debug)]
pub(crate) struct Capture {
    version: u64,
    captured_ns: u64,
    full: U64Map<Held>,
    digest: OnceCell<Arc<CacheDigest>>,
}

impl Capture {
    /// The digest: the held blocks whose predecessors are all held
    /// (prefix-closed), made once.
    pub(crate) fn digest(&self) -> Arc<CacheDigest> {
        let digest = self.digest.get_or_init(|| {
            Arc::new(CacheDigest::new(
                self.version,
                self.captured_ns,
                self.prefix_closed(),
            ))
        });
        Arc::clone(digest)
    }

    /// The held blocks whose every predecessor is held: each block's chain
    /// is walked up to a block already decided (or the first), and the
    /// verdict marks every block walked, so each is looked up about twice.
    fn prefix_closed(&self) -> Vec<u64> {
        let mut chain = Vec::new();
        let mut listed = Vec::with_capacity(self.full.len());
        for (&hash, held) in &self.full {
            let mut at = Some((hash, held));
            let verdict = loop {
                let Some((_, held)) = at else {
                    break true; // reached the first block
                };
                if let Some(known) = held.listed.get() {
                    break known;
                }
                chain.push(held);
                at = match held.parent {
                    None => None,
                    Some(parent) => match self.full.get_key_value(&parent) {
                        Some((&parent, held)) => Some((parent, held)),
                        None => break false,
                    },
                };
            };
            for held in chain.drain(..) {
                held.listed.set(Some(verdict));
            }
            if verdict {
                listed.push(hash);
            }
        }
        listed
    }
}
