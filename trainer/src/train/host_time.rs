//! Where a step's wall time goes on the thread that trains it: queuing work for the device, and
//! waiting for it, phase by phase (`host_seconds` in `metrics.jsonl`).
//!
//! Why: on an H200 the 0.6B step is bound by the host (GPU utilisation 35-50 %,
//! bench/RESULTS.md, 2026-11-30), and a CPU profile says how busy each thread is but not, for
//! the training thread, whether it is queuing (the host bounds the step) or waiting (the device,
//! or fusion's and CubeCL's threads behind it, do). These figures say it per step, on every
//! backend, at the cost of a clock read per phase.
//!
//! Invariants: each phase is this thread's wall time between two points of the step, so the
//! phases never overlap and their sum is at most the step's time (the rest: the metrics, the
//! ranks' exchange of statistics); a phase that waits for the device is named for it
//! (`loss_read`, `device_check`, `norm`, `update_check`), the others only queue work, unless
//! a queue between threads is full.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// A step's wall seconds by phase, on the thread that trained it (rank 0's in the log). See
/// the module.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostSeconds {
    /// Queuing the micro-batches' forwards: features, encoder, joint and loss (the TDT loss
    /// waits for fusion's thread to launch its logits), and the forward's memory sample; where
    /// the joint runs in parts or on the host, the whole micro-batch (its backward and loss
    /// reads included).
    pub forward: f64,
    /// Queuing the backwards and collecting their gradients.
    pub backward: f64,
    /// Reading the losses: a wait for the device to run the forward and backward.
    pub loss_read: f64,
    /// The device checks after each micro-batch (a synchronisation; [`crate::device_failure`]).
    pub device_check: f64,
    /// Summing the gradients over the ranks (nothing to do with one).
    pub reduce: f64,
    /// Laying out the gradients and reading their norm: queuing, then a wait for the device.
    pub norm: f64,
    /// Queuing the optimizer's update.
    pub update: f64,
    /// The device check after the update: a wait for the device to run it.
    pub update_check: f64,
}

impl HostSeconds {
    /// The seconds of all phases.
    pub fn total(&self) -> f64 {
        self.forward
            + self.backward
            + self.loss_read
            + self.device_check
            + self.reduce
            + self.norm
            + self.update
            + self.update_check
    }
}

/// A clock for [`HostSeconds`]: each [`Lap::to`] adds the time since the last lap to a phase.
#[derive(Debug)]
pub struct Lap(Instant);

impl Lap {
    /// Starts the clock.
    pub fn start() -> Self {
        Lap(Instant::now())
    }

    /// Adds the seconds since the last lap (or the start) to `phase`, and starts the next.
    pub fn to(&mut self, phase: &mut f64) {
        let now = Instant::now();
        *phase += now.duration_since(self.0).as_secs_f64();
        self.0 = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_add_up_to_the_time_between_the_first_and_the_last() {
        let mut h = HostSeconds::default();
        let begun = Instant::now();
        let mut lap = Lap::start();
        std::thread::sleep(std::time::Duration::from_millis(5));
        lap.to(&mut h.forward);
        std::thread::sleep(std::time::Duration::from_millis(3));
        lap.to(&mut h.norm);
        lap.to(&mut h.norm);
        let elapsed = begun.elapsed().as_secs_f64();
        assert!(h.forward >= 0.005 && h.norm >= 0.003, "{h:?}");
        assert!(h.total() <= elapsed, "{} against {elapsed}", h.total());
        assert_eq!(h.total(), h.forward + h.norm);
    }
}
