//! Failures that a CubeCL device (CUDA, wgpu) reports after the fact, turned into errors.
//!
//! Burn 0.21 runs each CubeCL device's server on its own thread. When a buffer cannot be
//! allocated there (CUDA's `CUDA_ERROR_OUT_OF_MEMORY`, or a size no memory pool accepts: wgpu's
//! largest storage binding, 128 MiB on Mesa's lavapipe), that thread panics with CubeCL's
//! `can't allocate buffer of size: N`, and the caller is not told: the operation's output is
//! left unbound and reading it gives unrelated values. The error surfaces at the next
//! [`Backend::sync`], as "the server is in an invalid state" without the cause.
//!
//! So the trainer and the evaluator [`check`] the device after each micro-batch (before its
//! gradients are used) and after each decoded batch: a failed sync becomes a [`DeviceFailure`],
//! out of memory when the process-wide panic hook that [`watch`] installs saw an allocation
//! fail.
//! On the CPU backend `sync` does nothing and no such panic happens, so the check is free.
//!
//! Work the trainer queues on a device thread itself (cuBLAS's products,
//! `model::cublas_product`) cannot return its error to the caller either: it is recorded with
//! [`defer`] and the next [`check`] on any device fails with it (the message names the device).

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};

use burn::tensor::backend::Backend;

/// CubeCL's message for a buffer it could not allocate (`IoError::BufferTooBig`).
const ALLOCATION_FAILED: &str = "can't allocate buffer of size: ";

/// CubeCL CUDA's message when a launch uses a buffer whose allocation failed: each launch that
/// depends on the missing buffer panics on the server thread with it (80 times in one
/// out-of-memory micro-batch of the 0.6B preset on an H100). Consequences, not causes.
const MISSING_BUFFER: &str = "couldn't find resource for that handle";

/// Size of the first allocation that failed since it was taken, plus one (0: none).
static FAILED_ALLOCATION: AtomicU64 = AtomicU64::new(0);

/// Failures of queued work, recorded until a check takes them.
struct Deferred(Mutex<Option<(String, u64)>>);

impl Deferred {
    /// Keeps the first failure, and counts the later ones.
    fn record(&self, failure: String) {
        let mut d = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match d.as_mut() {
            Some((_, later)) => *later += 1,
            None => *d = Some((failure, 0)),
        }
    }

    /// What was recorded since the last take.
    fn take(&self) -> Option<DeviceFailure> {
        let taken = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        taken.map(|(first, later)| DeviceFailure::Deferred { first, later })
    }
}

/// What [`defer`] recorded since the last [`check`].
static DEFERRED: Deferred = Deferred(Mutex::new(None));

/// Records a failure of work already queued on a device, whose results are therefore wrong:
/// the next [`check`] fails with the first such failure and the count of later ones.
pub fn defer(failure: String) {
    #[cfg(test)]
    if CAPTURED.with(|c| c.borrow_mut().as_mut().map(|v| v.push(failure.clone()))).is_some() {
        return;
    }
    DEFERRED.record(failure);
}

#[cfg(test)]
thread_local! {
    /// Where [`captured`] keeps this thread's deferred failures.
    static CAPTURED: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

/// `f`'s result and the failures [`defer`] got on this thread while it ran, kept from the
/// process's record: a test provoking a failure does not fail another test's [`check`] that
/// runs beside it.
#[cfg(test)]
pub fn captured<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    CAPTURED.with(|c| *c.borrow_mut() = Some(Vec::new()));
    let out = f();
    let failures = CAPTURED.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (out, failures)
}

/// What the device reported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceFailure {
    /// A buffer could not be allocated.
    #[error("the device could not allocate a buffer of {}", bytes_text(*bytes))]
    OutOfMemory {
        /// The size asked for, in bytes.
        bytes: u64,
    },
    /// Any other failure the device reported.
    #[error("the device failed: {0}")]
    Failed(String),
    /// Work queued on a device thread failed after its caller went on ([`defer`]).
    #[error("{first}{}", if *later > 0 { format!(" (and {later} more such failures)") } else { String::new() })]
    Deferred {
        /// The first failure.
        first: String,
        /// How many failures came after it.
        later: u64,
    },
}

/// `bytes` with a binary unit.
pub fn bytes_text(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= f64::from(1u32 << 30) {
        format!("{:.2} GiB", b / f64::from(1u32 << 30))
    } else {
        format!("{:.1} MiB", b / f64::from(1u32 << 20))
    }
}

/// The size in a panic message of CubeCL's failed allocation, if it is one.
pub fn failed_allocation(message: &str) -> Option<u64> {
    let at = message.find(ALLOCATION_FAILED)? + ALLOCATION_FAILED.len();
    let digits: String = message[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Whether a panic message is a launch's complaint about a buffer that was never allocated.
pub fn missing_buffer(message: &str) -> bool {
    message.contains(MISSING_BUFFER)
}

/// Installs (once per process) a panic hook that records CubeCL's allocation failures, on any
/// thread. The first failure since the last [`check`] is announced in one line (one failed
/// allocation is followed by many more as the queued work goes on); while one is pending, the
/// launches that panic for want of its buffer are its consequences and say nothing (the error
/// at the next check names the micro-batch); other panics go to the hook that was there.
pub fn watch() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| match failed_allocation(&info.to_string()) {
            Some(bytes) => {
                // The first failure is the cause; later ones (smaller buffers of the same work,
                // on an H200 and on lavapipe) keep it, so the error names the size announced.
                let first = FAILED_ALLOCATION.compare_exchange(
                    0,
                    bytes.saturating_add(1),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
                if first.is_ok() {
                    eprintln!(
                        "the device could not allocate a buffer of {}: results that depend on it \
                             are wrong, and are discarded at the next check",
                        bytes_text(bytes)
                    );
                }
            }
            None if FAILED_ALLOCATION.load(Ordering::SeqCst) != 0
                && (missing_buffer(&info.to_string()) || CONTAINING.with(Cell::get)) => {}
            None => previous(info),
        }));
    });
}

thread_local! {
    /// Whether this thread is inside [`contain`].
    static CONTAINING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, a stretch of device work on this thread. A panic in it while an allocation failure
/// is pending is a consequence of that failure and comes back as it: on an H200 a micro-batch
/// whose 2.18 GiB allocation failed then panicked on the main thread while registering the next
/// launch's arguments (cubecl-std `FastDivmod::register`, in the joint's `Linear`), before any
/// check could name the batch (bench/RESULTS.md, "GPU kit on an H200"). Any other panic is a bug
/// and goes on unwinding.
pub fn contain<T>(f: impl FnOnce() -> T) -> Result<T, DeviceFailure> {
    let outer = CONTAINING.with(|c| c.replace(true));
    let result = std::panic::catch_unwind(AssertUnwindSafe(f));
    CONTAINING.with(|c| c.set(outer));
    match result {
        Ok(v) => Ok(v),
        Err(payload) => match FAILED_ALLOCATION.swap(0, Ordering::SeqCst) {
            0 => std::panic::resume_unwind(payload),
            failed => Err(DeviceFailure::OutOfMemory { bytes: failed - 1 }),
        },
    }
}

/// Waits for `device` to finish its queued work and reports what failed since the last check.
///
/// The recorded allocation failure names no device (the panic comes from a server thread), so
/// it is taken only by a device whose own sync failed: another device of the process (a test
/// beside this one, another local rank) that is fine does not report it.
///
/// A failure recorded with [`defer`] comes first: it is the cause of wrong results even where
/// the sync succeeds.
pub fn check<B: Backend>(device: &B::Device) -> Result<(), DeviceFailure> {
    let synced = B::sync(device);
    if let Some(deferred) = DEFERRED.take() {
        return Err(deferred);
    }
    let Err(e) = synced else {
        return Ok(());
    };
    match FAILED_ALLOCATION.swap(0, Ordering::SeqCst) {
        0 => Err(DeviceFailure::Failed(e.to_string())),
        failed => Err(DeviceFailure::OutOfMemory { bytes: failed - 1 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_size_of_a_failed_allocation() {
        let m = "panicked at server.rs:270:43:\ncalled `Result::unwrap()` on an `Err` value: \
                 can't allocate buffer of size: 1073741824\nNo backtrace available";
        assert_eq!(failed_allocation(m), Some(1 << 30));
        assert_eq!(failed_allocation("index out of bounds"), None);
        assert_eq!(failed_allocation("can't allocate buffer of size: "), None);
        assert_eq!(bytes_text(3 << 29), "1.50 GiB");
        assert_eq!(bytes_text(5 << 19), "2.5 MiB");
        // The H100's follow-on panic, as printed there.
        assert!(missing_buffer(
            "called `Result::unwrap()` on an `Err` value: couldn't find resource for that \
             handle: Memory page 0 doesn't exist"
        ));
        assert!(!missing_buffer("can't allocate buffer of size: 1024"));
    }

    #[test]
    fn deferred_failures_keep_the_first_and_count_the_rest_until_taken() {
        // A store of its own: the process's is taken by any check, other tests' included.
        let d = Deferred(Mutex::new(None));
        assert_eq!(d.take(), None);
        d.record("a product failed".to_string());
        d.record("another failed".to_string());
        d.record("a third failed".to_string());
        let failure = d.take().unwrap();
        assert_eq!(
            failure,
            DeviceFailure::Deferred { first: "a product failed".to_string(), later: 2 }
        );
        assert_eq!(failure.to_string(), "a product failed (and 2 more such failures)");
        assert_eq!(d.take(), None);
        d.record("alone".to_string());
        assert_eq!(d.take().map(|f| f.to_string()), Some("alone".to_string()));
    }

    #[test]
    fn a_panic_while_an_allocation_failure_is_pending_is_that_failure() {
        watch();
        // CubeCL's server thread, as it fails an allocation.
        let server = std::thread::spawn(|| panic!("can't allocate buffer of size: 2048"));
        assert!(server.join().is_err());
        // A smaller buffer of the same work fails next: the first failure is the one named.
        let server = std::thread::spawn(|| panic!("can't allocate buffer of size: 1024"));
        assert!(server.join().is_err());
        // The launch that then panics on this thread (the H200's FastDivmod::register).
        let r = contain(|| -> u32 { panic!("called `Option::unwrap()` on a `None` value") });
        assert_eq!(r, Err(DeviceFailure::OutOfMemory { bytes: 2048 }));
        // Taken: with none pending, a panic is a bug and goes on unwinding.
        let bug = std::panic::catch_unwind(|| contain(|| -> u32 { panic!("a bug") }));
        assert!(bug.is_err());
        assert_eq!(contain(|| 7), Ok(7));
    }
}
