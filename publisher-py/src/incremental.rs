//! `engine_state._native._IncrementalCapture`: the hook's capture when most
//! waiting requests cannot have changed since the last one (issue 13).
//!
//! A capture reads every running request and every request of the queues it
//! is told to read in full (vLLM's `kv_holding_waiting`), like
//! `_RequestCapture`. Of the one *cached* queue (vLLM's `waiting`) it reads
//! only the requests it has not seen there at the previous capture, and the
//! requests the hook marked *volatile* (`mark_volatile`: preempted since they
//! were last running). For the others it compares identities only and keeps
//! the contribution it read before. Why that is exact for vLLM 0.33 is in
//! `docs/VLLM.md` ("What the capture caches").
//!
//! Every cached entry holds a strong reference to its request, so the
//! request's address (the key) cannot be reused by another object while the
//! entry exists. Entries whose request was not in the cached queue at a
//! capture are dropped at its end. `max_prefill_remaining` stays exact
//! through a count of the cached requests per remaining-prefill value.
//!
//! Running requests are read at every capture, but their prompt length and
//! token list only when they are new to `running` or the hook reported them
//! admitted since (`forget_running`); then the token count is the length of
//! the remembered list. vLLM changes a prompt length only for a streaming
//! session between two of its turns, outside `running`; a request enters
//! `running` only by admission, which every `SchedulerOutput` reports; and a
//! request's token list is never replaced, only changed in place (its
//! `all_token_ids` is a read-only view of that list object).
//!
//! `recount` reads everything as a full capture does and returns both sums,
//! so that the hook can cross-check the cache and fall back to full captures
//! on any difference.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use pyo3::prelude::*;
use pyo3::types::PyList;

use engine_state_shm_format::{RequestTokens, Snapshot, WaitingRequest};

use crate::request_reader::{for_each, RequestReader};
use crate::totals::Totals;

/// A map keyed by object address. The default SipHash costs about as much
/// as the rest of a cached request's lookup; an address needs no protection
/// against chosen keys, only mixing (`AddressHasher`).
pub(crate) type ByAddress<V> = HashMap<usize, V, BuildHasherDefault<AddressHasher>>;

/// Hashes one address: a folded 64x64->128-bit multiply, so that every bit
/// of the address (whose low four are always zero) reaches every bit of the
/// hash.
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        let product = u128::from(self.0 ^ value) * 0x9E37_79B9_7F4A_7C15;
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Aggregates the same fields as `_RequestCapture`, reading only the waiting
/// requests that may have changed.
#[pyclass(module = "engine_state._native", name = "_IncrementalCapture")]
pub(crate) struct IncrementalCapture {
    reader: RequestReader,
    cache: WaitingCache,
    /// Requests to read at every capture while they wait, by address.
    volatile: ByAddress<Marked>,
    /// The prompt length of each running request, by address.
    prompts: ByAddress<Prompt>,
    /// Numbers the last capture, to tell which entries it saw.
    generation: u64,
    /// Requests read (not answered from the cache) by the last capture.
    last_reads: u64,
    /// The last capture's running requests, in order: their addresses and
    /// computed tokens, for the residency tracker to take
    /// ([`IncrementalCapture::take_running_reads`]) instead of reading them
    /// again.
    running_reads: Vec<(usize, i64)>,
    /// The address of the `running` list they were read from.
    running_list: usize,
}

/// A cached waiting request.
struct Entry {
    /// Keeps the address (the key) from being reused while the entry lives.
    _request: Py<PyAny>,
    contribution: WaitingRequest,
    seen: u64,
}

/// What stays the same about a running request while it runs.
struct Prompt {
    /// Keeps the address (the key) from being reused while the entry lives.
    _request: Py<PyAny>,
    prompt: i64,
    /// The request's token list, when `tokens_attr` names one.
    tokens: Option<Py<PyList>>,
    seen: u64,
}

/// A volatile request.
struct Marked {
    /// Keeps the address (the key) from being reused while it is marked.
    _request: Py<PyAny>,
    seen: u64,
}

/// The cached requests and their sums.
#[derive(Default)]
struct WaitingCache {
    entries: ByAddress<Entry>,
    pending_prefill_tokens: u64,
    num_preempted: u64,
    /// How many cached requests have each remaining prefill (> 0).
    remaining_counts: BTreeMap<u64, u64>,
}

#[pymethods]
impl IncrementalCapture {
    /// Takes the same arguments as `_RequestCapture`.
    #[new]
    #[pyo3(signature = (*, prompt_attr, computed_attr, tokens_attr, tokens_is_sequence, status_attr, preempted_status))]
    fn new(
        py: Python<'_>,
        prompt_attr: &str,
        computed_attr: &str,
        tokens_attr: &str,
        tokens_is_sequence: bool,
        status_attr: &str,
        preempted_status: Py<PyAny>,
    ) -> IncrementalCapture {
        IncrementalCapture {
            reader: RequestReader::new(
                py,
                prompt_attr,
                computed_attr,
                tokens_attr,
                tokens_is_sequence,
                status_attr,
                preempted_status,
            ),
            cache: WaitingCache::default(),
            volatile: ByAddress::default(),
            prompts: ByAddress::default(),
            generation: 0,
            last_reads: 0,
            running_reads: Vec::new(),
            running_list: 0,
        }
    }

    /// The same sums as `_RequestCapture.capture(running, read_queues +
    /// [cached_queue])`, reading of `cached_queue` only the requests that are
    /// new to it or volatile.
    fn capture(
        &mut self,
        running: &Bound<'_, PyAny>,
        read_queues: Vec<Bound<'_, PyAny>>,
        cached_queue: &Bound<'_, PyAny>,
    ) -> PyResult<Totals> {
        let (incremental, _) = self.run(running, &read_queues, cached_queue, false)?;
        Ok(Totals::from(incremental))
    }

    /// Reads every request: returns `(incremental, full)`, the sums
    /// `capture` would have returned and those of a full capture. They
    /// differ only if a cached contribution went stale.
    fn recount(
        &mut self,
        running: &Bound<'_, PyAny>,
        read_queues: Vec<Bound<'_, PyAny>>,
        cached_queue: &Bound<'_, PyAny>,
    ) -> PyResult<(Totals, Totals)> {
        let (incremental, full) = self.run(running, &read_queues, cached_queue, true)?;
        Ok((
            Totals::from(incremental),
            Totals::from(full.unwrap_or(incremental)),
        ))
    }

    /// Reads `request` at every capture for as long as it is in a waiting
    /// queue (the hook marks requests preempted since they last ran).
    fn mark_volatile(&mut self, request: &Bound<'_, PyAny>) {
        let seen = self.generation;
        self.volatile
            .entry(request.as_ptr() as usize)
            .or_insert_with(|| Marked {
                _request: request.clone().unbind(),
                seen,
            });
    }

    /// Reads the prompt length of each of `requests` (admitted to `running`
    /// since the last capture) again at the next capture.
    fn forget_running(&mut self, requests: Vec<Bound<'_, PyAny>>) {
        for request in requests {
            self.prompts.remove(&(request.as_ptr() as usize));
        }
    }

    /// Forgets every cached and volatile request (their references too).
    fn clear(&mut self) {
        self.cache = WaitingCache::default();
        self.volatile.clear();
        self.prompts.clear();
    }

    /// Waiting requests answered from the cache at the last capture.
    #[getter]
    fn num_cached(&self) -> usize {
        self.cache.entries.len()
    }

    /// Requests marked volatile.
    #[getter]
    fn num_volatile(&self) -> usize {
        self.volatile.len()
    }

    /// Requests the last capture read (running, fully read queues, and the
    /// new or volatile ones of the cached queue).
    #[getter]
    fn last_reads(&self) -> u64 {
        self.last_reads
    }
}

impl IncrementalCapture {
    /// The running requests the last capture read (address, computed
    /// tokens), in `running`'s order, handed out once and only for the same
    /// list (`running`, as long as it was): a caller that takes them right
    /// after the capture reads the same values; a later caller, or one
    /// with another list, gets nothing (and checks each address anyway).
    pub(crate) fn take_running_reads(
        &mut self,
        running: &Bound<'_, PyList>,
        into: &mut Vec<(usize, i64)>,
    ) {
        into.clear();
        if self.running_list == running.as_ptr() as usize
            && self.running_reads.len() == running.len()
        {
            std::mem::swap(into, &mut self.running_reads);
        }
        self.running_reads.clear();
        self.running_list = 0;
    }

    /// One capture; with `verify` also the full capture's totals, read
    /// request by request.
    fn run(
        &mut self,
        running: &Bound<'_, PyAny>,
        read_queues: &[Bound<'_, PyAny>],
        cached_queue: &Bound<'_, PyAny>,
        verify: bool,
    ) -> PyResult<(Snapshot, Option<Snapshot>)> {
        self.generation += 1;
        let generation = self.generation;
        let reader = &self.reader;
        let volatile = &mut self.volatile;
        let cache = &mut self.cache;
        let prompts = &mut self.prompts;
        let running_reads = &mut self.running_reads;
        running_reads.clear();
        self.running_list = running.as_ptr() as usize;
        let mut totals = Snapshot::default();
        let mut full = verify.then(Snapshot::default);
        let mut reads = 0;
        for_each(running, |request| {
            let key = request.as_ptr() as usize;
            let fields = match prompts.get_mut(&key) {
                Some(entry) => {
                    entry.seen = generation;
                    let tokens = match &entry.tokens {
                        Some(list) => list.bind(request.py()).len() as i64,
                        None => reader.tokens(&reader.tokens_value(request)?)?,
                    };
                    RequestTokens {
                        prompt: entry.prompt,
                        computed: reader.computed(request)?,
                        tokens,
                    }
                }
                None => {
                    let prompt = reader.prompt(request)?;
                    let value = reader.tokens_value(request)?;
                    let fields = RequestTokens {
                        prompt,
                        computed: reader.computed(request)?,
                        tokens: reader.tokens(&value)?,
                    };
                    let tokens = match value.downcast_into::<PyList>() {
                        Ok(list) if reader.tokens_is_sequence() => Some(list.unbind()),
                        _ => None,
                    };
                    let entry = Prompt {
                        _request: request.clone().unbind(),
                        prompt,
                        tokens,
                        seen: generation,
                    };
                    prompts.insert(key, entry);
                    fields
                }
            };
            totals.add_running(fields);
            running_reads.push((key, fields.computed));
            if let Some(full) = full.as_mut() {
                full.add_running(reader.tokens_of(request)?);
            }
            reads += 1;
            Ok(())
        })?;
        prompts.retain(|_, entry| entry.seen == generation);
        for queue in read_queues {
            for_each(queue, |request| {
                if let Some(marked) = volatile.get_mut(&(request.as_ptr() as usize)) {
                    marked.seen = generation;
                }
                let contribution = reader.waiting(request)?;
                totals.add_waiting(contribution);
                if let Some(full) = full.as_mut() {
                    full.add_waiting(contribution);
                }
                reads += 1;
                Ok(())
            })?;
        }
        for_each(cached_queue, |request| {
            let key = request.as_ptr() as usize;
            let fresh = if let Some(marked) = volatile.get_mut(&key) {
                marked.seen = generation;
                cache.remove(key);
                let contribution = reader.waiting(request)?;
                totals.add_waiting(contribution);
                reads += 1;
                Some(contribution)
            } else if let Some(entry) = cache.entries.get_mut(&key) {
                entry.seen = generation;
                totals.num_waiting += 1; // the sums come from the cache's
                if verify {
                    Some(reader.waiting(request)?)
                } else {
                    None
                }
            } else {
                let contribution = reader.waiting(request)?;
                cache.insert(key, request, contribution, generation);
                totals.num_waiting += 1;
                reads += 1;
                Some(contribution)
            };
            if let (Some(full), Some(contribution)) = (full.as_mut(), fresh) {
                full.add_waiting(contribution);
            }
            Ok(())
        })?;
        cache.drop_unseen(generation);
        volatile.retain(|_, marked| marked.seen == generation);
        cache.add_sums_to(&mut totals);
        self.last_reads = reads;
        Ok((totals, full))
    }
}

impl WaitingCache {
    fn insert(
        &mut self,
        key: usize,
        request: &Bound<'_, PyAny>,
        contribution: WaitingRequest,
        seen: u64,
    ) {
        self.add(contribution);
        let entry = Entry {
            _request: request.clone().unbind(),
            contribution,
            seen,
        };
        if let Some(old) = self.entries.insert(key, entry) {
            self.subtract(old.contribution);
        }
    }

    fn remove(&mut self, key: usize) {
        if let Some(entry) = self.entries.remove(&key) {
            self.subtract(entry.contribution);
        }
    }

    /// Drops the entries of requests that were not in the queue this time.
    fn drop_unseen(&mut self, generation: u64) {
        let mut gone = Vec::new();
        self.entries.retain(|_, entry| {
            let keep = entry.seen == generation;
            if !keep {
                gone.push(entry.contribution);
            }
            keep
        });
        for contribution in gone {
            self.subtract(contribution);
        }
    }

    fn add(&mut self, contribution: WaitingRequest) {
        self.pending_prefill_tokens += contribution.remaining_prefill;
        self.num_preempted += u64::from(contribution.preempted);
        if contribution.remaining_prefill > 0 {
            *self
                .remaining_counts
                .entry(contribution.remaining_prefill)
                .or_insert(0) += 1;
        }
    }

    fn subtract(&mut self, contribution: WaitingRequest) {
        self.pending_prefill_tokens -= contribution.remaining_prefill;
        self.num_preempted -= u64::from(contribution.preempted);
        let remaining = contribution.remaining_prefill;
        if remaining > 0 {
            if let Some(count) = self.remaining_counts.get_mut(&remaining) {
                *count -= 1;
                if *count == 0 {
                    self.remaining_counts.remove(&remaining);
                }
            }
        }
    }

    /// Adds the cached requests' prefill and preempted count to `sums`
    /// (each cached request is already counted in `num_waiting`).
    fn add_sums_to(&self, sums: &mut Snapshot) {
        sums.pending_prefill_tokens += self.pending_prefill_tokens;
        sums.num_preempted += self.num_preempted;
        sums.max_prefill_remaining = sums.max_prefill_remaining.max(self.max_remaining());
    }

    fn max_remaining(&self) -> u64 {
        self.remaining_counts
            .last_key_value()
            .map_or(0, |(remaining, _)| *remaining)
    }
}
