//! A gradient handed from one device operation's backward to another's, where autodiff would
//! otherwise add the two: the residual connection's input gradient (its output's gradient
//! itself, `device_matmul::linear_residual`) to the backward of the layer normalisation that
//! reads the same input (`device_layer_norm`), whose input-gradient kernel adds it as it writes.
//!
//! Why: each Conformer block's four residual connections read the input of a layer
//! normalisation, and autodiff summed the two gradients of that input in an addition of its
//! own: 96 launches and 96 operations of fusion's stream a step at 24 layers
//! (bench/RESULTS.md, 2026-12-07).
//!
//! How it stays right: the receiver claims the handoff in its forward, which runs first (the
//! normalisation's output is the branch's input); the giver hands its gradient over only where
//! it was claimed, and registers it with autodiff otherwise. The giver's node reads the
//! receiver's output through its branch, so its depth is greater, and autodiff runs every node
//! of a depth before any of a lower one: the gradient is there before the receiver's backward
//! runs. A gradient given and never taken (the receiver's backward did not run) would be lost:
//! the state, dropped holding one, records a device failure (`device_failure::defer`), and the
//! next check fails the step.
//!
//! Invariant: at most one gradient is given, taken at most once; what the receiver adds is
//! exactly what autodiff would have added (the same tensor, and addition commutes bit for bit).

use std::any::Any;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// The handoff between one giver and one receiver (see the module). Clones share it.
#[derive(Clone, Default)]
pub struct Handoff(Arc<Mutex<State>>);

/// What the handoff holds.
#[derive(Default)]
struct State {
    /// A receiver's forward has run: its backward will take the gradient.
    claimed: bool,
    /// The gradient given and not yet taken.
    grad: Option<Box<dyn Any + Send>>,
}

impl fmt::Debug for Handoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Handoff")
            .field("claimed", &state.claimed)
            .field("holding", &state.grad.is_some())
            .finish()
    }
}

impl Handoff {
    /// A new handoff, unclaimed and empty.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a backward panicked: that panic is the error.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The receiver's forward: its backward will take what is given.
    pub fn claim(&self) {
        self.lock().claimed = true;
    }

    /// Whether a receiver claimed it: only then may a giver hand its gradient over.
    pub fn claimed(&self) -> bool {
        self.lock().claimed
    }

    /// The receiver's side, in its forward: `handoff` claimed, and kept for its backward.
    pub fn receive(handoff: Option<&Handoff>) -> Option<Handoff> {
        let handoff = handoff.cloned();
        if let Some(h) = &handoff {
            h.claim();
        }
        handoff
    }

    /// The giver's side, in its forward: `handoff` kept for its backward where a receiver
    /// claimed it; `None` (autodiff sums the gradient) elsewhere.
    pub fn offered(handoff: Option<&Handoff>) -> Option<Handoff> {
        handoff.filter(|h| h.claimed()).cloned()
    }

    /// Leaves `grad` for the receiver.
    pub fn give<T: Any + Send>(&self, grad: T) {
        self.lock().grad = Some(Box::new(grad));
    }

    /// What was given, taken; `None` where nothing was, or something of another type (left
    /// there; the one giver and one receiver of a handoff agree on the type).
    pub fn take<T: Any + Send>(&self) -> Option<T> {
        let mut state = self.lock();
        if !state.grad.as_ref().is_some_and(|g| (**g).is::<T>()) {
            return None;
        }
        state.grad.take()?.downcast::<T>().ok().map(|g| *g)
    }
}

impl Drop for State {
    /// A gradient given and never taken (see the module).
    fn drop(&mut self) {
        if self.grad.is_some() {
            crate::device_failure::defer(
                "a residual connection's input gradient was handed to its layer normalisation, \
                 whose backward never ran: the gradient is lost (model::handoff)"
                    .to_string(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_handoff_passes_one_gradient_once() {
        let receiver = Handoff::new();
        let giver = receiver.clone();
        assert!(!giver.claimed());
        receiver.claim();
        assert!(giver.claimed());
        assert_eq!(receiver.take::<Vec<f32>>(), None, "nothing given yet");
        giver.give(vec![1.0f32, 2.0]);
        assert_eq!(receiver.take::<u8>(), None, "another type is not taken");
        assert_eq!(receiver.take::<Vec<f32>>(), Some(vec![1.0, 2.0]));
        assert_eq!(receiver.take::<Vec<f32>>(), None, "taken once");
        assert_eq!(format!("{receiver:?}"), "Handoff { claimed: true, holding: false }");
    }

    #[test]
    fn a_giver_is_offered_only_a_handoff_a_receiver_claimed() {
        let handoff = Handoff::new();
        assert!(Handoff::offered(Some(&handoff)).is_none(), "not claimed yet");
        assert!(Handoff::offered(None).is_none());
        assert!(Handoff::receive(None).is_none());
        let kept = Handoff::receive(Some(&handoff)).expect("kept by the receiver");
        assert!(kept.claimed());
        let offered = Handoff::offered(Some(&handoff)).expect("claimed");
        offered.give(3u8);
        assert_eq!(kept.take::<u8>(), Some(3));
    }
}
