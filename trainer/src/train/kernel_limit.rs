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
//! The same parts keep the joint's tensors inside the memory pool's shared pages
//! ([`pool_bound`]): on an H200 one micro-batch's logits of 600 MB, just over the 586 MB that
//! CubeCL's 2.35 GB pages take, got a 9.38 GB page of their own, which the pool then kept for
//! the run with nothing in it at the peak (bench/RESULTS.md, 2026-11-29, 18:28 session).
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

/// The largest buffer a joint call should ask of CubeCL's memory pool whose largest page is
/// `max_page` bytes (`device_memory::largest_buffer`), or `None` where no bound is worth parts.
///
/// Why: CubeCL 0.10's default pools (`MemoryConfiguration::SubSlices`) take pages of
/// `max_page / 4^k` for pool `k`, each slicing buffers of up to `page / 2^k`, and a buffer goes
/// to the smallest pool that holds it. Pool 2's pages (2.35 GB on an H200, a sixteenth of the
/// largest) hold buffers of up to `max_page / 64` (586 MB), four or more to a page; a buffer
/// just over that goes to pool 1, whose page (`max_page / 4`, 9.38 GB) it holds alone, and the
/// pool keeps the page. Where that page is under 1 GiB (lavapipe's is 32 MiB) the waste is not
/// worth running the joint in parts.
pub fn pool_bound(max_page: u64) -> Option<u64> {
    (max_page / 4 >= 1 << 30).then_some(max_page / 64)
}

/// The bytes of a row of `width` f32 values as CUDA lays a new tensor out: rows padded to a
/// multiple of the row's size rounded up to a power of two, from 16 to 512 bytes, a row of one
/// value unpadded (cubecl-runtime 0.10's `PitchedMemoryLayoutPolicy` and `optimal_align`: 1030
/// values take 4,608 bytes, not 4,120). wgpu's rows are dense; counting them pitched
/// overestimates there by at most 511 bytes a row (12 % for the 0.6B joint's 1030 values).
pub fn pitched_row_bytes(width: usize) -> u64 {
    let bytes = width as u64 * 4;
    if width <= 1 {
        return bytes;
    }
    bytes.next_multiple_of(bytes.next_power_of_two().clamp(16, 512))
}

/// Utterances per joint call for a micro-batch of `batch` utterances padded to `frames` encoder
/// frames and `positions` target positions, through a joint `width` wide: `configured`
/// (`train.fused_batch_size`; 0 or at least `batch`: the whole micro-batch) lowered to what
/// keeps the joint's tensors under [`MAX_ELEMENTS`] and, where `max_bytes` is given
/// ([`pool_bound`]), under that many bytes with pitched rows ([`pitched_row_bytes`]). A part
/// lowered for bytes is balanced: 11 utterances of which 10 fit go as two parts of 6 and 5, not
/// 10 and 1. One utterance over `max_bytes` runs alone (the bound saves memory; it is no limit).
pub fn utterances_per_call(
    frames: usize,
    positions: usize,
    width: usize,
    configured: usize,
    batch: usize,
    max_bytes: Option<u64>,
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
    let part = usize::try_from(fits).unwrap_or(usize::MAX).min(wanted).max(1);
    let Some(max_bytes) = max_bytes else { return Ok(part) };
    let bytes = frames as u64 * positions as u64 * pitched_row_bytes(width);
    let fits = usize::try_from(max_bytes.checked_div(bytes).unwrap_or(u64::MAX))
        .unwrap_or(usize::MAX)
        .max(1);
    if fits >= part {
        return Ok(part);
    }
    // The fewest parts of at most `fits`, evened out.
    let parts = batch.div_ceil(fits);
    Ok(batch.div_ceil(parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_whole_micro_batch_when_it_fits() {
        assert_eq!(utterances_per_call(250, 81, 1030, 0, 8, None), Ok(8));
        assert_eq!(utterances_per_call(250, 81, 1030, 3, 8, None), Ok(3));
        assert_eq!(utterances_per_call(250, 81, 1030, 20, 8, None), Ok(8));
        assert_eq!(utterances_per_call(0, 1, 1030, 0, 4, None), Ok(4));
    }

    #[test]
    fn parts_under_the_kernel_limit() {
        // The H100 run's micro-batch: 251 x 81 x 640 = 13,011,840 elements an utterance, so 330
        // utterances per call (4,294,967,295 / 13,011,840 = 330.08).
        let part = utterances_per_call(251, 81, 640, 0, 400, None).unwrap();
        assert_eq!(part, 330);
        assert!(part as u64 * 251 * 81 * 640 <= MAX_ELEMENTS);
        assert!((part as u64 + 1) * 251 * 81 * 640 > MAX_ELEMENTS);
        // A configured part below the limit stays.
        assert_eq!(utterances_per_call(251, 81, 640, 100, 400, None), Ok(100));
    }

    #[test]
    fn one_utterance_too_large_is_an_error() {
        let e = utterances_per_call(5000, 1001, 1030, 0, 1, None).unwrap_err();
        assert!(matches!(e, KernelLimitError::JointUtterance { elements, .. }
            if elements == 5000 * 1001 * 1030));
        assert!(
            e.to_string().contains("5000 encoder frames x 1001 target positions x 1030"),
            "{e}"
        );
        // Exactly at the limit still runs.
        assert_eq!(utterances_per_call(1, 1, MAX_ELEMENTS as usize, 0, 2, None), Ok(1));
    }

    #[test]
    fn parts_inside_the_pool_s_shared_pages() {
        // An H200's largest page (bench/RESULTS.md): pool 2's slices of 586 MB.
        let max_page = 37_527_470_080;
        let bound = pool_bound(max_page);
        assert_eq!(bound, Some(586_366_720));
        // lavapipe's (128 MiB): no parts for memory.
        assert_eq!(pool_bound(128 << 20), None);
        // The rows of the 0.6B joint's 1030 outputs, pitched; 640 and 96 x 4 bytes.
        assert_eq!(pitched_row_bytes(1030), 4608);
        assert_eq!(pitched_row_bytes(640), 2560);
        assert_eq!(pitched_row_bytes(96), 512);
        assert_eq!(pitched_row_bytes(1024), 4096);
        assert_eq!(pitched_row_bytes(2), 16);
        assert_eq!(pitched_row_bytes(1), 4);
        assert_eq!(pitched_row_bytes(129), 1024);
        // The H200 run's step 3: 11 utterances, 148 frames, 80 positions; 600,145,920 bytes
        // whole, 10 fit under the bound, so two parts of 6 and 5.
        assert_eq!(11 * 148 * 80 * pitched_row_bytes(1030), 600_145_920);
        assert_eq!(utterances_per_call(148, 80, 1030, 0, 11, bound), Ok(6));
        assert!(6 * 148 * 80 * pitched_row_bytes(1030) <= bound.unwrap());
        // Step 1's 565 MB fit whole; a configured part stays; one utterance over runs alone.
        assert_eq!(utterances_per_call(143, 78, 1030, 0, 11, bound), Ok(11));
        assert_eq!(utterances_per_call(148, 80, 1030, 3, 11, bound), Ok(3));
        assert_eq!(utterances_per_call(2000, 300, 1030, 0, 4, bound), Ok(1));
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
