//! The encoder's convolutions written as shifted views, elementwise products and sums.
//!
//! Burn's CPU backend runs `conv1d`/`conv2d` with a direct loop that spent 90 % of a tiny
//! model's training step (measured with `perf`); these kernels are small (3x3 stride 2 with one
//! input channel or depthwise, and a depthwise 1-D kernel), so a sum over the kernel taps of
//! shifted views times per-channel weights is exact, fast on every backend and differentiable.
//! Layout is channels-last: `[B, H, W, C]` and `[B, T, C]`. On NdArray the depthwise ones run
//! as one host operation each instead ([`super::host_depthwise`]), which the tap form here
//! checks; on the CubeCL backends each is one operation (`device_depthwise`, `device_strided`,
//! checked the same way).

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::Distribution;

use super::host_depthwise::{self, Geometry};
use super::host_linear;
use super::host_reshape::Reshaped;

fn uniform<B: Backend, const D: usize>(
    shape: [usize; D],
    fan_in: usize,
    device: &B::Device,
) -> Tensor<B, D> {
    // PyTorch's default for convolutions: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    let bound = 1.0 / (fan_in as f64).sqrt();
    Tensor::random(shape, Distribution::Uniform(-bound, bound), device)
}

/// A 3x3 convolution with stride 2 and padding 1 whose every output channel reads one input
/// channel: from a single input channel (`[B, H, W, 1]`) or depthwise (`[B, H, W, C]`).
#[derive(Module, Debug)]
pub struct Conv3x3S2<B: Backend> {
    /// `[9, C]`: tap (row-major over the 3x3 kernel), channel.
    pub(crate) weight: Param<Tensor<B, 2>>,
    pub(crate) bias: Param<Tensor<B, 1>>,
}

/// Rows `2i + d` for `d` in {-1, 0, 1} of a dimension of even length `2n`, as an `n`-long view
/// (index -1 reads zero padding).
fn taps<B: Backend>(x: Tensor<B, 4>, dim: usize) -> [Tensor<B, 4>; 3] {
    let mut dims = x.dims();
    let n = dims[dim] / 2;
    let mut split = [0usize; 5];
    let mut k = 0;
    for (i, &d) in dims.iter().enumerate() {
        if i == dim {
            split[k] = n;
            split[k + 1] = 2;
            k += 2;
        } else {
            split[k] = d;
            k += 1;
        }
    }
    let x5: Tensor<B, 5> = x.reshape(split);
    dims[dim] = n;
    let phase = |p: usize| {
        let ranges: Vec<std::ops::Range<usize>> = split
            .iter()
            .enumerate()
            .map(|(i, &d)| if i == dim + 1 { p..p + 1 } else { 0..d })
            .collect();
        x5.clone().slice(ranges.as_slice()).reshape(dims)
    };
    let (even, odd) = (phase(0), phase(1));
    // Row 2i - 1 is the odd row of pair i - 1; pair -1 is padding.
    let mut zero_dims = dims;
    zero_dims[dim] = 1;
    let zeros = Tensor::zeros(zero_dims, &even.device());
    let shifted = if n > 1 {
        let ranges: Vec<std::ops::Range<usize>> =
            dims.iter().enumerate().map(|(i, &d)| if i == dim { 0..n - 1 } else { 0..d }).collect();
        Tensor::cat(vec![zeros, odd.clone().slice(ranges.as_slice())], dim)
    } else {
        zeros
    };
    [shifted, even, odd]
}

/// Pads a dimension with one zero row when its length is odd.
fn pad_even<B: Backend>(x: Tensor<B, 4>, dim: usize) -> Tensor<B, 4> {
    let dims = x.dims();
    if dims[dim].is_multiple_of(2) {
        return x;
    }
    let mut z = dims;
    z[dim] = 1;
    let zeros = Tensor::zeros(z, &x.device());
    Tensor::cat(vec![x, zeros], dim)
}

/// Output length of this convolution for input length `n`.
#[cfg(test)]
fn out_len(n: usize) -> usize {
    n.div_ceil(2)
}

impl<B: Backend> Conv3x3S2<B> {
    /// `channels` outputs, each from one input channel.
    pub fn new(channels: usize, device: &B::Device) -> Self {
        Conv3x3S2 {
            weight: Param::from_tensor(uniform([9, channels], 9, device)),
            bias: Param::from_tensor(uniform([channels], 9, device)),
        }
    }

    /// `[B, H, W, 1 or C]` to `[B, ceil(H/2), ceil(W/2), C]`.
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let geometry = Geometry { kernel: [3, 3], stride: [2, 2], padding: [1, 1] };
        let (weight, bias) = (self.weight.val(), self.bias.val());
        if let Some(out) = host_depthwise::on_host(&x, &weight, &bias, geometry, None) {
            return out;
        }
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if let Some(out) = super::device_strided::on_device(&x, &weight, &bias) {
            return out;
        }
        self.tap_form(x)
    }

    /// The tensor forms (the backends without `host_depthwise` or `device_strided`; tested
    /// against the latter).
    pub(crate) fn tap_form(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        if x.dims()[3] == 1 {
            self.one_channel(pad_even(pad_even(x, 1), 2))
        } else {
            self.depthwise_taps(x)
        }
    }

    /// `relu(forward(x))` with each item's output rows from `rows[b]` on zeroed (a subsampling
    /// stage's ReLU and time mask). On the CPU backend one host pass: the first stage's output
    /// is the encoder's largest tensor (`[B, T/2, F/2, 256]` at the 0.6B shape), and its ReLU,
    /// mask and their backward as separate operations were a third of the calling thread's
    /// samples in an encoder step (bench/RESULTS.md, "The encoder alone against PyTorch's").
    /// Elsewhere the mask comes first and [`relu`] keeps its output, which the next stage keeps
    /// as its input anyway: one tensor of the stage's size kept for backward, not two.
    pub fn forward_relu_rows(&self, x: Tensor<B, 4>, rows: &[usize]) -> Tensor<B, 4> {
        let geometry = Geometry { kernel: [3, 3], stride: [2, 2], padding: [1, 1] };
        let (w, b) = (self.weight.val(), self.bias.val());
        if let Some(out) = host_depthwise::on_host(&x, &w, &b, geometry, Some(rows)) {
            return out;
        }
        let y = self.forward(x);
        let (t, device) = (y.dims()[1], y.device());
        relu(y * super::mask::keep::<B>(rows, t, &device).reshape([rows.len(), t, 1, 1]))
    }

    /// The depthwise form as a sum over the taps of shifted views (every backend; the CPU
    /// backend runs [`host_depthwise`] instead).
    fn depthwise_taps(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let x = pad_even(pad_even(x, 1), 2);
        let c = self.weight.dims()[1];
        let rows = taps(x, 1);
        let mut out: Option<Tensor<B, 4>> = None;
        for (r, row) in rows.into_iter().enumerate() {
            for (k, view) in taps(row, 2).into_iter().enumerate() {
                let w =
                    self.weight.val().slice([r * 3 + k..r * 3 + k + 1, 0..c]).reshape([1, 1, 1, c]);
                let term = view * w;
                out = Some(match out {
                    Some(o) => o + term,
                    None => term,
                });
            }
        }
        let out = out.expect("a 3x3 kernel has nine taps, so the loop ran");
        out + self.bias.val().reshape([1, 1, 1, c])
    }

    /// From one input channel (the first stage, on the mel spectrogram), as one product: the
    /// nine taps side by side `[B * H' * W', 9]` times the weight `[9, C]`. The elementwise
    /// form below broadcast each tap to all `C` output channels, 17 passes over the stage's
    /// largest tensor; at the 0.6B shape (256 channels over 128 mels) it was most of the
    /// subsampling's time (bench/RESULTS.md, "Training step against PyTorch on the CPU").
    fn one_channel(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let c = self.weight.dims()[1];
        let views: Vec<Tensor<B, 4>> =
            taps(x, 1).into_iter().flat_map(|row| taps(row, 2)).collect();
        let [b, h, w, _] = views[0].dims();
        let cols = Tensor::cat(views, 3).reshape([b * h * w, 9]);
        // On the CPU backend, the product starting from the bias rows over all threads
        // (`host_linear`); elsewhere Burn's product and a bias pass.
        let (weight, bias) = (self.weight.val(), self.bias.val());
        let out = host_linear::on_host(&cols, &weight, Some(&bias))
            .unwrap_or_else(|| cols.matmul(weight) + bias.reshape([1, c]));
        out.reshape([b, h, w, c])
    }
}

/// `max(x, 0)`: on the CubeCL types one operation that keeps its output for the backward
/// (`device_gates`); Burn's, which keeps its input, elsewhere. Masking a tensor of ones and
/// zeros before it or after it gives the same values (a masked element is `+0` or `-0`).
pub(crate) fn relu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(y) = super::device_gates::on_device(super::device_gates::Gate::Relu, &x) {
        return y;
    }
    burn::tensor::activation::relu(x)
}

/// Depthwise 1-D convolution with odd kernel `K`, stride 1, `same` padding, on `[B, T, C]`.
#[derive(Module, Debug)]
pub struct DepthwiseConv1d<B: Backend> {
    /// `[K, C]`.
    pub(crate) weight: Param<Tensor<B, 2>>,
    pub(crate) bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> DepthwiseConv1d<B> {
    /// A kernel of `kernel` taps over `channels` channels.
    pub fn new(channels: usize, kernel: usize, device: &B::Device) -> Self {
        DepthwiseConv1d {
            weight: Param::from_tensor(uniform([kernel, channels], kernel, device)),
            bias: Param::from_tensor(uniform([channels], kernel, device)),
        }
    }

    /// `[B, T, C]` to `[B, T, C]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, t, c] = x.dims();
        let k = self.weight.dims()[0];
        let geometry = Geometry { kernel: [k, 1], stride: [1, 1], padding: [k / 2, 0] };
        let (weight, bias) = (self.weight.val(), self.bias.val());
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        if let Some(out) = super::device_depthwise::on_device(&x, &weight, &bias) {
            return out;
        }
        // Only the host's form reads the input as `[B, T, 1, C]`: a reshape made for the device
        // form too was an unused operation of fusion's stream per layer, and its drop another.
        let x4 = x.clone().reshaped([b, t, 1, c]);
        if let Some(out) = host_depthwise::on_host(&x4, &weight, &bias, geometry, None) {
            return out.reshaped([b, t, c]);
        }
        self.taps(x)
    }

    /// The sum over the taps of shifted views (the backends without `host_depthwise` or
    /// `device_depthwise`; tested against the latter).
    pub(crate) fn taps(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, t, c] = x.dims();
        let k = self.weight.dims()[0];
        let half = k / 2;
        let zeros = Tensor::<B, 3>::zeros([b, half, c], &x.device());
        let padded = Tensor::cat(vec![zeros.clone(), x, zeros], 1); // [B, T + K - 1, C]
        let mut out: Option<Tensor<B, 3>> = None;
        for j in 0..k {
            let w = self.weight.val().slice([j..j + 1, 0..c]).reshape([1, 1, c]);
            let term = padded.clone().slice([0..b, j..j + t, 0..c]) * w;
            out = Some(match out {
                Some(o) => o + term,
                None => term,
            });
        }
        // ModelConfig::validate requires an odd kernel, so k >= 1 and the loop ran.
        out.expect("an odd kernel has at least one tap") + self.bias.val().reshape([1, 1, c])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    type B = NdArray;

    /// Direct float64 convolution: out[i][j][c] = b[c] + sum w[r*3+k][c] x[2i+r-1][2j+k-1][c or 0].
    #[test]
    fn strided_3x3_matches_a_direct_loop() {
        let device = Default::default();
        for (h, w, cin, c) in [(7usize, 6usize, 1usize, 3usize), (8, 5, 4, 4), (1, 1, 2, 2)] {
            let conv = Conv3x3S2::<B>::new(c, &device);
            let x = Tensor::<B, 4>::random([2, h, w, cin], Distribution::Default, &device);
            let got = conv.forward(x.clone()).into_data().to_vec::<f32>().unwrap();
            let xs = x.into_data().to_vec::<f32>().unwrap();
            let ws = conv.weight.val().into_data().to_vec::<f32>().unwrap();
            let bs = conv.bias.val().into_data().to_vec::<f32>().unwrap();
            let (ho, wo) = (out_len(h), out_len(w));
            for bi in 0..2 {
                for i in 0..ho {
                    for j in 0..wo {
                        for ch in 0..c {
                            let mut acc = f64::from(bs[ch]);
                            for r in 0..3 {
                                for k in 0..3 {
                                    let (y, z) = (2 * i + r, 2 * j + k);
                                    if y == 0 || z == 0 || y > h || z > w {
                                        continue;
                                    }
                                    let src = if cin == 1 { 0 } else { ch };
                                    let xv = xs[((bi * h + y - 1) * w + z - 1) * cin + src];
                                    acc += f64::from(ws[(r * 3 + k) * c + ch]) * f64::from(xv);
                                }
                            }
                            let g = got[((bi * ho + i) * wo + j) * c + ch];
                            assert!(
                                (f64::from(g) - acc).abs() < 1e-5,
                                "{h}x{w} ({i},{j},{ch}): {g} vs {acc}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Largest |a - b| over two tensors' values, relative to the largest |b|.
    fn relative<const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f32 {
        let (a, b) =
            (a.into_data().to_vec::<f32>().unwrap(), b.into_data().to_vec::<f32>().unwrap());
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(f32::MIN_POSITIVE);
        a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
    }

    type A = burn::backend::Autodiff<NdArray>;

    /// Relative differences between two forms' outputs `[B, H, W, C]` and their gradients
    /// (input `x`, weight `w`, bias `b`) under the same random upstream gradient.
    fn form_errors<const D: usize>(
        host: Tensor<A, 4>,
        taps: Tensor<A, 4>,
        x: &Tensor<A, D>,
        w: &Param<Tensor<A, 2>>,
        b: &Param<Tensor<A, 1>>,
    ) -> [f32; 4] {
        let r = Tensor::<A, 4>::random(host.dims(), Distribution::Default, &host.device());
        let gh = (host.clone() * r.clone()).sum().backward();
        let gt = (taps.clone() * r).sum().backward();
        [
            relative(host.inner(), taps.inner()),
            relative(x.grad(&gh).unwrap(), x.grad(&gt).unwrap()),
            relative(w.val().grad(&gh).unwrap(), w.val().grad(&gt).unwrap()),
            relative(b.val().grad(&gh).unwrap(), b.val().grad(&gt).unwrap()),
        ]
    }

    /// The host operation (NdArray, under autodiff as in training) against the tap form it
    /// replaces there: the output and the gradients of the input, the weight and the bias,
    /// for the 3x3 stride-2 stage at odd and even sizes and for 1-D kernels.
    #[test]
    fn host_depthwise_matches_the_tap_form_and_its_gradients() {
        let device = Default::default();
        let mut worst = [0f32; 4];
        let mut keep = |errors: [f32; 4]| {
            for (m, e) in worst.iter_mut().zip(errors) {
                *m = m.max(e);
            }
        };
        for (h, w, c) in [(7, 6, 5), (8, 9, 3), (1, 1, 2), (2, 3, 4), (16, 12, 8)] {
            let conv = Conv3x3S2::<A>::new(c, &device);
            let x =
                Tensor::<A, 4>::random([2, h, w, c], Distribution::Default, &device).require_grad();
            let g = Geometry { kernel: [3, 3], stride: [2, 2], padding: [1, 1] };
            let host = host_depthwise::on_host(&x, &conv.weight.val(), &conv.bias.val(), g, None);
            let host = host.expect("NdArray under autodiff takes the host operation");
            assert_eq!(host.dims(), [2, out_len(h), out_len(w), c]);
            let taps = conv.depthwise_taps(x.clone());
            keep(form_errors(host, taps, &x, &conv.weight, &conv.bias));
        }
        for (t, c, k) in [(11, 3, 5), (4, 2, 9), (30, 6, 9)] {
            let conv = DepthwiseConv1d::<A>::new(c, k, &device);
            let x =
                Tensor::<A, 3>::random([2, t, c], Distribution::Default, &device).require_grad();
            let host = conv.forward(x.clone()).reshape([2, t, 1, c]);
            let taps = conv.taps(x.clone()).reshape([2, t, 1, c]);
            keep(form_errors(host, taps, &x, &conv.weight, &conv.bias));
        }
        eprintln!("host depthwise against taps (relative): output, dx, dw, db = {worst:?}");
        // The output adds the same f32 terms in the same order as the tap form (a tap outside
        // the input adds nothing there, a zero here): equal. The gradients sum in other orders;
        // measured 2026-11-26: at most 2.0e-7 of the largest value (the inputs are random).
        assert_eq!(worst[0], 0.0, "output");
        for (what, e) in
            ["input gradient", "weight gradient", "bias gradient"].iter().zip(&worst[1..])
        {
            assert!(*e < 8e-7, "{what}: {e}");
        }
    }

    /// The first subsampling stage on the host (one input channel read by every output
    /// channel, then ReLU and the time mask in the same pass) against the graph form it
    /// replaces (the nine taps side by side times the weight, `relu`, the mask's product), and
    /// the depthwise stage with the same epilogue: outputs and the three gradients, with rows
    /// masked in one item and none in the other. Without a gradient for the input (the
    /// features), the weight's and bias's gradients are the same bits.
    #[test]
    fn host_stage_with_relu_and_rows_matches_the_graph_form() {
        let device = Default::default();
        let mut worst = [0f32; 4];
        for (h, w, cin, c) in [(7, 6, 1, 5), (16, 12, 1, 8), (1, 1, 1, 2), (9, 8, 4, 4)] {
            let conv = Conv3x3S2::<A>::new(c, &device);
            let x = Tensor::<A, 4>::random([2, h, w, cin], Distribution::Default, &device)
                .require_grad();
            let ho = out_len(h);
            let rows = [ho.div_ceil(2), ho];
            let host = conv.forward_relu_rows(x.clone(), &rows);
            let mask = crate::model::mask::keep::<A>(&rows, ho, &device).reshape([2, ho, 1, 1]);
            let plain = if cin == 1 {
                conv.one_channel(pad_even(pad_even(x.clone(), 1), 2))
            } else {
                conv.depthwise_taps(x.clone())
            };
            let graph = burn::tensor::activation::relu(plain) * mask;
            // The masked rows are zero.
            let tail = host.clone().inner().slice([0..1, rows[0]..ho, 0..out_len(w), 0..c]);
            assert_eq!(tail.abs().sum().into_scalar(), 0.0, "{h}x{w}x{cin}");
            for (m, e) in
                worst.iter_mut().zip(form_errors(host, graph, &x, &conv.weight, &conv.bias))
            {
                *m = m.max(e);
            }
            // The same without the input's gradient (the first stage's features).
            let x0 = x.clone().detach();
            let r = Tensor::<A, 4>::random([2, ho, out_len(w), c], Distribution::Default, &device);
            let g1 = (conv.forward_relu_rows(x.clone(), &rows) * r.clone()).sum().backward();
            let g0 = (conv.forward_relu_rows(x0, &rows) * r).sum().backward();
            let bits = |g: &<A as burn::tensor::backend::AutodiffBackend>::Gradients| {
                let w = conv.weight.val().grad(g).unwrap().into_data().to_vec::<f32>().unwrap();
                let b = conv.bias.val().grad(g).unwrap().into_data().to_vec::<f32>().unwrap();
                (w, b)
            };
            assert_eq!(bits(&g1), bits(&g0), "{h}x{w}x{cin}: the parameters' gradients");
        }
        eprintln!("host stage + relu + rows against the graph (relative): {worst:?}");
        // The one-channel output sums its nine terms and the bias in another order than the
        // graph's product, and the gradients sum in other orders. Measured 2026-11-27 over six
        // runs (random inputs): output, dx, dw, db at most 2.1e-7, 2.3e-7, 3.9e-7 and 1.0e-7 of
        // the largest value; the bounds are about 4x those.
        let bounds = [8e-7, 9.2e-7, 1.6e-6, 4e-7];
        for ((what, e), bound) in ["output", "input gradient", "weight gradient", "bias gradient"]
            .iter()
            .zip(&worst)
            .zip(bounds)
        {
            assert!(*e < bound, "{what}: {e}");
        }
    }

    #[test]
    fn depthwise_1d_matches_a_direct_loop() {
        let device = Default::default();
        let (t, c, k) = (11, 3, 5);
        let conv = DepthwiseConv1d::<B>::new(c, k, &device);
        let x = Tensor::<B, 3>::random([2, t, c], Distribution::Default, &device);
        let got = conv.forward(x.clone()).into_data().to_vec::<f32>().unwrap();
        let xs = x.into_data().to_vec::<f32>().unwrap();
        let ws = conv.weight.val().into_data().to_vec::<f32>().unwrap();
        let bs = conv.bias.val().into_data().to_vec::<f32>().unwrap();
        for b in 0..2 {
            for i in 0..t {
                for ch in 0..c {
                    let mut acc = f64::from(bs[ch]);
                    for j in 0..k {
                        let src = i as i64 + j as i64 - (k / 2) as i64;
                        if (0..t as i64).contains(&src) {
                            acc += f64::from(ws[j * c + ch])
                                * f64::from(xs[(b * t + src as usize) * c + ch]);
                        }
                    }
                    let g = got[(b * t + i) * c + ch];
                    assert!((f64::from(g) - acc).abs() < 1e-5);
                }
            }
        }
    }
}
