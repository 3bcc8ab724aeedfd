//! Survives another process truncating a mapped model file.
//!
//! Touching a mapped page past the end of a shrunken file raises SIGBUS. Reads check the
//! file's size first, but a truncation can land between the check and the copy; for that
//! window a SIGBUS handler replaces the faulting page of a registered mapping with a zero
//! page and marks the mapping poisoned, and every later read of a poisoned mapping fails with
//! EIO instead of serving the zeros. A SIGBUS outside registered mappings keeps its default,
//! fatal meaning.
//!
//! Invariants: the handler only reads atomics and calls `mmap`; registrations are slots in a
//! fixed static table, so the handler never allocates or locks.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

const SLOTS: usize = 256;

struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    poisoned: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    poisoned: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
static INSTALL: Once = Once::new();

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in &TABLE {
        let start = slot.start.load(Ordering::Acquire);
        let len = slot.len.load(Ordering::Acquire);
        if len != 0 && addr >= start && addr - start < len {
            slot.poisoned.store(true, Ordering::Release);
            let page = PAGE.load(Ordering::Relaxed);
            let at = addr & !(page - 1);
            // SAFETY: remaps one page inside a mapping this process owns; the faulting
            // access then reads zeros, which the poisoned flag keeps from being served.
            unsafe {
                libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
            }
            return;
        }
    }
    // Not a model mapping: restore the default action; the access faults again and ends
    // the process as it would have without this handler.
    // SAFETY: resetting a signal disposition is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sysconf and sigaction with a zeroed, filled-in struct.
        unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE.store(page as usize, Ordering::Relaxed);
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
        }
    });
}

/// A mapping watched for SIGBUS; unregisters on drop.
#[derive(Debug)]
pub struct Watch {
    slot: Option<usize>,
}

impl Watch {
    /// Watches `[ptr, ptr + len)`. Without a free slot the mapping is still usable, only
    /// unguarded against the truncation race.
    pub fn new(ptr: *const u8, len: usize) -> Watch {
        install();
        for (i, slot) in TABLE.iter().enumerate() {
            if slot
                .len
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                slot.poisoned.store(false, Ordering::Release);
                slot.start.store(ptr as usize, Ordering::Release);
                slot.len.store(len.max(1), Ordering::Release);
                return Watch { slot: Some(i) };
            }
        }
        log::warn!("more than {SLOTS} mapped files: new mappings are not guarded against SIGBUS");
        Watch { slot: None }
    }

    /// Whether a SIGBUS hit this mapping (the file shrank while mapped).
    pub fn poisoned(&self) -> bool {
        self.slot
            .is_some_and(|i| TABLE[i].poisoned.load(Ordering::Acquire))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            TABLE[i].start.store(0, Ordering::Release);
            TABLE[i].len.store(0, Ordering::Release);
        }
    }
}
