//! What a micro-batch may hold for its kernels to launch: CubeCL 0.10 launches a kernel with
//! 32-bit shapes and strides, so no tensor of a launch may hold more than `u32::MAX` elements.
//!
//! The joint's tensors are a step's largest, `[B, T, U + 1, W]` with `W` the joint's hidden
//! width or its outputs (`V + 1 + D`), whichever is wider. On an H100 a micro-batch of 400
//! utterances of 20 s (`[400, 251, 81, 640]`, 5.2e9 elements) made CubeCL panic while launching
//! `Joint::combine`'s sum (cubecl-std's `FastDivmod::register`, an `Option::unwrap` on `None`)
//! instead of running out of memory (bench/RESULTS.md, "First run on a GPU"). So the trainer runs
//! such a micro-batch's joint in parts ([`super::fused`]), as `train.fused_batch_size` would,
//! with the same gradients up to the order of f32 sums; only one utterance too large for a
//! kernel is an error.
//!
//! Before the joint, the encoder's largest tensor is its first subsampling convolution's output,
//! `[B, C, frames / 2, features / 2]` (the same H100 micro-batch: `[400, 256, 1001, 64]`, 6.6e9
//! elements, whose 24.4 GiB allocation failed first). That one cannot be split without changing
//! the encoder's batch, so it is an error asking for a smaller `sampler.max_batch_seconds`,
//! raised before anything is launched.

/// Most elements a tensor of one CubeCL launch may hold.
pub const MAX_ELEMENTS: u64 = u32::MAX as u64;

/// A micro-batch (or one of its utterances) too large for a kernel.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelLimitError {
    /// One utterance's joint tensor.
    #[error(
        "one utterance's joint tensor would hold {elements} elements ({frames} encoder frames x \
         {positions} target positions x {width} values), more than a GPU kernel can index \
         ({MAX_ELEMENTS}): leave utterances this long or with this many tokens out of the \
         corpus (asrc compile's duration and token limits)"
    )]
    JointUtterance {
        /// Padded encoder frames of the micro-batch.
        frames: usize,
        /// Padded targets plus one.
        positions: usize,
        /// The joint's widest dimension.
        width: usize,
        /// Elements of one utterance's joint tensor.
        elements: u64,
    },
    /// The encoder's first subsampling convolution over the whole micro-batch.
    #[error(
        "a micro-batch of {utterances} utterances ({seconds:.1} s of audio) padded to {frames} \
         feature frames: the encoder's first subsampling convolution would output {elements} \
         elements, more than a GPU kernel can index ({MAX_ELEMENTS}); set \
         sampler.max_batch_seconds = {suggested:.1} or lower"
    )]
    Subsampling {
        /// Utterances of the micro-batch.
        utterances: usize,
        /// Its audio seconds.
        seconds: f64,
        /// Padded feature frames.
        frames: usize,
        /// Elements of the convolution's output.
        elements: u64,
        /// A `sampler.max_batch_seconds` under the limit (this batch's seconds scaled to it,
        /// less 10 %).
        suggested: f64,
    },
}

/// Checks the encoder's first subsampling convolution (`channels` out, stride 2 over `frames`
/// and `features`) over a micro-batch of `utterances` and `seconds` of audio.
pub fn check_subsampling(
    utterances: usize,
    seconds: f64,
    frames: usize,
    features: usize,
    channels: usize,
) -> Result<(), KernelLimitError> {
    let elements = utterances as u64
        * channels as u64
        * frames.div_ceil(2) as u64
        * features.div_ceil(2) as u64;
    if elements <= MAX_ELEMENTS {
        return Ok(());
    }
    let scale = MAX_ELEMENTS as f64 / elements as f64 * 0.9;
    Err(KernelLimitError::Subsampling {
        utterances,
        seconds,
        frames,
        elements,
        suggested: (seconds * scale * 10.0).floor() / 10.0,
    })
}

/// Utterances per joint call for a micro-batch of `batch` utterances padded to `frames` encoder
/// frames and `positions` target positions, through a joint `width` wide: `configured`
/// (`train.fused_batch_size`; 0 or at least `batch`: the whole micro-batch) lowered to what
/// keeps the joint's tensors under [`MAX_ELEMENTS`].
pub fn utterances_per_call(
    frames: usize,
    positions: usize,
    width: usize,
    configured: usize,
    batch: usize,
) -> Result<usize, KernelLimitError> {
    let per_utterance = frames as u64 * positions as u64 * width as u64;
    if per_utterance > MAX_ELEMENTS {
        return Err(KernelLimitError::JointUtterance {
            frames,
            positions,
            width,
            elements: per_utterance,
        });
    }
    let wanted = if configured == 0 { batch } else { configured.min(batch) };
    let fits = MAX_ELEMENTS.checked_div(per_utterance).unwrap_or(u64::MAX);
    Ok(usize::try_from(fits).unwrap_or(usize::MAX).min(wanted).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_micro_batch_when_it_fits() {
        assert_eq!(utterances_per_call(250, 81, 1030, 0, 8), Ok(8));
        assert_eq!(utterances_per_call(250, 81, 1030, 3, 8), Ok(3));
        assert_eq!(utterances_per_call(250, 81, 1030, 20, 8), Ok(8));
        assert_eq!(utterances_per_call(0, 1, 1030, 0, 4), Ok(4));
    }

    #[test]
    fn parts_under_the_kernel_limit() {
        // The H100 run's micro-batch: 251 x 81 x 640 = 13,011,840 elements an utterance, so 330
        // utterances per call (4,294,967,295 / 13,011,840 = 330.08).
        let part = utterances_per_call(251, 81, 640, 0, 400).unwrap();
        assert_eq!(part, 330);
        assert!(part as u64 * 251 * 81 * 640 <= MAX_ELEMENTS);
        assert!((part as u64 + 1) * 251 * 81 * 640 > MAX_ELEMENTS);
        // A configured part below the limit stays.
        assert_eq!(utterances_per_call(251, 81, 640, 100, 400), Ok(100));
    }

    #[test]
    fn one_utterance_too_large_is_an_error() {
        let e = utterances_per_call(5000, 1001, 1030, 0, 1).unwrap_err();
        assert!(matches!(e, KernelLimitError::JointUtterance { elements, .. }
            if elements == 5000 * 1001 * 1030));
        assert!(
            e.to_string().contains("5000 encoder frames x 1001 target positions x 1030"),
            "{e}"
        );
        // Exactly at the limit still runs.
        assert_eq!(utterances_per_call(1, 1, MAX_ELEMENTS as usize, 0, 2), Ok(1));
    }

    #[test]
    fn the_subsampling_convolution_of_the_h100_batch() {
        // 400 utterances of 20 s, 128 features, 256 channels: 400 x 256 x 1001 x 64.
        let e = check_subsampling(400, 8000.0, 2001, 128, 256).unwrap_err();
        let KernelLimitError::Subsampling { elements, suggested, .. } = e.clone() else {
            panic!("{e}")
        };
        assert_eq!(elements, 400 * 256 * 1001 * 64);
        // 8000 s x (4,294,967,295 / 6,560,153,600) x 0.9 = 4713.88 s, rounded down.
        assert_eq!(suggested, 4713.8);
        assert!(e.to_string().contains("max_batch_seconds = 4713.8"), "{e}");
        // What the suggestion leaves fits: 235 utterances of 20 s.
        assert!(check_subsampling(235, 4700.0, 2001, 128, 256).is_ok());
        assert!(check_subsampling(8, 160.0, 2001, 128, 256).is_ok());
    }
}
