//! Tensors laid out in one flat tensor, as one launch per group of them on the CubeCL backends
//! (wgpu, CUDA; fused or not): `flat_adamw`'s gradients and parameters, each step.
//!
//! In Burn's form a layout is a zero fill and one slice assignment (a launch) per tensor: at the
//! 0.6B preset about 900 launches for the gradients and as many for the parameters each step,
//! and on lavapipe 74 of a Conformer layer's 384 (bench/RESULTS.md, "Fewer launches per
//! Conformer layer"). A GPU step is bound by the host's cost per launch. Here one kernel reads a
//! group of up to [`GROUP`] tensors (a `Sequence` of arrays, one binding each) and writes its
//! span of the flat tensor, zeros included: one launch per group and no fill. Within a launch
//! each part has its own cubes, as many as its span needs, which copy it. (The first version had
//! every unit test each of the group's parts for the one covering its element: 36 ms a step on
//! an H200 for the 0.6B preset, 8 % of its device time; bench/RESULTS.md, "The step on the
//! device". The second gave every part a row of as many cubes as the group's longest part
//! needed, most of them idle: 0.6 s a launch on lavapipe.)
//!
//! [`split`] is the inverse, for the parameters after their update: a flat tensor's pieces as
//! views, each a slice and a reshape.
//!
//! Which backend: the trainer's CubeCL types (`Wgpu`, `FusedWgpu`, `Cuda`, `FusedCuda`), bare,
//! with f32 tensors; `None` elsewhere, and the caller lays out in Burn's form. Under fusion a
//! layout or a split is one operation queued in fusion's stream (`in_stream_vec`). Until
//! 2026-12-01 the layout resolved each input (a round trip to fusion's thread per tensor, about
//! 2,000 a step at the 0.6B preset), and each part and each piece cost fusion a reshape or a
//! slice and a reshape of its own.
//!
//! Invariants: each part is taken as its elements in row-major order, whatever its shape; the
//! parts are in increasing order of their offsets, and do not overlap or pass the end; element `e` of the result is part `k`'s element `e - at_k` where a part covers
//! it, else zero. Each group's launch writes `[its first offset (0 for the first), the next
//! group's first offset (the end for the last))`, so the launches write every element once;
//! within it part `k`'s cubes write from its offset (the group's first for `k = 0`) to the next
//! part's, each cube its own block of `CUBE * PER_UNIT` of them. A group has as many tensors as
//! the device binds less three (the output, the scalars and one spare), at most [`GROUP`]:
//! wgpu's limit on storage buffers per shader can be as low as 8.

use asr_tdt::fusion::in_stream_vec;
use burn::prelude::*;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorMetadata, TensorPrimitive};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use burn_fusion::{Fusion, FusionBackend};

use super::flat_adamw::views;
use crate::model::device_op::{contiguous, cube_index, cubes, empty, on_cube_types, CUBE};
use crate::model::host_depthwise::same;

/// Most tensors one launch reads. Each distinct group size is its own compiled kernel; with
/// 32, the 0.6B preset's ~900 gradients take about 30 launches.
pub const GROUP: usize = 32;

/// Each part's own cubes, `[firsts[k], ends[k])` of the grid ([`cube_index`]), whose units copy
/// [`PER_UNIT`] elements each of the part's span of `out`, `[lows[k], highs[k])`: the part where
/// it covers an element, zero elsewhere (the gap before the next part).
#[cube(launch)]
pub fn lay_out_group(
    parts: &Sequence<Array<f32>>,
    starts: &Sequence<u32>,
    lens: &Sequence<u32>,
    lows: &Sequence<u32>,
    highs: &Sequence<u32>,
    firsts: &Sequence<u32>,
    ends: &Sequence<u32>,
    out: &mut Array<f32>,
) {
    let count = parts.len().comptime();
    let cube = cube_index();
    #[unroll]
    for k in 0..count {
        // The same branch for every unit of a cube: one part's copy, not a search per element.
        if cube >= firsts[k] && cube < ends[k] {
            let start = starts[k];
            // The part's own length, not its array's: a view's binding may reach further.
            let end = start + lens[k];
            let block = CUBE_DIM * PER_UNIT as u32;
            let from = lows[k] + (cube - firsts[k]) * block;
            let to = u32::min(from + block, highs[k]);
            let part = &parts[k];
            let mut e = from + UNIT_POS;
            while e < to {
                let mut value = 0.0f32;
                if e >= start && e < end {
                    value = part[(e - start) as usize];
                }
                out[e as usize] = value;
                e += CUBE_DIM;
            }
        }
    }
}

/// Elements each unit copies: a part's span takes `ceil(span / (CUBE * PER_UNIT))` cubes, so a
/// launch has about as many cubes as its elements need. The earlier grid gave every part the
/// longest part's row of cubes, most of them idle: 0.6 s a launch on lavapipe for a
/// 23M-parameter model. A unit's cost beyond its copies (finding its part among up to 32) is
/// large on lavapipe: laying out 26M elements took 1.35 s at 1 element a unit, 0.82 s at 4,
/// 0.17 s at 32, 0.14 s at 64, 0.09 s at 128 (Burn's fill and slice assignments: 0.07 s). 64
/// still gives a GPU enough cubes: about 1,600 for 26M elements.
const PER_UNIT: usize = 64;

/// The layout as one operation per group (see the module), and its inverse as views: the
/// backends that have them.
pub trait DeviceLayout: Backend {
    /// `parts` (f32 tensors of any shape, each taken as its elements in row-major order, with
    /// their offsets, see the module) in a new flat tensor of `len` elements, zeros elsewhere.
    fn lay_out(parts: Vec<(usize, FloatTensor<Self>)>, len: usize) -> FloatTensor<Self>;

    /// Pieces of `flat` (one dimension): piece `k` its elements from `at_k` on, shaped `dims_k`
    /// (`flat_adamw::views`).
    fn split(flat: FloatTensor<Self>, pieces: Vec<(usize, Vec<usize>)>) -> Vec<FloatTensor<Self>> {
        views::<Self>(flat, pieces)
    }

    /// Drops `tensors`. Under fusion, one operation for all of them (see [`release`]).
    fn release(tensors: Vec<FloatTensor<Self>>) {
        drop(tensors);
    }
}

impl<R, F, I, BT> DeviceLayout for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn lay_out(parts: Vec<(usize, FloatTensor<Self>)>, len: usize) -> FloatTensor<Self> {
        let parts: Vec<_> = parts.into_iter().map(|(at, t)| (at, contiguous(t))).collect();
        let Some((_, first)) = parts.first() else {
            unreachable!("`on_device` lays out at least one tensor")
        };
        let (client, device) = (first.client.clone(), first.device.clone());
        let out = empty::<R>(&client, &device, vec![len]);
        let bindings = client.properties().hardware.max_bindings as usize;
        let group = GROUP.min(bindings.saturating_sub(3)).max(1);
        let groups: Vec<_> = parts.chunks(group).collect();
        for (g, members) in groups.iter().enumerate() {
            let group_lo = if g == 0 { 0 } else { members[0].0 };
            let group_hi = groups.get(g + 1).map_or(len, |next| next[0].0);
            // Part k's span: from its start (the group's for the first, so that zeros before
            // it are written) to the next part's (the group's end for the last).
            let lows: Vec<usize> = members
                .iter()
                .enumerate()
                .map(|(k, (at, _))| if k == 0 { group_lo } else { *at })
                .collect();
            let highs: Vec<usize> = (0..members.len())
                .map(|k| members.get(k + 1).map_or(group_hi, |next| next.0))
                .collect();
            // Part k's cubes: enough for its span, none for an empty one.
            let block = CUBE as usize * PER_UNIT;
            let mut ends = Vec::with_capacity(members.len());
            let mut total = 0usize;
            for (lo, hi) in lows.iter().zip(&highs) {
                total += (hi - lo).div_ceil(block);
                ends.push(total);
            }
            if total == 0 {
                continue;
            }
            let firsts: Vec<usize> =
                std::iter::once(0).chain(ends.iter().copied()).take(members.len()).collect();
            let arrays: SequenceArg<R, Array<f32>> =
                members.iter().map(|(_, t)| t.clone().into_array_arg()).collect();
            let u32s =
                |xs: &[usize]| -> SequenceArg<R, u32> { xs.iter().map(|&x| x as u32).collect() };
            let starts: Vec<usize> = members.iter().map(|(at, _)| *at).collect();
            let lens: Vec<usize> = members.iter().map(|(_, t)| t.shape().num_elements()).collect();
            // Each unit writes elements of its part's span and reads the part only where the
            // part covers them; the checked launch bounds every access anyway.
            lay_out_group::launch::<R>(
                &client,
                cubes(total),
                CubeDim::new_1d(CUBE),
                arrays,
                u32s(&starts),
                u32s(&lens),
                u32s(&lows),
                u32s(&highs),
                u32s(&firsts),
                u32s(&ends),
                out.clone().into_array_arg(),
            );
        }
        out
    }
}

/// Under fusion each call is one custom operation of fusion's stream ([`in_stream_vec`]): a
/// layout or a split is queued after what produced its tensors, without a round trip to
/// fusion's thread per tensor, and a split gives all its pieces in one operation, not a slice
/// and a reshape each (about 2,000 operations a step at the 0.6B preset, each with its host
/// cost on two threads; bench/RESULTS.md, 2026-12-01).
impl<B> DeviceLayout for Fusion<B>
where
    B: FusionBackend + DeviceLayout,
{
    fn lay_out(parts: Vec<(usize, FloatTensor<Self>)>, len: usize) -> FloatTensor<Self> {
        let (offsets, tensors): (Vec<usize>, Vec<_>) = parts.into_iter().unzip();
        let out = vec![(vec![len], DType::F32)];
        let mut laid = in_stream_vec::<B, _>("lay_out", tensors, out, move |tensors| {
            vec![B::lay_out(offsets.iter().copied().zip(tensors).collect(), len)]
        });
        match laid.pop() {
            Some(flat) => flat,
            // `in_stream_vec` returns one tensor per declared output.
            None => unreachable!("lay_out: no output"),
        }
    }

    fn split(flat: FloatTensor<Self>, pieces: Vec<(usize, Vec<usize>)>) -> Vec<FloatTensor<Self>> {
        let dtype = flat.dtype();
        let outs = pieces.iter().map(|(_, dims)| (dims.clone(), dtype)).collect();
        in_stream_vec::<B, _>("split", vec![flat], outs, move |mut flat| match flat.pop() {
            Some(flat) => B::split(flat, pieces.clone()),
            // `in_stream_vec` hands over the one input it was given.
            None => unreachable!("split: no input"),
        })
    }

    fn release(tensors: Vec<FloatTensor<Self>>) {
        if !tensors.is_empty() {
            // Each input whose handle is the last is queued read-write: fusion registers no drop
            // of its own for it, and the operation's run frees it on fusion's thread.
            in_stream_vec::<B, _>("release", tensors, Vec::new(), |tensors| {
                drop(tensors);
                Vec::new()
            });
        }
    }
}

/// `parts` placed at their offsets in a flat tensor of `len` elements, zeros elsewhere (see the
/// module for what the parts must be; each is taken as its elements, whatever its shape), as
/// one launch per group where the backend is one of the trainer's CubeCL types (bare), the
/// tensors f32 and at least one not empty, and the offsets fit the kernel's 32-bit indices;
/// the parts given back elsewhere. The parts are moved, not cloned: under fusion a tensor
/// whose last handle goes to the layout is freed by it, where a clone would leave its handle to
/// be dropped after, one more operation of fusion's stream per tensor.
pub fn on_device<B: Backend>(
    parts: Vec<(usize, FloatTensor<B>)>,
    len: usize,
) -> Result<Tensor<B, 1>, Vec<(usize, FloatTensor<B>)>> {
    let n = |t: &FloatTensor<B>| t.shape().num_elements();
    // An empty part adds nothing, and an empty buffer is not a valid binding on every device.
    let filled: Vec<_> = parts.iter().filter(|(_, t)| n(t) > 0).collect();
    if filled.is_empty()
        || u32::try_from(len).is_err()
        || filled.iter().any(|(_, t)| t.dtype() != DType::F32)
        || filled.windows(2).any(|w| w[0].0 + n(&w[0].1) > w[1].0)
        || filled.last().is_some_and(|(at, t)| at + n(t) > len)
    {
        return Err(parts);
    }
    on_cube_types!(B, T, { Err(parts) }, {
        let parts = parts
            .into_iter()
            .filter(|(_, t)| n(t) > 0)
            .map(|(at, t)| (at, same::<_, FloatTensor<T>>(t)))
            .collect();
        let flat = Tensor::<T, 1>::from_primitive(TensorPrimitive::Float(T::lay_out(parts, len)));
        Ok(same(flat))
    });
    Err(parts)
}

/// Whether [`on_device`] lays tensors out on `B` as one operation (one of the trainer's CubeCL
/// types, bare): where it does not, a layout is a fill and a copy per tensor.
pub fn lays_out_on_device<B: Backend>() -> bool {
    on_cube_types!(B, T, { false }, { true });
    false
}

/// [`views`] of `flat`, as one operation where the backend is one of the trainer's CubeCL
/// types under fusion (bare), else as a slice and a reshape each.
pub fn split<B: Backend>(
    flat: FloatTensor<B>,
    pieces: Vec<(usize, Vec<usize>)>,
) -> Vec<FloatTensor<B>> {
    on_cube_types!(B, T, { views::<B>(flat, pieces) }, {
        T::split(same(flat), pieces).into_iter().map(same).collect()
    });
    views::<B>(flat, pieces)
}

/// Drops `tensors`, as one operation of fusion's stream where the backend is one of the
/// trainer's CubeCL types under fusion (bare), else one by one. Fusion registers a drop
/// operation for each tensor whose last handle is dropped outside an operation: the optimizer's
/// old parameter values, one per parameter tensor each step, were 923 of the 4,925 operations a
/// step of bench/fusion_ops.sh's preset, the 0.6B preset's structure (bench/RESULTS.md,
/// 2026-12-01, "The old parameters released").
/// A tensor with another handle is left to that handle.
pub fn release<B: Backend>(tensors: Vec<FloatTensor<B>>) {
    on_cube_types!(B, T, { drop(tensors) }, {
        let tensors = tensors.into_iter().map(same::<_, FloatTensor<T>>).collect();
        T::release(tensors)
    });
    drop(tensors);
}

#[cfg(test)]
#[cfg(feature = "wgpu")]
mod tests {
    use super::*;
    use crate::model::host_depthwise::float;

    /// The layout against Burn's form (a zero fill and a slice assignment per part) on the same
    /// backend: more parts than a group, gaps before, between and after them, an empty part,
    /// views inside longer tensors, a group boundary inside a gap, and parts and gaps longer
    /// than a cube's block. The two must agree bit for bit (it only moves values).
    fn against_burn<B: DeviceLayout>() {
        let device = Default::default();
        // Some parts and gaps span several cubes' blocks (1,024 elements).
        let sizes = [5usize, 300, 0, 128, 1, 77, 256, 3, 40, 9, 2600];
        let mut parts = Vec::new();
        let mut at = 7;
        for (k, &n) in sizes.iter().cycle().take(3 * GROUP + 5).enumerate() {
            // Every third part a view inside a longer tensor, as the parameters are views of
            // the last step's flat result.
            let (pad, tail) = if k % 3 == 0 && n > 0 { (4, 9) } else { (0, 0) };
            let values: Vec<f32> =
                (0..pad + n + tail).map(|i| (k * 1000 + i) as f32 + 0.5).collect();
            let mut t = Tensor::<B, 1>::from_floats(values.as_slice(), &device);
            if pad > 0 {
                t = t.narrow(0, pad, n);
            }
            parts.push((at, t));
            at += n + if k % 7 == 0 { 1500 } else { k % 3 };
        }
        let len = at + 11;
        // Every fourth part of an even length laid out in two dimensions: a part is taken as
        // its elements, whatever its shape.
        let prims: Vec<_> = parts
            .iter()
            .enumerate()
            .map(|(k, (at, t))| {
                let n = t.dims()[0];
                let t = if k % 4 == 1 && n % 2 == 0 && n > 0 {
                    float(t.clone().reshape([n / 2, 2]))
                } else {
                    float(t.clone())
                };
                (*at, t)
            })
            .collect();
        let ours = on_device::<B>(prims, len).unwrap_or_else(|_| panic!("wgpu takes the layout"));
        let theirs = parts
            .iter()
            .filter(|(_, p)| p.dims()[0] > 0)
            .fold(Tensor::<B, 1>::zeros([len], &device), |out, (at, p)| {
                out.slice_assign(*at..*at + p.dims()[0], p.clone())
            });
        assert_eq!(ours.into_data().into_vec::<f32>().unwrap(), {
            theirs.into_data().into_vec::<f32>().unwrap()
        });
    }

    #[test]
    fn lays_tensors_out_as_burn_s_slice_assignments_do_on_wgpu_with_and_without_fusion() {
        against_burn::<burn::backend::Wgpu>();
        against_burn::<burn_fusion::Fusion<burn::backend::Wgpu>>();
    }

    /// The split into views against Burn's narrow and reshape of each piece: pieces of one,
    /// two and three dimensions, on and off CubeCL's alignment, gaps between them.
    fn split_against_burn<B: Backend>() {
        let device = Default::default();
        let len = 3000;
        let values: Vec<f32> = (0..len).map(|i| i as f32 * 0.25 - 7.0).collect();
        let flat = Tensor::<B, 1>::from_floats(values.as_slice(), &device);
        let pieces = vec![
            (0, vec![128]),
            (128, vec![16, 8]),
            (300, vec![5]),
            (384, vec![2, 3, 7]),
            (1024, vec![40, 49]),
        ];
        let got = split::<B>(float(flat.clone()), pieces.clone());
        assert_eq!(got.len(), pieces.len());
        for (t, (at, dims)) in got.into_iter().zip(pieces) {
            let n: usize = dims.iter().product();
            let want = flat.clone().narrow(0, at, n).into_data().into_vec::<f32>().unwrap();
            assert_eq!(t.shape().to_vec(), dims);
            let t = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(t)).reshape([n]);
            assert_eq!(t.into_data().into_vec::<f32>().unwrap(), want);
        }
    }

    #[test]
    fn splits_into_views_as_burn_s_narrow_and_reshape_do_on_wgpu_with_and_without_fusion() {
        split_against_burn::<burn::backend::Wgpu>();
        split_against_burn::<burn_fusion::Fusion<burn::backend::Wgpu>>();
        split_against_burn::<burn::backend::NdArray>();
    }

    #[test]
    fn refuses_parts_that_overlap_or_pass_the_end() {
        type B = burn::backend::Wgpu;
        let device = Default::default();
        let t = || float(Tensor::<B, 1>::ones([4], &device));
        assert!(on_device::<B>(vec![(0, t()), (3, t())], 8).is_err());
        assert!(on_device::<B>(vec![(5, t())], 8).is_err());
        assert!(on_device::<B>(vec![], 8).is_err());
    }
}
