//! What makes an optimizer step data-parallel: the ranks' gradients summed (each rank divided its
//! losses by the step's micro-batch count over all ranks, so the sum is the step's mean), the
//! step's statistics summed, the running statistics (BatchNorm) averaged, and every rank's record
//! of the step gathered for the metrics. After
//! [`reduce`] every rank holds the same gradients, loss and counts, so every rank's clipping,
//! skip decision and AdamW update are the same, bit for bit.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;
use serde::{Deserialize, Serialize};

use super::collective::{Collective, CollectiveError};
use super::flat_adamw::chunk_elements;
use super::flat_grads::FlatGrads;
use super::{grads, StepGradients};
use crate::model::TdtModel;
use asr_tdt::op::TdtBackend;

/// A backend that can sum a tensor across the devices of one process itself. CUDA does it with
/// NCCL (through CubeCL's client, which creates the communicator for the set of devices); the
/// others go through the host [`Collective`].
pub trait DeviceAllReduce: Backend {
    /// Whether [`DeviceAllReduce::device_all_reduce`] is available.
    const DEVICE_ALL_REDUCE: bool = false;

    /// `t` summed over the ranks whose devices are `peers` (every rank calls it with the same
    /// list, in rank order). Only called when `DEVICE_ALL_REDUCE`.
    fn device_all_reduce(t: Tensor<Self, 1>, _peers: &[Self::Device]) -> Tensor<Self, 1> {
        t
    }

    /// For ranks in several processes: the transport that sums the gradients between them, if
    /// this backend has its own (CUDA: NCCL, its id sent through `c`); `None`: `c` sums them.
    /// Every rank of the run calls it once, after joining `c`.
    fn node_transport(
        _device: &Self::Device,
        _c: &mut dyn Collective,
    ) -> Result<Option<Box<dyn HostSum>>, CollectiveError> {
        Ok(None)
    }
}

/// Sums host arrays over the ranks of a multi-process run by another transport than the
/// [`Collective`] (NCCL for GPUs); the same result on every rank.
pub trait HostSum {
    /// `data` summed element-wise over the ranks.
    fn sum(&mut self, data: &mut [f32]) -> Result<(), CollectiveError>;
}

/// NCCL between the ranks of several processes, through cudarc: rank 0 creates the NCCL id and
/// sends it to the others through the rendezvous collective; the gradients are staged through
/// a device buffer of this rank's GPU.
#[cfg(feature = "cuda")]
pub struct NcclGroup {
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    comm: cudarc::nccl::safe::Comm,
}

#[cfg(feature = "cuda")]
impl NcclGroup {
    /// Joins the NCCL group of the ranks of `c`, on GPU `ordinal`.
    pub fn join(ordinal: usize, c: &mut dyn Collective) -> Result<NcclGroup, CollectiveError> {
        use cudarc::nccl::safe::{Comm, Id};
        let fail = |what: &'static str, e: &dyn std::fmt::Debug| CollectiveError::Nccl {
            what,
            detail: format!("{e:?}"),
        };
        let ctx =
            cudarc::driver::CudaContext::new(ordinal).map_err(|e| fail("CUDA context", &e))?;
        let stream = ctx.default_stream();
        let mine: Vec<u8> = if c.rank() == 0 {
            let id = Id::new().map_err(|e| fail("creating the id", &e))?;
            id.internal().iter().map(|&x| x as u8).collect()
        } else {
            Vec::new()
        };
        let all = c.all_gather(&mine)?;
        let bytes = all
            .first()
            .filter(|b| b.len() == 128)
            .ok_or(CollectiveError::Malformed { rank: 0, what: "NCCL id (128 bytes)" })?;
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, &b) in internal.iter_mut().zip(bytes.iter()) {
            *d = b as std::ffi::c_char;
        }
        let comm = Comm::from_rank(stream.clone(), c.rank(), c.world(), Id::uninit(internal))
            .map_err(|e| fail("joining the group", &e))?;
        Ok(NcclGroup { stream, comm })
    }
}

#[cfg(feature = "cuda")]
impl HostSum for NcclGroup {
    fn sum(&mut self, data: &mut [f32]) -> Result<(), CollectiveError> {
        let fail = |e: &dyn std::fmt::Debug| CollectiveError::Nccl {
            what: "summing across processes",
            detail: format!("{e:?}"),
        };
        let mut buf = self.stream.clone_htod(&*data).map_err(|e| fail(&e))?;
        self.comm
            .all_reduce_in_place(&mut buf, &cudarc::nccl::safe::ReduceOp::Sum)
            .map_err(|e| fail(&e))?;
        let out = self.stream.clone_dtoh(&buf).map_err(|e| fail(&e))?;
        data.copy_from_slice(&out);
        Ok(())
    }
}

impl DeviceAllReduce for burn::backend::NdArray {}

impl DeviceAllReduce for burn::backend::Flex {}

/// wgpu ranks sum through the host collective.
#[cfg(feature = "wgpu")]
impl DeviceAllReduce for burn::backend::Wgpu {}

#[cfg(feature = "cuda")]
impl DeviceAllReduce for burn::backend::Cuda {
    const DEVICE_ALL_REDUCE: bool = true;

    fn device_all_reduce(t: Tensor<Self, 1>, peers: &[Self::Device]) -> Tensor<Self, 1> {
        use burn::tensor::backend::DeviceOps;
        use burn::tensor::TensorPrimitive;
        // NCCL reduces in place: the buffer must be this tensor's alone and contiguous (a fresh
        // `cat` result is; otherwise it is copied first, as Burn's own distributed ops do).
        let mut prim = t.into_primitive().tensor();
        if !(prim.handle.can_mut() && prim.is_contiguous()) {
            let copy =
                Tensor::<Self, 1>::from_primitive(TensorPrimitive::Float(prim)).mul_scalar(1.0);
            prim = copy.into_primitive().tensor();
        }
        let ids = peers.iter().map(|d| d.id()).collect();
        let mut client = prim.client.clone();
        client.all_reduce(
            prim.handle.clone(),
            prim.handle.clone(),
            prim.dtype.into(),
            ids,
            burn::cubecl::server::ReduceOperation::Sum,
        );
        client.sync_collective();
        Tensor::from_primitive(TensorPrimitive::Float(prim))
    }

    fn node_transport(
        device: &Self::Device,
        c: &mut dyn Collective,
    ) -> Result<Option<Box<dyn HostSum>>, CollectiveError> {
        Ok(Some(Box::new(NcclGroup::join(device.index, c)?)))
    }
}

/// wgpu through fusion: ranks sum through the host collective, as unfused.
#[cfg(feature = "wgpu")]
impl DeviceAllReduce for burn_fusion::Fusion<burn::backend::Wgpu> {}

/// CUDA through fusion: the gradients' queued work is launched and their buffer handed to the
/// unfused backend's NCCL all-reduce above; the sum is registered back with the fusion client.
#[cfg(feature = "cuda")]
impl DeviceAllReduce for burn_fusion::Fusion<burn::backend::Cuda> {
    const DEVICE_ALL_REDUCE: bool = true;

    fn device_all_reduce(t: Tensor<Self, 1>, peers: &[Self::Device]) -> Tensor<Self, 1> {
        use burn::tensor::TensorPrimitive;
        type Inner = burn::backend::Cuda;
        let prim = t.into_primitive().tensor();
        let client = prim.client.clone();
        let inner = client.resolve_tensor_float::<Inner>(prim);
        let summed = <Inner as DeviceAllReduce>::device_all_reduce(
            Tensor::from_primitive(TensorPrimitive::Float(inner)),
            peers,
        );
        let back = asr_tdt::fusion::adopt::<Inner>(&client, summed.into_primitive().tensor());
        Tensor::from_primitive(TensorPrimitive::Float(back))
    }

    fn node_transport(
        device: &Self::Device,
        c: &mut dyn Collective,
    ) -> Result<Option<Box<dyn HostSum>>, CollectiveError> {
        <burn::backend::Cuda as DeviceAllReduce>::node_transport(device, c)
    }
}

/// Sums `g` over the ranks of `c` (nothing to do for one rank). The gradients are laid out flat
/// on `device` (`flat_grads::FlatGrads`: one operation per chunk on the device backends, where
/// a reshape per parameter and a concatenation were about three fusion operations per
/// parameter tensor, each step); when every rank is a device of this process (`peers`, in rank
/// order) and the backend sums on its devices, they never leave them (one all-reduce per
/// chunk); otherwise they go through the host in one array, and between processes through
/// `node` when the backend has its own transport (NCCL). The sums go back as views of the
/// chunks, for the parameters some rank had a gradient for.
pub fn reduce<B>(
    model: &TdtModel<B>,
    g: StepGradients,
    c: &mut dyn Collective,
    device: &B::Device,
    peers: &[B::Device],
    node: Option<&mut (dyn HostSum + 'static)>,
) -> Result<StepGradients, CollectiveError>
where
    B: AutodiffBackend + TdtBackend,
    B::InnerBackend: DeviceAllReduce,
{
    if c.world() == 1 {
        return Ok(g);
    }
    // An autodiff backend's device is its inner backend's. Every rank lays out the same chunks
    // (same model, same kind of device), zeros where it has no gradient.
    let chunk = chunk_elements(device);
    let mut flat = FlatGrads::lay_out::<B, _>(model, g.grads, chunk, device);
    let mut presence = flat.presence();
    c.all_reduce_sum(&mut presence)?;
    flat.set_presence(&presence);
    let chunks = flat.take_chunks();
    let summed = if B::InnerBackend::DEVICE_ALL_REDUCE && peers.len() == c.world() {
        chunks.into_iter().map(|t| B::InnerBackend::device_all_reduce(t, peers)).collect()
    } else {
        let lens: Vec<usize> = chunks.iter().map(|t| t.dims()[0]).collect();
        let mut host = Vec::with_capacity(lens.iter().sum());
        for t in chunks {
            let values = t.into_data().convert::<f32>().into_vec::<f32>().map_err(|e| {
                CollectiveError::Exchange {
                    what: "reading gradients".into(),
                    detail: format!("{e:?}"),
                }
            })?;
            host.extend(values);
        }
        match node {
            Some(n) => n.sum(&mut host)?,
            None => c.all_reduce_sum(&mut host)?,
        }
        let mut at = 0;
        lens.iter()
            .map(|&n| {
                let part = host[at..at + n].to_vec();
                at += n;
                Tensor::from_data(TensorData::new(part, [n]), device)
            })
            .collect()
    };
    flat.put_chunks(summed);
    let stats = [
        g.loss_sum,
        g.finite as f64,
        f64::from(u8::from(g.non_finite)),
        g.audio_seconds,
        g.utterances as f64,
    ];
    let bytes: Vec<u8> = stats.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut sum = [0f64; 5];
    for (rank, b) in c.all_gather(&bytes)?.iter().enumerate() {
        if b.len() != bytes.len() {
            return Err(CollectiveError::Length { rank, len: b.len() / 8, expected: 5 });
        }
        for (s, x) in sum.iter_mut().zip(b.chunks_exact(8)) {
            *s += f64::from_le_bytes(x.try_into().unwrap_or_default());
        }
    }
    let finite = sum[1] as u64;
    Ok(StepGradients {
        grads: flat.into_grads::<B, _>(model),
        loss: if finite > 0 { sum[0] / finite as f64 } else { f64::NAN },
        loss_sum: sum[0],
        finite,
        non_finite: sum[2] > 0.0,
        audio_seconds: sum[3],
        utterances: sum[4] as u64,
    })
}

/// One rank's part of a step, as the metrics record it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankStep {
    /// Seconds the rank waited for its batches (the loader was behind).
    pub wait_seconds: f64,
    /// Seconds from having its batches to having applied the step (compute and
    /// synchronisation).
    pub step_seconds: f64,
    /// Utterances the rank trained on.
    pub utterances: u64,
    /// Their audio seconds.
    pub audio_seconds: f64,
    /// Its micro-batches' utterances as [corpus, index] (not repeated in the per-rank list of
    /// the metrics: they make the step's `ids`).
    #[serde(skip_serializing, default)]
    pub ids: Vec<Vec<[u32; 2]>>,
}

/// Every rank's [`RankStep`], in rank order.
pub fn gather_steps(
    mine: &RankStep,
    c: &mut dyn Collective,
) -> Result<Vec<RankStep>, CollectiveError> {
    if c.world() == 1 {
        return Ok(vec![mine.clone()]);
    }
    // The ids are skipped by the serialisation the metrics use; send them alongside.
    let bytes = serde_json::to_vec(&(mine, &mine.ids)).map_err(|e| CollectiveError::Exchange {
        what: "encoding this rank's step record".into(),
        detail: e.to_string(),
    })?;
    c.all_gather(&bytes)?
        .iter()
        .enumerate()
        .map(|(rank, b)| {
            let (mut s, ids): (RankStep, Vec<Vec<[u32; 2]>>) =
                serde_json::from_slice(b).map_err(|e| CollectiveError::Exchange {
                    what: format!("rank {rank}'s step record"),
                    detail: e.to_string(),
                })?;
            s.ids = ids;
            Ok(s)
        })
        .collect()
}

/// The float state of `model` that takes no gradient (BatchNorm's running means and variances),
/// in module order.
fn buffers<B: AutodiffBackend>(model: &TdtModel<B>) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            if !value.is_require_grad() {
                self.0.extend(grads::host_values(value));
            }
        }
    }
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    c.0
}

/// Replaces the model's gradient-free float state with `values` (laid out as [`buffers`]).
fn set_buffers<B: AutodiffBackend>(model: TdtModel<B>, values: &[f32]) -> TdtModel<B> {
    struct Set<'a> {
        values: &'a [f32],
        at: usize,
    }
    impl<B: AutodiffBackend> ModuleMapper<B> for Set<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, value, mapper) = param.consume();
            if value.is_require_grad() {
                return Param::from_mapped_value(id, value, mapper);
            }
            let shape = value.shape();
            let n = shape.num_elements();
            let Some(v) = self.values.get(self.at..self.at + n) else {
                return Param::from_mapped_value(id, value, mapper);
            };
            self.at += n;
            let t = Tensor::<B, D>::from_data(TensorData::new(v.to_vec(), shape), &value.device());
            Param::from_mapped_value(id, t, mapper)
        }
    }
    model.map(&mut Set { values, at: 0 })
}

/// Averages the model's running statistics over the ranks (each rank updated them from its own
/// batches), so every rank holds the same model; returns how many values were averaged.
pub fn sync_buffers<B: AutodiffBackend + TdtBackend>(
    model: TdtModel<B>,
    c: &mut dyn Collective,
) -> Result<(TdtModel<B>, usize), CollectiveError> {
    if c.world() == 1 {
        return Ok((model, 0));
    }
    let mut values = buffers(&model);
    c.all_reduce_sum(&mut values)?;
    let w = c.world() as f32;
    values.iter_mut().for_each(|x| *x /= w);
    let n = values.len();
    Ok((set_buffers(model, &values), n))
}
