//! The seqlock protocol (docs/FORMAT.md, "The seqlock protocol"), over
//! atomic words.
//!
//! One writer, any number of readers, possibly in other processes. The
//! protected words are `AtomicU64`s accessed with `Relaxed` loads and stores
//! between fences (H.-J. Boehm, "Can Seqlocks Get Along with Programming
//! Language Memory Models?", 2012): no plain or volatile access to memory that
//! another process writes, so there is no data race in the Rust memory model.
//!
//! Ordering contract:
//! - writer: `seq = s+1` (Relaxed), `fence(Release)`, words (Relaxed),
//!   `seq = s+2` (Release);
//! - reader: `s0 = seq` (Relaxed), `fence(Acquire)`, words (Relaxed),
//!   `fence(Acquire)`, `s1 = seq` (Relaxed); the copy is accepted only if
//!   `s0 == s1` and even. Readers use only Relaxed loads of 8 bytes because
//!   they work on a read-only mapping (`PROT_READ`); the fences give them the
//!   acquire semantics.
//!
//! The same protocol covers words whose number is known only at run time
//! (a cache digest's control words and entries, docs/FORMAT.md, "Cache
//! residency"): [`write_with_after`] and [`try_read_with`] / [`read_with`]
//! take the stores and loads as closures, and the fixed-size functions are
//! written with them, so the fences and their pairings are in one place.
//!
//! Pairings are named at each operation below. The model is checked with loom
//! (`RUSTFLAGS="--cfg loom" cargo test -p engine-state-shm-format --release
//! seqlock`), and the in-memory tests of this module run under Miri.
//!
//! Retries are bounded ([`READ_SPINS`] + [`READ_YIELDS`]): a writer killed in
//! the middle of a write leaves the sequence odd forever, and readers then get
//! [`Torn`] instead of spinning.

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Attempts that spin (with a CPU pause hint) before a reader starts yielding.
#[cfg(not(loom))]
pub const READ_SPINS: u32 = 128;
/// Further attempts, each after `yield_now`, before a reader gives up with [`Torn`].
#[cfg(not(loom))]
pub const READ_YIELDS: u32 = 16;
#[cfg(loom)]
pub const READ_SPINS: u32 = 2;
#[cfg(loom)]
pub const READ_YIELDS: u32 = 1;

/// The seqlock could not be read consistently within its retry bound: a write
/// was in progress at every attempt, or the writer died in the middle of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Torn {
    /// The last sequence value seen (odd while a write is in progress).
    pub last_seq: u64,
}

/// Publishes `values` into `words` under the sequence `seq`.
///
/// Single writer: the caller guarantees that no other thread or process writes
/// `seq` or `words` at the same time (the file's writer lock does this across
/// processes, `&mut` ownership of the writer inside one).
#[inline]
pub fn write<const N: usize>(seq: &AtomicU64, words: &[AtomicU64; N], values: &[u64; N]) {
    // Only this writer stores to `seq`, so a Relaxed load sees its own last store.
    let s = seq.load(Ordering::Relaxed);
    debug_assert!(
        s % 2 == 0,
        "seqlock writer found an odd sequence: two writers?"
    );
    write_after(seq, words, values, s);
}

/// [`write`] from the sequence `last` the writer stored last, kept by the
/// writer itself rather than loaded from `seq`: a stray store into `seq`
/// (another process's, through a writable mapping of the file) then leaves
/// it `last + 2`, even, instead of shifting every later write to odd final
/// values, which readers would take for a write in progress forever.
/// `last` must be even.
#[inline]
pub fn write_after<const N: usize>(
    seq: &AtomicU64,
    words: &[AtomicU64; N],
    values: &[u64; N],
    last: u64,
) {
    write_with_after(seq, last, || {
        for (word, value) in words.iter().zip(values) {
            word.store(*value, Ordering::Relaxed);
        }
    });
}

/// The seqlock write with the stores done by `store`, from the sequence
/// `last` (even) the writer stored last: the protocol over any set of words,
/// e.g. a cache digest's control words and its first `count` entries, whose
/// number is known only at run time. `store` must only do Relaxed stores
/// of the protected words (the fences below order them).
#[inline]
pub fn write_with_after(seq: &AtomicU64, last: u64, store: impl FnOnce()) {
    debug_assert!(
        last % 2 == 0,
        "a seqlock write must start from an even sequence"
    );
    let s = last;
    // Mark the write as in progress. Readers that see this odd value retry.
    seq.store(s.wrapping_add(1), Ordering::Relaxed);
    // Pairs with the reader's `fence(Acquire)` after its word loads: a reader
    // that sees any of the word stores below also sees the odd sequence above
    // when it reloads `seq`, so it rejects a copy that mixes old and new words.
    fence(Ordering::Release);
    store();
    // Pairs with the reader's first Relaxed load of `seq` and the
    // `fence(Acquire)` after it (`try_read_with`; no Acquire load: on a
    // read-only mapping only Relaxed loads are documented to work): a reader
    // whose load sees s+2 sees every word stored above.
    seq.store(s.wrapping_add(2), Ordering::Release);
}

/// One attempt at a consistent copy and the (even) sequence it was published
/// under; `Err(seq)` when a write interfered.
#[inline]
pub fn try_read<const N: usize>(
    seq: &AtomicU64,
    words: &[AtomicU64; N],
) -> Result<([u64; N], u64), u64> {
    try_read_with(seq, || {
        let mut out = [0u64; N];
        for (slot, word) in out.iter_mut().zip(words) {
            *slot = word.load(Ordering::Relaxed);
        }
        out
    })
}

/// One attempt at a consistent copy made by `load`, and the (even) sequence
/// it was published under; `Err(seq)` when a write interfered (then what
/// `load` made is dropped). The protocol over any set of words: `load` must
/// only do Relaxed loads of the protected words, and must not trust what
/// it loads until this returns `Ok` (a count loaded from a torn copy can be
/// anything: bound it before using it as a length).
#[inline]
pub fn try_read_with<T>(seq: &AtomicU64, load: impl FnOnce() -> T) -> Result<(T, u64), u64> {
    // Relaxed load + Acquire fence rather than an Acquire load: on a read-only
    // mapping only Relaxed loads of at most 8 bytes are documented to work.
    // Together they pair with the writer's final Release store of `seq`: a
    // reader that sees s+2 sees every word of that write.
    let s0 = seq.load(Ordering::Relaxed);
    fence(Ordering::Acquire);
    if s0 % 2 == 1 {
        return Err(s0);
    }
    let out = load();
    // Pairs with the writer's `fence(Release)` after its odd store: if any load
    // above saw a store from a later write, the reload below sees that write's
    // odd (or later) sequence.
    fence(Ordering::Acquire);
    let s1 = seq.load(Ordering::Relaxed);
    if s0 == s1 {
        Ok((out, s0))
    } else {
        Err(s1)
    }
}

/// A consistent copy of `words` and the (even) sequence it was published under,
/// or [`Torn`] after [`READ_SPINS`] + [`READ_YIELDS`] failed attempts.
#[inline]
pub fn read<const N: usize>(
    seq: &AtomicU64,
    words: &[AtomicU64; N],
) -> Result<([u64; N], u64), Torn> {
    read_with(seq, || {
        let mut out = [0u64; N];
        for (slot, word) in out.iter_mut().zip(words) {
            *slot = word.load(Ordering::Relaxed);
        }
        out
    })
}

/// A consistent copy made by `load` (see [`try_read_with`]) and the (even)
/// sequence it was published under, or [`Torn`] after [`READ_SPINS`] +
/// [`READ_YIELDS`] failed attempts.
#[inline]
pub fn read_with<T>(seq: &AtomicU64, mut load: impl FnMut() -> T) -> Result<(T, u64), Torn> {
    let mut last_seq = 0;
    for attempt in 0..READ_SPINS + READ_YIELDS {
        match try_read_with(seq, &mut load) {
            Ok(copy) => return Ok(copy),
            Err(s) => {
                last_seq = s;
                count_failed_attempt();
            }
        }
        if attempt < READ_SPINS {
            spin_hint();
        } else {
            yield_now();
        }
    }
    Err(Torn { last_seq })
}

#[cfg(not(loom))]
std::thread_local! {
    static FAILED_ATTEMPTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many attempts of [`read`] on this thread found a write in the way,
/// so far: a torn read adds exactly [`READ_SPINS`] + [`READ_YIELDS`]. For
/// tests that check the retry bound through the layers above (`ShmFile`,
/// the reader's directory source), not for production use. Counted on the
/// retry path only: an attempt that succeeds costs nothing more.
#[doc(hidden)]
#[cfg(not(loom))]
pub fn failed_attempts() -> u64 {
    FAILED_ATTEMPTS.with(|n| n.get())
}

#[inline]
fn count_failed_attempt() {
    #[cfg(not(loom))]
    FAILED_ATTEMPTS.with(|n| n.set(n.get() + 1));
}

#[inline]
fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

#[inline]
fn yield_now() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    struct Cell<const N: usize> {
        seq: AtomicU64,
        words: [AtomicU64; N],
    }

    impl<const N: usize> Cell<N> {
        fn new() -> Self {
            Cell {
                seq: AtomicU64::new(0),
                words: core::array::from_fn(|_| AtomicU64::new(0)),
            }
        }
    }

    #[test]
    fn write_then_read_round_trips() {
        let cell = Cell::<4>::new();
        write(&cell.seq, &cell.words, &[1, 2, 3, 4]);
        let (values, seq) = read(&cell.seq, &cell.words).unwrap();
        assert_eq!(values, [1, 2, 3, 4]);
        assert_eq!(seq, 2);
        write(&cell.seq, &cell.words, &[5, 6, 7, 8]);
        assert_eq!(read(&cell.seq, &cell.words).unwrap(), ([5, 6, 7, 8], 4));
    }

    #[test]
    fn odd_sequence_is_torn_after_bounded_retries() {
        let cell = Cell::<4>::new();
        // A writer that died between its odd store and its final store.
        cell.seq.store(7, Ordering::Relaxed);
        let before = failed_attempts();
        assert_eq!(read(&cell.seq, &cell.words), Err(Torn { last_seq: 7 }));
        assert_eq!(
            failed_attempts() - before,
            u64::from(READ_SPINS + READ_YIELDS),
            "gave up after the retry bound, no sooner and no later"
        );
        assert_eq!(try_read(&cell.seq, &cell.words), Err(7));
        // A read that succeeds at once counts no failed attempt.
        cell.seq.store(8, Ordering::Relaxed);
        let before = failed_attempts();
        assert!(read(&cell.seq, &cell.words).is_ok());
        assert_eq!(failed_attempts(), before);
    }

    #[test]
    fn concurrent_reader_never_sees_a_mixed_copy() {
        // Every word is derived from one value; a mixed copy breaks the relation.
        const N: usize = 16;
        let iterations: u64 = if cfg!(miri) { 200 } else { 200_000 };
        let cell = Arc::new(Cell::<N>::new());
        let done = Arc::new(AtomicBool::new(false));
        let writer = {
            let (cell, done) = (cell.clone(), done.clone());
            std::thread::spawn(move || {
                for v in 1..=iterations {
                    let values: [u64; N] = core::array::from_fn(|i| v.wrapping_mul(i as u64 + 1));
                    write(&cell.seq, &cell.words, &values);
                }
                done.store(true, Ordering::Release);
            })
        };
        let mut accepted = 0u64;
        // Until the writer is done and at least one copy was accepted (a
        // loaded machine may not run this thread before the writer ends).
        while !done.load(Ordering::Acquire) || accepted == 0 {
            if let Ok((values, _)) = read(&cell.seq, &cell.words) {
                let v = values[0];
                for (i, word) in values.iter().enumerate() {
                    assert_eq!(*word, v.wrapping_mul(i as u64 + 1), "mixed copy accepted");
                }
                accepted += 1;
            }
        }
        writer.join().unwrap();
        let (values, _) = read(&cell.seq, &cell.words).unwrap();
        assert_eq!(values[0], iterations);
        assert!(accepted > 0);
    }

    /// The protocol over words counted at run time (`write_with_after`,
    /// `read_with`, as a cache digest uses it): a count word, then that
    /// many entries, each derived from the version. A copy is accepted only
    /// whole, and a torn count is bounded before it is used as a length.
    #[test]
    fn run_time_counted_words_are_copied_whole() {
        const CAPACITY: usize = 12;
        let iterations: u64 = if cfg!(miri) { 100 } else { 100_000 };
        let seq = Arc::new(AtomicU64::new(0));
        let words: Arc<Vec<AtomicU64>> =
            Arc::new((0..2 + CAPACITY).map(|_| AtomicU64::new(0)).collect());
        let done = Arc::new(AtomicBool::new(false));
        let count_of = |v: u64| (v as usize * 5) % (CAPACITY + 1);
        let writer = {
            let (seq, words, done) = (seq.clone(), words.clone(), done.clone());
            std::thread::spawn(move || {
                let mut last = 0;
                for v in 1..=iterations {
                    let count = count_of(v);
                    write_with_after(&seq, last, || {
                        words[0].store(v, Ordering::Relaxed);
                        words[1].store(count as u64, Ordering::Relaxed);
                        for word in &words[2..2 + count] {
                            word.store(v, Ordering::Relaxed);
                        }
                    });
                    last += 2;
                }
                done.store(true, Ordering::Release);
            })
        };
        let mut accepted = 0u64;
        let mut entries = Vec::with_capacity(CAPACITY);
        while !done.load(Ordering::Acquire) || accepted == 0 {
            let copy = read_with(&seq, || {
                let v = words[0].load(Ordering::Relaxed);
                let count = (words[1].load(Ordering::Relaxed) as usize).min(CAPACITY);
                entries.clear();
                entries.extend(
                    words[2..2 + count]
                        .iter()
                        .map(|w| w.load(Ordering::Relaxed)),
                );
                (v, count)
            });
            if let Ok(((v, count), _)) = copy {
                if v != 0 {
                    assert_eq!(count, count_of(v), "count of another write");
                    assert!(entries.iter().all(|e| *e == v), "mixed copy accepted");
                }
                accepted += 1;
            }
        }
        writer.join().unwrap();
        assert!(accepted > 0);
        assert_eq!(seq.load(Ordering::Relaxed), 2 * iterations);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    struct Cell {
        seq: AtomicU64,
        words: [AtomicU64; 2],
    }

    /// A reader racing two writes accepts only whole snapshots (0,0), (1,10) or (2,20).
    #[test]
    fn reader_accepts_only_whole_snapshots() {
        loom::model(|| {
            let cell = Arc::new(Cell {
                seq: AtomicU64::new(0),
                words: [AtomicU64::new(0), AtomicU64::new(0)],
            });
            let writer = {
                let cell = cell.clone();
                loom::thread::spawn(move || {
                    write(&cell.seq, &cell.words, &[1, 10]);
                    write(&cell.seq, &cell.words, &[2, 20]);
                })
            };
            if let Ok((values, _)) = try_read(&cell.seq, &cell.words) {
                assert_eq!(values[1], values[0] * 10, "torn copy accepted: {values:?}");
            }
            writer.join().unwrap();
            assert_eq!(try_read(&cell.seq, &cell.words), Ok(([2, 20], 4)));
        });
    }

    /// Two readers, one write: whatever each accepts is whole.
    #[test]
    fn two_readers_one_write() {
        loom::model(|| {
            let cell = Arc::new(Cell {
                seq: AtomicU64::new(0),
                words: [AtomicU64::new(3), AtomicU64::new(30)],
            });
            let writer = {
                let cell = cell.clone();
                loom::thread::spawn(move || write(&cell.seq, &cell.words, &[4, 40]))
            };
            let reader = {
                let cell = cell.clone();
                loom::thread::spawn(move || {
                    if let Ok((values, _)) = try_read(&cell.seq, &cell.words) {
                        assert_eq!(values[1], values[0] * 10, "torn copy accepted: {values:?}");
                    }
                })
            };
            writer.join().unwrap();
            reader.join().unwrap();
            assert_eq!(try_read(&cell.seq, &cell.words), Ok(([4, 40], 2)));
        });
    }

    /// The run-time-counted protocol (`write_with_after`, `read_with`'s
    /// attempt `try_read_with`): a reader racing a write that changes the
    /// count accepts only (count 1, entry 10) or (count 2, entries 20, 20).
    #[test]
    fn counted_words_are_copied_whole() {
        loom::model(|| {
            let cell = Arc::new((
                AtomicU64::new(0),
                [AtomicU64::new(1), AtomicU64::new(10), AtomicU64::new(0)],
            ));
            let writer = {
                let cell = cell.clone();
                loom::thread::spawn(move || {
                    let (seq, words) = &*cell;
                    write_with_after(seq, 0, || {
                        words[0].store(2, Ordering::Relaxed);
                        words[1].store(20, Ordering::Relaxed);
                        words[2].store(20, Ordering::Relaxed);
                    });
                })
            };
            let (seq, words) = &*cell;
            if let Ok(((count, entries), _)) = try_read_with(seq, || {
                let count = (words[0].load(Ordering::Relaxed) as usize).min(2);
                let entries: Vec<u64> = words[1..1 + count]
                    .iter()
                    .map(|w| w.load(Ordering::Relaxed))
                    .collect();
                (count, entries)
            }) {
                match count {
                    1 => assert_eq!(entries, [10]),
                    2 => assert_eq!(entries, [20, 20]),
                    _ => panic!("count {count}"),
                }
            }
            writer.join().unwrap();
        });
    }

    /// A router file's removal (router_writer.rs, `remove`): the last slot
    /// moved into the hole, the vacated slot zeroed and the count cut, in
    /// one write. A reader accepts (2, [A, B]) or (1, [B]), never a slot
    /// twice or a zeroed live slot.
    #[test]
    fn a_removal_moving_the_last_slot_is_copied_whole() {
        const A: u64 = 0xA;
        const B: u64 = 0xB;
        loom::model(|| {
            let cell = Arc::new((
                AtomicU64::new(0),
                [AtomicU64::new(2), AtomicU64::new(A), AtomicU64::new(B)],
            ));
            let writer = {
                let cell = cell.clone();
                loom::thread::spawn(move || {
                    let (seq, words) = &*cell;
                    write_with_after(seq, 0, || {
                        words[1].store(B, Ordering::Relaxed);
                        words[2].store(0, Ordering::Relaxed);
                        words[0].store(1, Ordering::Relaxed);
                    });
                })
            };
            let (seq, words) = &*cell;
            if let Ok((slots, _)) = try_read_with(seq, || {
                let count = (words[0].load(Ordering::Relaxed) as usize).min(2);
                words[1..1 + count]
                    .iter()
                    .map(|w| w.load(Ordering::Relaxed))
                    .collect::<Vec<u64>>()
            }) {
                assert!(
                    slots == [A, B] || slots == [B],
                    "torn removal accepted: {slots:?}"
                );
            }
            writer.join().unwrap();
        });
    }
}
