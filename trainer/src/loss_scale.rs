//! Dynamic loss scaling for f16-mixed training (PyTorch's `GradScaler` rule).
//!
//! float16 represents magnitudes from about 6e-8 (subnormal) to 65504: small activation
//! gradients flush to zero unless the loss is multiplied by a large factor before backward. The
//! factor is divided out of the gradients before clipping and the update. A step whose gradients
//! are not finite (the factor overflowed something) is skipped and the factor halved; after
//! [`GROWTH_INTERVAL`] finite steps in a row it is doubled. The state is part of the checkpoint,
//! so a resumed run scales exactly as the uninterrupted one.

use serde::{Deserialize, Serialize};

/// The first scale (PyTorch's default).
pub const INITIAL_SCALE: f64 = 65_536.0;
/// Finite steps in a row before the scale doubles (PyTorch's default).
pub const GROWTH_INTERVAL: u64 = 2000;
/// The scale never falls below this: below it an overflow is not the scale's doing, and the
/// step counts towards `train.max_consecutive_skips` like any non-finite step.
pub const MIN_SCALE: f64 = 1.0;

/// The scaler's state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossScale {
    /// The factor the loss is multiplied by before backward.
    pub scale: f64,
    /// Finite steps since the last change of scale.
    pub good_steps: u64,
    /// Steps skipped because the scaled gradients were not finite, in the whole run.
    pub overflows: u64,
}

/// What the scaler did with a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Finite gradients: apply the step.
    Apply,
    /// Not finite, and the scale was lowered: skip the step, a scaler adjustment.
    Backoff,
    /// Not finite at the lowest scale: skip the step, a real non-finite step.
    NonFinite,
}

impl Default for LossScale {
    fn default() -> Self {
        LossScale { scale: INITIAL_SCALE, good_steps: 0, overflows: 0 }
    }
}

impl LossScale {
    /// Updates the scale after a step whose gradients were `finite` (their global norm, of the
    /// scaled gradients, is finite), and says what to do with the step.
    pub fn update(&mut self, finite: bool) -> Verdict {
        if finite {
            self.good_steps += 1;
            if self.good_steps >= GROWTH_INTERVAL {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
            return Verdict::Apply;
        }
        self.good_steps = 0;
        if self.scale > MIN_SCALE {
            self.scale = (self.scale / 2.0).max(MIN_SCALE);
            self.overflows += 1;
            Verdict::Backoff
        } else {
            Verdict::NonFinite
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_on_overflow_and_doubles_after_the_interval() {
        let mut s = LossScale::default();
        assert_eq!(s.update(false), Verdict::Backoff);
        assert_eq!(s.scale, INITIAL_SCALE / 2.0);
        for _ in 0..GROWTH_INTERVAL - 1 {
            assert_eq!(s.update(true), Verdict::Apply);
        }
        assert_eq!(s.scale, INITIAL_SCALE / 2.0);
        assert_eq!(s.update(true), Verdict::Apply);
        assert_eq!(s.scale, INITIAL_SCALE);
        assert_eq!((s.good_steps, s.overflows), (0, 1));
    }

    #[test]
    fn at_the_floor_an_overflow_is_a_non_finite_step() {
        let mut s = LossScale { scale: 2.0, good_steps: 7, overflows: 0 };
        assert_eq!(s.update(false), Verdict::Backoff);
        assert_eq!(s.scale, 1.0);
        assert_eq!(s.update(false), Verdict::NonFinite);
        assert_eq!((s.scale, s.good_steps, s.overflows), (1.0, 0, 1));
    }
}
