//! The shape policy: how far a batch's padded audio and token lengths are rounded up. Rounding
//! bounds the number of distinct tensor shapes (a GPU backend compiles kernels per shape) at the
//! price of padding. `asrt train` pads with it and `asrt plan` reports the padding it costs, from
//! the same `[shape]` table of the training config.

use serde::{Deserialize, Serialize};

/// A shape policy that cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum ShapeError {
    /// The audio quantum is negative, infinite or NaN.
    #[error("shape.audio_quantum_seconds {0} must be a finite number >= 0")]
    AudioQuantum(f64),
}

/// Padded lengths are rounded up to these multiples (0: no rounding).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShapePolicy {
    /// Audio length quantum, in seconds (converted to whole samples at the corpus's rate).
    pub audio_quantum_seconds: f64,
    /// Token length quantum, in tokens.
    pub token_quantum: u32,
}

/// `len` rounded up to a multiple of `q` (unchanged when `q` is 0).
fn round_up(len: u64, q: u64) -> u64 {
    if q == 0 {
        len
    } else {
        len.div_ceil(q) * q
    }
}

impl ShapePolicy {
    /// The audio quantum in samples at `rate` samples per second.
    pub fn audio_quantum_samples(&self, rate: f64) -> u64 {
        (self.audio_quantum_seconds.max(0.0) * rate).round() as u64
    }

    /// Padded length, in samples, of a batch whose longest utterance has `longest` samples.
    pub fn padded_samples(&self, longest: u64, rate: f64) -> u64 {
        round_up(longest, self.audio_quantum_samples(rate))
    }

    /// Padded length of a batch whose longest transcript has `longest` tokens.
    pub fn padded_tokens(&self, longest: u64) -> u64 {
        round_up(longest, u64::from(self.token_quantum))
    }

    /// Checks the quantum is a finite, non-negative number of seconds.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let q = self.audio_quantum_seconds;
        if !q.is_finite() || q < 0.0 {
            return Err(ShapeError::AudioQuantum(q));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_to_whole_quanta_and_leaves_exact_lengths_alone() {
        let s = ShapePolicy { audio_quantum_seconds: 0.5, token_quantum: 8 };
        assert_eq!(s.padded_samples(1, 16_000.0), 8_000);
        assert_eq!(s.padded_samples(8_000, 16_000.0), 8_000);
        assert_eq!(s.padded_samples(8_001, 16_000.0), 16_000);
        assert_eq!(s.padded_tokens(0), 0);
        assert_eq!(s.padded_tokens(9), 16);
        let exact = ShapePolicy::default();
        assert_eq!(exact.padded_samples(12_345, 16_000.0), 12_345);
        assert_eq!(exact.padded_tokens(7), 7);
        assert!(matches!(
            ShapePolicy { audio_quantum_seconds: f64::NAN, ..exact }.validate(),
            Err(ShapeError::AudioQuantum(q)) if q.is_nan()
        ));
        assert_eq!(
            ShapePolicy { audio_quantum_seconds: -1.0, ..exact }.validate(),
            Err(ShapeError::AudioQuantum(-1.0))
        );
    }
}
