//! The device's memory pool as CubeCL keeps it (wgpu, CUDA): its largest buffer, what it holds,
//! and what a training step holds on the device, read from the pool after a micro-batch's
//! forward is queued (the forward's activations; [`MemoryWatch::sample_queued`]), after its
//! backward (the gradients) and after the update.
//!
//! Why: nvidia-smi gives one figure, the pool's footprint plus the context. On an H200 the 0.6B
//! preset peaked at 46,399 MiB against PyTorch's 21,156 (bench/RESULTS.md, "The step on the
//! device"); what the step's live buffers hold at each phase, against what the pool keeps
//! reserved for reuse, says whether that is tensors (which ones, by phase) or the pool.
//!
//! Invariants: sampling adds no wait (the gradients' and the update's points follow a `sync`
//! the step does anyway; the forward's is queued on CubeCL's device thread behind the forward's
//! launches, since CubeCL allocates an operation's outputs when it is launched, not when it
//! runs, and recorded after the next `sync`) and reads only the pool's counters; the figures
//! are the calling thread's stream (CubeCL keeps one pool per stream, and a rank trains on one
//! thread); they are samples, not the peak between them, which only the pool could record.

use std::sync::{Arc, Mutex};

use burn::prelude::*;
use serde::{Deserialize, Serialize};

/// A step's device memory, in bytes (see the module); `None` where that point was not sampled
/// (a joint computed in parts reads its loss inside the parts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMemory {
    /// In live buffers once a micro-batch's forward was queued, the largest over the step's
    /// micro-batches: the parameters, the optimizer's moments, the gradients accumulated so far
    /// and the forward's activations kept for backward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_bytes: Option<u64>,
    /// In live buffers after a micro-batch's backward, the largest over the step's micro-batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradients_bytes: Option<u64>,
    /// In live buffers after the update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_bytes: Option<u64>,
    /// Reserved from the device by the pool, the largest sampled: its footprint, including
    /// freed buffers kept for reuse (nvidia-smi adds the context to it).
    pub reserved_bytes: u64,
}

impl DeviceMemory {
    /// The largest of the in-use samples.
    pub fn in_use_bytes(&self) -> u64 {
        [self.forward_bytes, self.gradients_bytes, self.update_bytes]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(0)
    }
}

/// Where in a step a sample is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A micro-batch's forward was just queued (its loss not yet read).
    Forward,
    /// A micro-batch's backward finished.
    Gradients,
    /// The update finished.
    Update,
}

/// A pool reading queued on CubeCL's device thread ([`MemoryWatch::sample_queued`]): written
/// there when the thread reaches it, read back after the step's next wait for the device.
type Reading = Arc<Mutex<Option<(u64, u64)>>>;

/// A step's samples, taken by [`MemoryWatch::take`] when the step's metrics are written.
#[derive(Debug, Default)]
pub struct MemoryWatch {
    step: Option<DeviceMemory>,
    queued: Vec<(Phase, Reading)>,
}

impl MemoryWatch {
    /// Records the pool of `device` at `phase`; nothing where the device has no CubeCL pool.
    /// Called after a wait for the device, it first records the queued samples
    /// ([`MemoryWatch::collect`]).
    pub fn sample<D: 'static>(&mut self, phase: Phase, device: &D) {
        self.collect();
        if let Some((in_use, reserved)) = pool_usage(device) {
            self.record(phase, in_use, reserved);
        }
    }

    /// Queues a reading of the pool at `phase` behind the work this thread has queued on
    /// `anchor`'s stream, without waiting for anything: CubeCL's device thread takes it once it
    /// has launched (so allocated) that work, and [`MemoryWatch::collect`] records it after the
    /// step's next wait for the device. Under Burn's fusion the reading is queued by an
    /// operation of the stream (run on fusion's thread after what was queued before it);
    /// unfused, this thread's launches are ahead of it in CubeCL's queue already. Nothing on
    /// backends without a CubeCL pool.
    ///
    /// Why not a read here: one would wait for fusion's thread to hand on the queue and for
    /// CubeCL's to launch it (until 2026-12-01, once per micro-batch), a point where the
    /// training thread and the two behind it wait on each other.
    pub fn sample_queued<B: Backend>(&mut self, phase: Phase, anchor: &Tensor<B, 1>) {
        let reading = Reading::default();
        if queue_pool_reading(anchor, reading.clone()) {
            self.queued.push((phase, reading));
        }
    }

    /// Records the queued readings CubeCL's device thread has taken: after a wait for the
    /// device, all of them (a reading it has not reached then is dropped, never carried into
    /// another step).
    pub fn collect(&mut self) {
        for (phase, reading) in std::mem::take(&mut self.queued) {
            let taken = reading.lock().ok().and_then(|r| *r);
            if let Some((in_use, reserved)) = taken {
                self.record(phase, in_use, reserved);
            }
        }
    }

    /// Records `in_use` and `reserved` bytes at `phase`, keeping the step's largest of each.
    fn record(&mut self, phase: Phase, in_use: u64, reserved: u64) {
        let m = self.step.get_or_insert_with(DeviceMemory::default);
        let slot = match phase {
            Phase::Forward => &mut m.forward_bytes,
            Phase::Gradients => &mut m.gradients_bytes,
            Phase::Update => &mut m.update_bytes,
        };
        *slot = Some(slot.map_or(in_use, |b| b.max(in_use)));
        m.reserved_bytes = m.reserved_bytes.max(reserved);
    }

    /// The step's samples (`None` on a device without a CubeCL pool), starting the next step's.
    pub fn take(&mut self) -> Option<DeviceMemory> {
        self.collect();
        self.step.take()
    }
}

/// `$read` of the CubeCL client of `$device` (named `$client` in it), returned from the calling
/// function, where the device is a wgpu or CUDA device; the caller goes on otherwise. The one
/// place the two runtimes' devices are told apart: their clients are different types.
macro_rules! return_from_client {
    ($device:expr, |$client:ident| $read:expr) => {
        let device = $device as &dyn std::any::Any;
        #[cfg(feature = "wgpu")]
        if let Some(d) = device.downcast_ref::<burn::backend::wgpu::WgpuDevice>() {
            use burn_cubecl::cubecl::Runtime;
            let $client = burn::backend::wgpu::WgpuRuntime::client(d);
            return $read;
        }
        #[cfg(feature = "cuda")]
        if let Some(d) = device.downcast_ref::<burn::backend::cuda::CudaDevice>() {
            use burn_cubecl::cubecl::Runtime;
            let $client = burn_cubecl::cubecl::cuda::CudaRuntime::client(d);
            return $read;
        }
        let _ = device;
    };
}

/// Bytes in use by live buffers and reserved from the device by `device`'s CubeCL memory pool
/// (this thread's stream), where it is a CubeCL device (wgpu, CUDA); `None` for the other
/// backends' devices, or where the device reports a failure instead.
pub fn pool_usage<D: 'static>(device: &D) -> Option<(u64, u64)> {
    return_from_client!(device, |client| client
        .memory_usage()
        .ok()
        .map(|u| (u.bytes_in_use, u.bytes_reserved)));
    None
}

/// Queues a reading of the pool into `reading` behind the work queued on `anchor`'s stream (see
/// [`MemoryWatch::sample_queued`]); false where `B` is not one of the trainer's CubeCL types.
fn queue_pool_reading<B: Backend>(anchor: &Tensor<B, 1>, reading: Reading) -> bool {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    use {
        crate::model::host_depthwise::cast, asr_tdt::fusion::in_stream_vec,
        burn::tensor::TensorMetadata, std::any::TypeId,
    };
    #[allow(unused_macros)]
    macro_rules! queue_on {
        ($bare:ty, $runtime:ty) => {
            if TypeId::of::<B>() == TypeId::of::<$bare>() {
                let Some(t) = cast::<_, Tensor<$bare, 1>>(anchor.clone()) else { return false };
                queue_reading::<$runtime>(&t.device(), reading);
                return true;
            }
            if TypeId::of::<B>() == TypeId::of::<burn_fusion::Fusion<$bare>>() {
                let Some(t) = cast::<_, Tensor<burn_fusion::Fusion<$bare>, 1>>(anchor.clone())
                else {
                    return false;
                };
                let t = t.into_primitive().tensor();
                let out = vec![(t.shape().to_vec(), t.dtype())];
                // The anchor passes through unchanged; its copy is dropped at once.
                let _ = in_stream_vec::<$bare, _>("pool_reading", vec![t], out, move |ts| {
                    if let Some(t) = ts.first() {
                        queue_reading::<$runtime>(&t.device, reading.clone());
                    }
                    ts
                });
                return true;
            }
        };
    }
    #[cfg(feature = "wgpu")]
    queue_on!(burn::backend::Wgpu, burn::backend::wgpu::WgpuRuntime);
    #[cfg(feature = "cuda")]
    queue_on!(burn::backend::Cuda, burn_cubecl::cubecl::cuda::CudaRuntime);
    let _ = (anchor, reading);
    false
}

/// Queues on `device`'s CubeCL device thread, behind what was launched before on this
/// thread's stream (fusion's thread runs each stream's operations as that stream), a reading of
/// that stream's pool into `reading`.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn queue_reading<R: burn_cubecl::cubecl::Runtime>(device: &R::Device, reading: Reading) {
    use burn_cubecl::cubecl::device_handle::DeviceHandle;
    use burn_cubecl::cubecl::server::ComputeServer;
    use burn_cubecl::cubecl::stream_id::StreamId;
    let stream = StreamId::current();
    DeviceHandle::<R::Server>::new(device.to_id()).submit(move |server| {
        if let (Ok(u), Ok(mut r)) = (server.memory_usage(stream), reading.lock()) {
            *r = Some((u.bytes_in_use, u.bytes_reserved));
        }
    });
}

/// The largest buffer `device` allocates, in bytes, where it is a CubeCL device (wgpu, CUDA):
/// its pool's largest page, on wgpu the device's largest storage binding (128 MiB on lavapipe).
/// `None` for the other backends' devices, which have no such limit.
pub fn largest_buffer<D: 'static>(device: &D) -> Option<u64> {
    return_from_client!(device, |client| Some(client.properties().memory.max_page_size));
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_keeps_the_largest_sample_of_each_phase() {
        let mut w = MemoryWatch::default();
        w.record(Phase::Forward, 700, 1000);
        w.record(Phase::Gradients, 400, 1000);
        w.record(Phase::Forward, 900, 1200);
        w.record(Phase::Gradients, 300, 1100);
        let m = w.take().expect("sampled");
        assert_eq!(
            m,
            DeviceMemory {
                forward_bytes: Some(900),
                gradients_bytes: Some(400),
                update_bytes: None,
                reserved_bytes: 1200,
            }
        );
        assert_eq!(m.in_use_bytes(), 900);
        // The next step starts afresh.
        assert_eq!(w.take(), None);
        w.record(Phase::Update, 500, 800);
        assert_eq!(w.take().map(|m| (m.update_bytes, m.reserved_bytes)), Some((Some(500), 800)));
    }

    #[test]
    fn a_device_without_a_pool_records_nothing() {
        let mut w = MemoryWatch::default();
        w.sample(Phase::Forward, &burn::backend::ndarray::NdArrayDevice::Cpu);
        assert_eq!(w.take(), None);
    }

    /// A queued reading sees what was launched before it: a tensor queued first is in it, and
    /// after the wait it equals a read of the pool then (nothing was launched in between);
    /// fused and not.
    #[cfg(feature = "wgpu")]
    #[test]
    fn a_queued_reading_counts_what_was_queued_before_it_with_and_without_fusion() {
        use burn::prelude::*;
        fn check<B: Backend<Device = burn::backend::wgpu::WgpuDevice>>() {
            let device = burn::backend::wgpu::WgpuDevice::default();
            let _warm = Tensor::<B, 1>::zeros([16], &device).into_data();
            let before = pool_usage(&device).expect("a wgpu device has a pool");
            let n = 1 << 20;
            let t = Tensor::<B, 1>::ones([n], &device) * 2.0;
            let mut w = MemoryWatch::default();
            w.sample_queued(Phase::Forward, &t);
            let _ = B::sync(&device);
            let now = pool_usage(&device).expect("pool");
            let m = w.take().expect("a queued reading");
            assert!(now.0 >= before.0 + 4 * n as u64, "in use {before:?} -> {now:?}");
            assert_eq!(
                m.forward_bytes,
                Some(now.0),
                "queued reading against a read after the wait"
            );
            assert_eq!(m.reserved_bytes, now.1);
            drop(t);
        }
        check::<burn::backend::Wgpu>();
        check::<burn_fusion::Fusion<burn::backend::Wgpu>>();
    }

    /// The pool's in-use count follows a tensor's bytes: up by at least its 4 MiB while it
    /// lives, back down when it is dropped.
    #[cfg(feature = "wgpu")]
    #[test]
    fn the_pool_counts_a_live_tensor_and_frees_it() {
        use burn::prelude::*;
        type W = burn::backend::Wgpu;
        let device = burn::backend::wgpu::WgpuDevice::default();
        let _warm = Tensor::<W, 1>::zeros([16], &device).into_data();
        let before = pool_usage(&device).expect("a wgpu device has a pool");
        let n = 1 << 20;
        let t = Tensor::<W, 1>::ones([n], &device) * 2.0;
        let _ = W::sync(&device);
        let live = pool_usage(&device).expect("pool");
        assert!(live.0 >= before.0 + 4 * n as u64, "in use {before:?} -> {live:?}");
        assert!(live.1 >= live.0, "reserved below in use: {live:?}");
        drop(t);
        let _ = W::sync(&device);
        let after = pool_usage(&device).expect("pool");
        assert!(after.0 + 4 * n as u64 <= live.0, "in use {live:?} -> {after:?} after the drop");
    }
}
