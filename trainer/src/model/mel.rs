//! NeMo's mel front end on the device: 16-bit PCM to normalised log-mel features.
//!
//! Steps (NeMo `FilterbankFeatures`): scale to [-1, 1); dither (training); pre-emphasis
//! `y[t] = x[t] - 0.97 x[t-1]`; STFT with `center=True` zero padding of `n_fft / 2`, a symmetric
//! Hann window of `window_size` samples centred in `n_fft`, hop `window_stride`; power spectrum;
//! Slaney mel filterbank (librosa's `filters.mel(norm="slaney", htk=False)`); `log(x + 2^-24)`;
//! per-feature normalisation over each utterance's valid frames (`samples / hop` of them, as
//! NeMo 2 counts; mean, unbiased std + 1e-5);
//! frames past the valid length set to 0. Frames are assembled on the device from hop-sized
//! blocks of the padded signal and multiplied by the windowed DFT basis (one matrix product), so
//! the whole front end is tensor operations on the device. On the CPU backends, whose tensors
//! are host memory, the same steps run on the host with a real FFT ([`super::host_mel`]).

use burn::prelude::*;
use burn::tensor::Distribution;

use super::config::PreprocessorConfig;
use super::host_mel::HostMel;

/// Normalisation floor NeMo adds to the standard deviation.
pub(super) const STD_EPS: f64 = 1e-5;

/// The front end's constant tensors on one device.
#[derive(Debug, Clone)]
pub struct MelFrontend<B: Backend> {
    cfg: PreprocessorConfig,
    /// `[n_fft, 2 * bins]`: windowed cosine columns, then windowed minus-sine columns.
    dft: Tensor<B, 2>,
    /// `[bins, features]`.
    filterbank: Tensor<B, 2>,
    bins: usize,
    /// The host form, on the CPU backends ([`host_memory`]).
    host: Option<HostMel>,
}

/// Whether `B` keeps its tensors in host memory: NdArray and burn-flex, bare or under autodiff
/// (the backend types `device::dispatch` runs on the CPU). The front end has no parameters, so
/// its backend only decides where its arithmetic runs.
fn host_memory<B: Backend>() -> bool {
    use burn::backend::{Autodiff, Flex, NdArray};
    use std::any::TypeId;
    let id = TypeId::of::<B>();
    [
        TypeId::of::<NdArray>(),
        TypeId::of::<Autodiff<NdArray>>(),
        TypeId::of::<Flex>(),
        TypeId::of::<Autodiff<Flex>>(),
    ]
    .contains(&id)
}

/// Slaney mel scale (librosa's default): linear below 1 kHz, logarithmic above.
fn hz_to_mel(f: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    if f < 1000.0 {
        f / f_sp
    } else {
        1000.0 / f_sp + (f / 1000.0).ln() / (6.4f64.ln() / 27.0)
    }
}

fn mel_to_hz(m: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_mel = 1000.0 / f_sp;
    if m < min_log_mel {
        m * f_sp
    } else {
        1000.0 * ((m - min_log_mel) * (6.4f64.ln() / 27.0)).exp()
    }
}

/// Slaney-normalised triangular mel filters, `[n_fft / 2 + 1][n_mels]` row-major, from 0 Hz to
/// the Nyquist frequency.
pub fn mel_filterbank(sample_rate: u32, n_fft: usize, n_mels: usize) -> Vec<f64> {
    let bins = n_fft / 2 + 1;
    let (lo, hi) = (hz_to_mel(0.0), hz_to_mel(f64::from(sample_rate) / 2.0));
    let hz: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let mut fb = vec![0.0; bins * n_mels];
    for m in 0..n_mels {
        let enorm = 2.0 / (hz[m + 2] - hz[m]);
        for k in 0..bins {
            let f = k as f64 * f64::from(sample_rate) / n_fft as f64;
            let lower = (f - hz[m]) / (hz[m + 1] - hz[m]);
            let upper = (hz[m + 2] - f) / (hz[m + 2] - hz[m + 1]);
            fb[k * n_mels + m] = lower.min(upper).max(0.0) * enorm;
        }
    }
    fb
}

/// The symmetric Hann window of `win` samples NeMo's featurizer keeps
/// (`torch.hann_window(win, periodic=False)`).
pub fn hann_window(win: usize) -> Vec<f64> {
    (0..win)
        .map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / (win - 1) as f64).cos())
        .collect()
}

/// `n` Gaussian samples of standard deviation `scale`.
/// PCM `[batch, samples]` as f32 sample values, uploaded as pairs of 16-bit samples packed
/// into 32-bit words (`low | high << 16`, bit patterns, no arithmetic on the host) and unpacked
/// on the device with an arithmetic shift and a subtraction, which give the same values on
/// 32- and 64-bit integer backends.
pub fn unpack_pcm<B: Backend>(
    pcm: &[i16],
    batch: usize,
    samples: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    let n = batch * samples;
    let words: Vec<i32> = pcm[..n]
        .chunks(2)
        .map(|p| {
            let lo = u32::from(p[0] as u16);
            let hi = u32::from(p.get(1).map_or(0, |&s| s as u16));
            (lo | (hi << 16)) as i32
        })
        .collect();
    let w = words.len();
    let words = Tensor::<B, 1, Int>::from_data(TensorData::new(words, [w]), device);
    let high = words.clone().bitwise_right_shift_scalar(16.elem());
    let low = words - high.clone().mul_scalar(65_536);
    let low = low.clone() - low.greater_equal_elem(32_768).int().mul_scalar(65_536);
    Tensor::stack::<2>(vec![low, high], 1)
        .reshape([2 * w])
        .narrow(0, 0, n)
        .float()
        .reshape([batch, samples])
}

/// The `n_fft`-long analysis window: the Hann window of `window_size` samples centred in it,
/// zero outside.
pub(super) fn centred_window(cfg: &PreprocessorConfig) -> Vec<f64> {
    let (n_fft, win) = (cfg.n_fft, cfg.window_size);
    let offset = (n_fft - win) / 2;
    let mut window = vec![0.0; n_fft];
    window[offset..offset + win].copy_from_slice(&hann_window(win));
    window
}

/// Valid frames of an utterance of `samples` samples: `samples / hop`, as NeMo 2 counts them
/// (`FilterbankFeatures.get_seq_len`). The padded tensor has `max_samples / hop + 1` centred
/// frames; the last one of each utterance is treated as padding, as NeMo does.
pub fn frames(cfg: &PreprocessorConfig, samples: usize) -> usize {
    samples / cfg.window_stride
}

/// Frames of a batch padded to `max_samples` samples: centred frames, one per hop plus one.
pub fn padded_frames(cfg: &PreprocessorConfig, max_samples: usize) -> usize {
    max_samples / cfg.window_stride + 1
}

impl<B: Backend> MelFrontend<B> {
    /// Builds the constant tensors on `device`.
    pub fn new(cfg: &PreprocessorConfig, device: &B::Device) -> MelFrontend<B> {
        let n_fft = cfg.n_fft;
        let bins = n_fft / 2 + 1;
        let window = centred_window(cfg);
        let mut dft = vec![0f32; 2 * bins * n_fft];
        for k in 0..bins {
            for (n, w) in window.iter().enumerate() {
                let phase = 2.0 * std::f64::consts::PI * ((k * n) % n_fft) as f64 / n_fft as f64;
                dft[n * 2 * bins + k] = (w * phase.cos()) as f32;
                dft[n * 2 * bins + bins + k] = (-w * phase.sin()) as f32;
            }
        }
        let fb: Vec<f32> = mel_filterbank(cfg.sample_rate, n_fft, cfg.features)
            .into_iter()
            .map(|x| x as f32)
            .collect();
        MelFrontend {
            cfg: cfg.clone(),
            dft: Tensor::from_data(TensorData::new(dft, [n_fft, 2 * bins]), device),
            filterbank: Tensor::from_data(TensorData::new(fb, [bins, cfg.features]), device),
            bins,
            host: host_memory::<B>().then(|| HostMel::new(cfg)),
        }
    }

    /// This front end with its arithmetic as tensor operations on every backend (tests and
    /// benchmarks compare the two forms).
    pub fn on_device(mut self) -> Self {
        self.host = None;
        self
    }

    /// Valid frames of each utterance of `lens` samples in a batch of `n_frames` frames.
    fn frame_lens(&self, lens: &[u32], n_frames: usize) -> Vec<usize> {
        lens.iter().map(|&n| frames(&self.cfg, n as usize).min(n_frames)).collect()
    }

    /// Whether the front end runs on the host ([`super::host_mel`]).
    pub fn runs_on_host(&self) -> bool {
        self.host.is_some()
    }

    /// Features `[batch, frames, features]` and valid frames per utterance, from padded 16-bit
    /// PCM `[batch, samples]` (row-major) and each utterance's sample count. With
    /// `dither_seed` (training) Gaussian dither is added, drawn on the device from the backend's
    /// generator seeded with that seed under a process-wide lock ([`super::draw_seeded`]), so
    /// that it depends on nothing else. The PCM travels as 16-bit samples, two to a 32-bit word
    /// (the only per-sample upload), and is unpacked on the device.
    pub fn forward(
        &self,
        pcm: &[i16],
        batch: usize,
        lens: &[u32],
        dither_seed: Option<u64>,
        device: &B::Device,
    ) -> (Tensor<B, 3>, Vec<usize>) {
        if let Some(host) = &self.host {
            if let Some(out) = self.forward_on_host(host, pcm, batch, lens, dither_seed, device) {
                return out;
            }
        }
        let samples = pcm.len() / batch.max(1);
        let mut x = unpack_pcm::<B>(pcm, batch, samples, device).mul_scalar(1.0 / 32768.0);
        let sample_lens: Vec<usize> = lens.iter().map(|&n| n as usize).collect();
        let valid = super::mask::keep::<B>(&sample_lens, samples, device);
        if let (Some(seed), true) = (dither_seed, self.cfg.dither > 0.0) {
            let normal = Distribution::Normal(0.0, self.cfg.dither);
            let noise = super::draw_seeded::<B, _>(device, seed, || {
                Tensor::<B, 2>::random([batch, samples], normal, device)
            });
            x = x + noise;
        }
        if self.cfg.preemph != 0.0 && samples > 1 {
            let head = x.clone().slice([0..batch, 0..1]);
            let rest = x.clone().slice([0..batch, 1..samples])
                - x.clone().slice([0..batch, 0..samples - 1]).mul_scalar(self.cfg.preemph);
            x = Tensor::cat(vec![head, rest], 1);
        }
        let x = x * valid;
        // Frame t covers padded samples [t * hop, t * hop + n_fft): blocks t .. t + n_fft / hop
        // of hop samples each, the last one partly.
        let (n_fft, hop) = (self.cfg.n_fft, self.cfg.window_stride);
        let pad = n_fft / 2;
        let n_frames = padded_frames(&self.cfg, samples);
        let (whole, rest) = (n_fft / hop, n_fft % hop);
        let blocks = n_frames + whole;
        let right = blocks * hop - samples - pad;
        let x = Tensor::cat(
            vec![Tensor::zeros([batch, pad], device), x, Tensor::zeros([batch, right], device)],
            1,
        )
        .reshape([batch, blocks, hop]);
        let mut parts: Vec<Tensor<B, 3>> =
            (0..whole).map(|j| x.clone().slice([0..batch, j..j + n_frames, 0..hop])).collect();
        if rest > 0 {
            parts.push(x.slice([0..batch, whole..whole + n_frames, 0..rest]));
        }
        let frames_t = Tensor::cat(parts, 2); // [B, frames, n_fft]
        let spec = frames_t.matmul(self.dft.clone().unsqueeze::<3>()); // [B, frames, 2 * bins]
        let re = spec.clone().slice([0..batch, 0..n_frames, 0..self.bins]);
        let im = spec.slice([0..batch, 0..n_frames, self.bins..2 * self.bins]);
        let power = re.clone() * re + im.clone() * im; // [B, frames, bins]
        let mel = power.matmul(self.filterbank.clone().unsqueeze::<3>());
        let logmel = (mel + self.cfg.log_zero_guard_value).log(); // [B, frames, features]

        let frame_lens = self.frame_lens(lens, n_frames);
        let mask =
            super::mask::keep::<B>(&frame_lens, n_frames, device).reshape([batch, n_frames, 1]);
        let counts: Vec<f32> = frame_lens.iter().map(|&l| l.max(1) as f32).collect();
        let counts = Tensor::<B, 1>::from_data(TensorData::new(counts, [batch]), device)
            .reshape([batch, 1, 1]);
        let dof: Vec<f32> = frame_lens.iter().map(|&l| (l.max(2) - 1) as f32).collect();
        let dof =
            Tensor::<B, 1>::from_data(TensorData::new(dof, [batch]), device).reshape([batch, 1, 1]);
        let mean = (logmel.clone() * mask.clone()).sum_dim(1) / counts;
        let centred = (logmel - mean) * mask.clone();
        let std = (centred.clone().powf_scalar(2.0).sum_dim(1) / dof).sqrt();
        let features = centred / (std + STD_EPS) * mask;
        (features, frame_lens)
    }

    /// [`Self::forward`] on the host: the same dither draw as the tensor form, the signal and
    /// everything after it in f64 ([`HostMel::features`]). `None` if the dither could not be
    /// read as f32 (the tensor form then runs instead).
    fn forward_on_host(
        &self,
        host: &HostMel,
        pcm: &[i16],
        batch: usize,
        lens: &[u32],
        dither_seed: Option<u64>,
        device: &B::Device,
    ) -> Option<(Tensor<B, 3>, Vec<usize>)> {
        let samples = pcm.len() / batch.max(1);
        let mut x: Vec<f64> =
            pcm[..batch * samples].iter().map(|&s| f64::from(s) / 32768.0).collect();
        if let (Some(seed), true) = (dither_seed, self.cfg.dither > 0.0) {
            let normal = Distribution::Normal(0.0, self.cfg.dither);
            let noise = super::draw_seeded::<B, _>(device, seed, || {
                Tensor::<B, 2>::random([batch, samples], normal, device)
            });
            let noise = noise.into_data().convert::<f32>().into_vec::<f32>().ok()?;
            x.iter_mut().zip(&noise).for_each(|(x, n)| *x += f64::from(*n));
        }
        for (row, &len) in x.chunks_exact_mut(samples.max(1)).zip(lens) {
            if self.cfg.preemph != 0.0 && samples > 1 {
                // Backwards, so that each step reads its predecessor before it changes.
                for t in (1..samples).rev() {
                    row[t] -= row[t - 1] * self.cfg.preemph;
                }
            }
            row[(len as usize).min(samples)..].fill(0.0);
        }
        let n_frames = padded_frames(&self.cfg, samples);
        let frame_lens = self.frame_lens(lens, n_frames);
        let features = host.features(&x, batch, n_frames, &frame_lens);
        let shape = [batch, n_frames, self.cfg.features];
        Some((Tensor::from_data(TensorData::new(features, shape), device), frame_lens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slaney_mel_scale_round_trips_and_matches_librosa_points() {
        for f in [0.0, 500.0, 1000.0, 4000.0, 8000.0] {
            assert!((mel_to_hz(hz_to_mel(f)) - f).abs() < 1e-9);
        }
        // librosa.hz_to_mel(1000) == 15, librosa.hz_to_mel(8000) == 45.2452...
        assert!((hz_to_mel(1000.0) - 15.0).abs() < 1e-12);
        assert!((hz_to_mel(8000.0) - 45.245_640_471_924_965).abs() < 1e-9);
    }

    #[test]
    fn filters_are_triangles_with_slaney_area() {
        let fb = mel_filterbank(16_000, 512, 80);
        let bins = 257;
        for m in 0..80 {
            let col: Vec<f64> = (0..bins).map(|k| fb[k * 80 + m]).collect();
            assert!(col.iter().all(|&w| w >= 0.0));
            assert!(col.iter().any(|&w| w > 0.0), "filter {m} is empty");
        }
    }
}
