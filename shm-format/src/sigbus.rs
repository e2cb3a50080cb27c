//! Surviving a file that another process shrinks under a reader's mapping.
//!
//! Touching a page of a shared file mapping that lies beyond the file's end
//! raises `SIGBUS`, whose default action ends the process. Any process that
//! may write the state directory (an operator's `truncate -s 0`, a buggy
//! tool) could so kill every router reading it, and the engine writing it.
//! Every mapping of an engine file is therefore registered here; the first
//! registration installs a `SIGBUS` handler (once per process, chained to
//! the handler that was there before). When a fault hits a registered
//! mapping, the handler maps an anonymous zero page over the mapping's
//! range (`mmap(MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS)`, one system call)
//! and sets the mapping's `truncated` flag; the faulting load then
//! re-executes and reads zero. Zero fails every check (magic, state,
//! heartbeat; a sequence of 0 is never published, so the seqlock read
//! reports the engine torn), and the reader's next listing sees the flag
//! and reopens the file (which then fails validation: wrong size). A writer
//! whose file was truncated keeps running; its stores land in its private
//! zero pages (and its heartbeat thread replaces the file: see
//! `ShmWriter::create_after`). Faults anywhere else go to the previous
//! handler. `docs/ARCHITECTURE.md` says why this and not the alternatives
//! (a per-read `fstat`, file seals).
//!
//! Chaining, for a `SIGBUS` that is not ours: when the previous action was
//! the default (or none was recorded), the default action is put back, so
//! a fault ends the process with `SIGBUS` exactly as without us (a sent
//! signal is raised again and acts when our handler returns); an ignored
//! sent signal stays ignored (a fault cannot be ignored: it gets the
//! default action too). A previous handler function is called directly
//! from ours, with the arguments the kernel gave us, while our own action
//! is in force: its `sa_mask` (the extra signals it asked to have blocked
//! while it runs) and its `SA_RESETHAND`/`SA_NODEFER` flags are not
//! honoured; handlers that reset themselves and re-raise (Rust's, Python's
//! `faulthandler`) still end the process as they meant to.
//!
//! The registry is a list of fixed-size chunks of slots that is only ever
//! appended to (never freed), so the handler walks it with atomic loads only:
//! no lock, no allocation.

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use nix::libc;

/// Slots per chunk of the registry (a chunk is allocated when all are taken).
const SLOTS_PER_CHUNK: usize = 256;

/// One registered mapping.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Owned by a live mapping (set by `register`, cleared by `unregister`).
    taken: AtomicBool,
    /// The mapping is writable (a writer's): the zero pages must be too.
    writable: AtomicBool,
    /// Start address of the mapping; 0 while the slot is free. Its Release
    /// store in `register` pairs with the handler's Acquire load.
    start: AtomicUsize,
    /// Bytes the mapping covers, rounded up to whole pages (stored before
    /// `start`, so the handler's Acquire load of `start` sees it).
    len: AtomicUsize,
    /// Set by the handler when it replaced the mapping with zero pages. Read
    /// by the thread that faulted (after the signal handler returned, so no
    /// fence is needed beyond a compiler fence) or by other threads sharing
    /// the mapping (Relaxed: they only need to see it eventually).
    truncated: AtomicBool,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            taken: AtomicBool::new(false),
            writable: AtomicBool::new(false),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            truncated: AtomicBool::new(false),
        }
    }

    /// Whether the handler replaced this mapping after a fault. One Relaxed
    /// load; see the field's comment for what it pairs with.
    #[inline]
    pub(crate) fn truncated(&self) -> bool {
        // Keeps the compiler from hoisting this load above the loads of the
        // mapping before it (a fault in those runs the handler in this
        // thread, which sets the flag).
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        self.truncated.load(Ordering::Relaxed)
    }
}

struct Chunk {
    slots: [Slot; SLOTS_PER_CHUNK],
    /// The chunk allocated before this one (null for the first).
    next: *const Chunk,
}

/// The newest chunk; chunks are leaked, so every pointer stays valid forever.
/// Release in `register` (publishing a filled chunk) pairs with the Acquire
/// loads in `register` and in the handler.
static CHUNKS: AtomicPtr<Chunk> = AtomicPtr::new(ptr::null_mut());

/// The page size (set once before the handler is installed).
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);

/// The `SIGBUS` action that was installed before ours.
static PREVIOUS: OnceLock<Previous> = OnceLock::new();

struct Previous(libc::sigaction);

// SAFETY: `sigaction` is plain data (a function address, a mask, flags);
// it is written once before our handler is installed and only read after.
unsafe impl Sync for Previous {}
// SAFETY: as above.
unsafe impl Send for Previous {}

static INSTALL: Once = Once::new();

/// Registers the mapping at `start` (page aligned, `len` bytes, `writable`
/// or read-only) and installs the handler on first use. The returned slot
/// must be passed to [`unregister`] before the mapping is unmapped.
pub(crate) fn register(start: usize, len: usize, writable: bool) -> &'static Slot {
    INSTALL.call_once(install);
    let slot = free_slot();
    let page = PAGE_SIZE.load(Ordering::Relaxed);
    slot.truncated.store(false, Ordering::Relaxed);
    slot.writable.store(writable, Ordering::Relaxed);
    // Relaxed: published by the Release store of `start` below.
    slot.len
        .store(len.max(1).div_ceil(page) * page, Ordering::Relaxed);
    // Pairs with the handler's Acquire load of `start`.
    slot.start.store(start, Ordering::Release);
    slot
}

/// Forgets the mapping of `slot` (before it is unmapped, so that a later
/// mapping at the same address is never mistaken for it).
pub(crate) fn unregister(slot: &'static Slot) {
    // Pairs with the handler's Acquire load of `start`: from here on, no
    // fault is attributed to this slot.
    slot.start.store(0, Ordering::Release);
    // Pairs with the Acquire compare-exchange in `free_slot`.
    slot.taken.store(false, Ordering::Release);
}

fn free_slot() -> &'static Slot {
    loop {
        let head = CHUNKS.load(Ordering::Acquire);
        let mut chunk = head.cast_const();
        while !chunk.is_null() {
            // SAFETY: chunks are leaked `Box`es, published fully initialised
            // with a Release store (paired with the Acquire load above), and
            // never freed or moved.
            let current: &'static Chunk = unsafe { &*chunk };
            for slot in &current.slots {
                if !slot.taken.load(Ordering::Relaxed)
                    && slot
                        .taken
                        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                {
                    return slot;
                }
            }
            chunk = current.next;
        }
        let fresh = Box::into_raw(Box::new(Chunk {
            slots: [const { Slot::new() }; SLOTS_PER_CHUNK],
            next: head,
        }));
        // Pairs with the Acquire loads of `CHUNKS`. If another thread added a
        // chunk meanwhile, free ours and look again.
        if CHUNKS
            .compare_exchange(head, fresh, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            // SAFETY: `fresh` came from `Box::into_raw` above and was never
            // published (the compare-exchange failed).
            drop(unsafe { Box::from_raw(fresh) });
        }
    }
}

fn install() {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    PAGE_SIZE.store(page, Ordering::Relaxed);
    // SAFETY: an all-zero `sigaction` is a valid value (SIG_DFL, empty
    // mask, no flags), overwritten by the kernel below.
    let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: querying the current action (null new action) only writes
    // `previous`, a valid `sigaction`.
    if unsafe { libc::sigaction(libc::SIGBUS, ptr::null(), &mut previous) } != 0 {
        return; // no handler: a truncated file still ends the process
    }
    // Saved before ours is installed, so the handler always finds it.
    let _ = PREVIOUS.set(Previous(previous));
    // SAFETY: as above.
    let mut ours: libc::sigaction = unsafe { std::mem::zeroed() };
    ours.sa_sigaction = on_sigbus as *const () as usize;
    // SA_ONSTACK: run on the thread's alternate stack when it has one (as
    // Rust's and Python's own fault handlers expect when we chain to them).
    ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: `ours.sa_mask` is a valid sigset to initialise.
    unsafe { libc::sigemptyset(&mut ours.sa_mask) };
    // SAFETY: `ours` is a fully initialised action whose handler has the
    // SA_SIGINFO signature; the old action is not needed (saved above).
    unsafe { libc::sigaction(libc::SIGBUS, &ours, ptr::null_mut()) };
}

/// The `SIGBUS` handler. Only async-signal-safe work: atomic loads and
/// stores, `mmap`, `sigaction`, `raise`.
extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler.
    let (code, address) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // si_code > 0: raised by the kernel for a fault (BUS_ADRERR for a page
    // beyond the end of a file); sent signals (kill, raise) have si_code ≤ 0
    // and no fault address.
    if code > 0 && replace_with_zero_pages(address) {
        return; // the faulting load re-executes and reads zero
    }
    chain(signal, info, context);
}

/// If `address` lies in a registered mapping, maps zero pages over that
/// mapping and flags it; whether it did.
fn replace_with_zero_pages(address: usize) -> bool {
    let mut chunk = CHUNKS.load(Ordering::Acquire).cast_const();
    while !chunk.is_null() {
        // SAFETY: as in `free_slot`: leaked, published with Release, never freed.
        let current: &'static Chunk = unsafe { &*chunk };
        for slot in &current.slots {
            // Pairs with the Release store in `register`.
            let start = slot.start.load(Ordering::Acquire);
            // Relaxed: stored before the Release store of `start` seen above.
            let len = slot.len.load(Ordering::Relaxed);
            if start == 0 || address < start || address >= start + len {
                continue;
            }
            // SAFETY: errno is thread-local; saved and restored so the
            // interrupted code never sees our mmap's errno.
            let errno = unsafe { *libc::__errno_location() };
            let prot = if slot.writable.load(Ordering::Relaxed) {
                libc::PROT_READ | libc::PROT_WRITE
            } else {
                libc::PROT_READ
            };
            // SAFETY:
            // - `start..start + len` is exactly one live mapping of ours: it is
            //   registered after mmap and unregistered before munmap, and the
            //   faulting thread is inside it, so it cannot be unmapped now;
            // - MAP_FIXED replaces that range only, with private zero-filled
            //   pages with the old protection; the `Mapping` keeps owning
            //   the range and unmaps it as before;
            // - every access to these bytes is an atomic word access: they now
            //   read 0, as if another process had stored zeros, and a
            //   writer's stores land in its private pages;
            // - mmap is a plain system call (no lock, no allocation).
            let mapped = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    len,
                    prot,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = errno };
            if mapped == libc::MAP_FAILED {
                return false;
            }
            slot.truncated.store(true, Ordering::Relaxed);
            return true;
        }
        chunk = current.next;
    }
    false
}

/// Passes a signal that is not ours to the handler installed before ours
/// (the pattern of wasmtime's trap handlers); see the module docs.
fn chain(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler.
    let sent = unsafe { (*info).si_code } <= 0;
    let previous = PREVIOUS.get().map(|Previous(action)| action);
    let handler = previous.map_or(libc::SIG_DFL, |action| action.sa_sigaction);
    if handler == libc::SIG_IGN && sent {
        // An ignored signal someone sent: still ignored.
    } else if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // Put the default action back and let it act: a fault re-executes on
        // return and takes it (the process ends with SIGBUS, as without us;
        // returning with our handler still in place would fault forever); a
        // sent signal is raised again, pending until we return.
        // SAFETY: an all-zero `sigaction` is SIG_DFL with an empty mask and
        // no flags; sigaction and raise are async-signal-safe.
        unsafe {
            let default: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, &default, ptr::null_mut());
            if sent {
                libc::raise(signal);
            }
        }
    } else if let Some(previous) = previous.filter(|a| a.sa_flags & libc::SA_SIGINFO != 0) {
        // SAFETY: with SA_SIGINFO, `sa_sigaction` is the address of a
        // handler with this signature, installed by its owner for SIGBUS;
        // it gets the arguments the kernel gave us.
        let previous: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(previous.sa_sigaction) };
        previous(signal, info, context);
    } else {
        // SAFETY: without SA_SIGINFO, `sa_sigaction` (the `sa_handler`
        // union member) is the address of a one-argument handler (not
        // SIG_DFL or SIG_IGN, handled above).
        let previous: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        previous(signal);
    }
}
