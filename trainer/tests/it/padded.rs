//! Burn's fusion on tensors whose rows are padded, as CUDA allocates them.
//!
//! cubecl-cuda lays a new tensor's rows out pitched: a row of 96 f32 takes 128 elements of its
//! buffer (cubecl-runtime 0.10, `PitchedMemoryLayoutPolicy`), and Burn's matmul outputs and
//! uploaded tensors come out that way. wgpu lays every tensor out dense, so a trainer tested on
//! lavapipe never sees such a tensor. These tests make one by hand on wgpu, with the strides
//! CUDA would give it, and check fused element-wise chains over it against the same values
//! dense.

use burn::backend::wgpu::WgpuRuntime;
use burn::prelude::*;
use burn::tensor::{DType, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use burn_fusion::Fusion;

type Bare = CubeBackend<WgpuRuntime, f32, i32, u32>;
type Fused = Fusion<Bare>;

/// `values` (`rows` x `width`, row-major) as a tensor whose rows sit `pitch` elements apart in
/// its buffer, the padding filled with `fill`, registered with `like`'s fusion client.
fn padded(
    values: &[f32],
    rows: usize,
    width: usize,
    pitch: usize,
    fill: f32,
    like: &Tensor<Fused, 2>,
) -> Tensor<Fused, 2> {
    let device = Default::default();
    let dense = Tensor::<Bare, 2>::from_floats(
        burn::tensor::TensorData::new(values.to_vec(), [rows, width]),
        &device,
    );
    let TensorPrimitive::Float(prim) = dense.into_primitive() else { unreachable!() };
    let mut buffer = vec![fill; rows * pitch];
    for r in 0..rows {
        buffer[r * pitch..r * pitch + width].copy_from_slice(&values[r * width..(r + 1) * width]);
    }
    let bytes: Vec<u8> = buffer.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let handle = prim.client.create_from_slice(&bytes);
    let mut meta = (*prim.meta).clone();
    meta.strides[0] = pitch;
    let t = CubeTensor::new(prim.client.clone(), handle, meta, prim.device.clone(), DType::F32);
    let TensorPrimitive::Float(fused) = like.clone().into_primitive() else { unreachable!() };
    Tensor::from_primitive(TensorPrimitive::Float(asr_tdt::fusion::adopt::<Bare>(&fused.client, t)))
}

/// The cases: `x` alone, and beside a dense tensor read before or after it (the fuser takes
/// the last full-size input it sees as the block's layout).
fn cases(a: &[f32], b: &[f32]) -> Vec<(&'static str, Vec<f32>)> {
    vec![
        ("x * 2 + 1", a.iter().map(|x| x * 2.0 + 1.0).collect()),
        ("(x * 2 + b) * 0.5", a.iter().zip(b).map(|(x, y)| (x * 2.0 + y) * 0.5).collect()),
        ("(b + x * 2) * 0.5", a.iter().zip(b).map(|(x, y)| (y + x * 2.0) * 0.5).collect()),
    ]
}

#[test]
fn fused_element_wise_chains_read_a_pitched_tensor_as_a_dense_one() {
    let _turn = crate::serial();
    let device = Default::default();
    let (rows, width, pitch) = (6usize, 96usize, 128usize);
    let a: Vec<f32> = (0..rows * width).map(|i| (i % 97) as f32 * 0.25 - 3.0).collect();
    let b: Vec<f32> = (0..rows * width).map(|i| (i % 31) as f32 * 0.5 + 1.0).collect();
    let mut failures = Vec::new();
    for (k, (name, expected)) in cases(&a, &b).into_iter().enumerate() {
        let dense_b = Tensor::<Fused, 2>::from_floats(
            burn::tensor::TensorData::new(b.clone(), [rows, width]),
            &device,
        );
        let x = padded(&a, rows, width, pitch, 1.0e6, &dense_b);
        let y = match k {
            0 => x * 2.0 + 1.0,
            1 => ((x * 2.0) + dense_b) * 0.5,
            _ => (dense_b + (x * 2.0)) * 0.5,
        };
        let got = y.into_data().into_vec::<f32>().unwrap();
        let wrong = got.iter().zip(&expected).filter(|(g, e)| g != e).count();
        eprintln!("{name}: {wrong} of {} elements differ", got.len());
        if wrong > 0 {
            let first = got.iter().zip(&expected).position(|(g, e)| g != e).unwrap();
            failures.push(format!(
                "{name}: {wrong} of {} differ, the first at {first} ({} for {})",
                got.len(),
                got[first],
                expected[first]
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
