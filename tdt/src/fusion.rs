//! [`TdtBackend`] for Burn's fusion backend (`Fusion<B>` over a CubeCL backend): the loss runs
//! the inner backend's kernels on the logits' own buffer.
//!
//! Fusion queues operations and runs them later on its own thread, where a failure can only
//! panic. So the loss is not queued as a custom operation: the logits are resolved (the queued
//! work they depend on is launched, and their inner tensor handed over), the inner backend runs
//! the loss as it does unfused, with every check on this thread and every error a `Result`, and
//! the costs and gradients are registered back as fusion tensors. Resolving waits for the
//! queue to be launched, not for the device to finish it; a custom operation would be a fusion
//! barrier anyway.
//!
//! [`in_stream`] runs an operation that cannot fail (the trainer's device operations) queued as
//! such a custom operation (the default), or that way (`ASRT_FUSION_QUEUE=0`).

use std::marker::PhantomData;

use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorMetadata;
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Fusion, FusionBackend, FusionRuntime, NoOp};
use burn_ir::{
    CustomOpIr, HandleContainer, InitOperationIr, OperationIr, OperationOutput, TensorIr,
};

use super::op::{TdtBackend, TdtProblem};
use super::TdtError;

impl<B> TdtBackend for Fusion<B>
where
    B: FusionBackend + TdtBackend,
{
    fn tdt_forward(
        logits: FloatTensor<Self>,
        problem: &TdtProblem,
        want_grad: bool,
    ) -> Result<(FloatTensor<Self>, Option<FloatTensor<Self>>), TdtError> {
        let client = logits.client.clone();
        let inner = client.resolve_tensor_float::<B>(logits);
        let (costs, grads) = B::tdt_forward(inner, problem, want_grad)?;
        let costs = adopt::<B>(&client, costs);
        Ok((costs, grads.map(|g| adopt::<B>(&client, g))))
    }
}

/// Registers an inner backend's tensor with the fusion client (as Burn's own `from_data` does:
/// the handle, then an initialising no-op that gives it its shape and type).
pub fn adopt<B: FusionBackend>(
    client: &burn_fusion::client::GlobalFusionClient<B::FusionRuntime>,
    tensor: B::FloatTensorPrimitive,
) -> FloatTensor<Fusion<B>> {
    let shape = tensor.shape();
    let dtype = tensor.dtype();
    let handle = B::float_tensor_handle(tensor);
    let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    client.register(OperationStreams::default(), OperationIr::Init(desc), NoOp::<B>::new()).output()
}

/// The shape and type of one output of [`in_stream`].
pub type Output = (Vec<usize>, burn::tensor::DType);

/// Runs `run`, an operation on the inner backend's tensors, on fusion's tensors, in one of two
/// ways ([`queued`]):
/// - queued (the default): as a custom operation of fusion's stream, in order after what
///   produced its inputs, run on fusion's thread when the stream is, with no wait on this
///   thread;
/// - resolved (`ASRT_FUSION_QUEUE=0`): each input resolved here (a round trip to fusion's
///   thread, which first launches everything queued before it), `run` on this thread, each
///   output registered back ([`adopt`]), as the loss does.
///
/// A 0.6B step makes thousands of these calls. Resolved, each is a point where this thread and
/// fusion's wait on each other; queued, fusion's thread does their host work too. On an H200
/// queued took the 0.6B step from 0.426 to 0.343 s (bench/RESULTS.md, 2026-11-30); on lavapipe
/// (2 cores shared with the device's threads) it was 7-10 % slower.
///
/// The outputs' shapes and types are declared up front (`outputs`), as fusion needs them to
/// queue what follows; `run` must give exactly those, in that order (checked either way: a
/// mismatch is a bug in the caller, and panics). An input whose fusion tensor has no other
/// owner is handed to `run` queued as the only owner of its buffer (fusion's read-write
/// status), as Burn's own operations are: `run` may write over it.
pub fn in_stream<B, F, const N: usize, const M: usize>(
    name: &'static str,
    inputs: [FloatTensor<Fusion<B>>; N],
    outputs: [Output; M],
    run: F,
) -> [FloatTensor<Fusion<B>>; M]
where
    B: FusionBackend,
    F: Fn([FloatTensor<B>; N]) -> [FloatTensor<B>; M] + Send + Sync + 'static,
{
    let run = move |ins: Vec<FloatTensor<B>>| match ins.try_into() {
        Ok(ins) => run(ins).into(),
        // `in_stream_vec` hands `run` one tensor per input given it.
        Err(v) => unreachable!("{name}: {} inputs for {N}", v.len()),
    };
    match in_stream_vec::<B, _>(name, inputs.into(), outputs.into(), run).try_into() {
        Ok(tensors) => tensors,
        // `in_stream_vec` returns one tensor per declared output.
        Err(v) => unreachable!("{name}: {} outputs for {M}", v.len()),
    }
}

/// [`in_stream`] with as many inputs and outputs as the call has (a layout of a group of
/// gradients, the views of an update's parameters): the same two ways, the same checks.
pub fn in_stream_vec<B, F>(
    name: &'static str,
    inputs: Vec<FloatTensor<Fusion<B>>>,
    outputs: Vec<Output>,
    run: F,
) -> Vec<FloatTensor<Fusion<B>>>
where
    B: FusionBackend,
    F: Fn(Vec<FloatTensor<B>>) -> Vec<FloatTensor<B>> + Send + Sync + 'static,
{
    let Some(client) = inputs.first().map(|t| t.client.clone()) else {
        panic!("{name}: an operation needs an input (its client and stream)")
    };
    if !queued() {
        let results =
            run(inputs.into_iter().map(|t| client.resolve_tensor_float::<B>(t)).collect());
        check_outputs(
            name,
            &results,
            outputs.iter().map(|(dims, dtype)| (dims.as_slice(), *dtype)),
        );
        return results.into_iter().map(|t| adopt::<B>(&client, t)).collect();
    }
    let streams = OperationStreams::with_inputs(inputs.iter());
    let outs: Vec<TensorIr> = outputs
        .into_iter()
        .map(|(dims, dtype)| TensorIr::uninit(client.create_empty_handle(), dims.into(), dtype))
        .collect();
    let ins: Vec<TensorIr> = inputs.into_iter().map(|t| t.into_ir()).collect();
    let desc = CustomOpIr::new(name, &ins, &outs);
    let op = InStream::<B, F> { desc: desc.clone(), run, _backend: PhantomData };
    enqueue::<B, F>(&client, streams, desc, op)
}

/// Hands `op` to fusion's thread. Never inlined: in a release build CubeCL's wait for room in
/// its task ring (`DeviceClient::enqueue`, a spin while fusion's thread is behind) is inlined
/// into its caller, and a profile's leaf then named [`in_stream_vec`] itself, whose own work is
/// small. Here the wait is this function's, which `scripts/gpu/host_profile.py` counts as the
/// enqueue's spin, as it counts fusion's `register` (bench/RESULTS.md, 2026-12-01, "The old
/// parameters released": the training thread's "work" read 0.86 s a step where 79 % of its
/// samples were that wait).
#[inline(never)]
fn enqueue<B, F>(
    client: &burn_fusion::client::GlobalFusionClient<B::FusionRuntime>,
    streams: OperationStreams,
    desc: CustomOpIr,
    op: InStream<B, F>,
) -> Vec<FloatTensor<Fusion<B>>>
where
    B: FusionBackend,
    F: Fn(Vec<FloatTensor<B>>) -> Vec<FloatTensor<B>> + Send + Sync + 'static,
{
    client.register(streams, OperationIr::Custom(desc), op)
}

/// [`in_stream_vec`]'s queued operation.
struct InStream<B, F> {
    desc: CustomOpIr,
    run: F,
    // `fn() -> B`: the operation holds no `B`, and stays `Send + Sync` whatever `B` is.
    _backend: PhantomData<fn() -> B>,
}

impl<B, F> std::fmt::Debug for InStream<B, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InStream").field("desc", &self.desc).finish()
    }
}

impl<B, F> Operation<B::FusionRuntime> for InStream<B, F>
where
    B: FusionBackend,
    F: Fn(Vec<FloatTensor<B>>) -> Vec<FloatTensor<B>> + Send + Sync + 'static,
{
    fn execute(
        &self,
        handles: &mut HandleContainer<<B::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let inputs = self.desc.inputs.iter().map(|t| handles.get_float_tensor::<B>(t)).collect();
        let results = (self.run)(inputs);
        let outs = &self.desc.outputs;
        check_outputs(&self.desc.id, &results, outs.iter().map(|ir| (&ir.shape[..], ir.dtype)));
        for (t, ir) in results.into_iter().zip(outs) {
            handles.register_float_tensor::<B>(&ir.id, t);
        }
    }
}

/// Panics unless `results` are as many as `declared` and each has its declared shape and type:
/// [`in_stream_vec`]'s caller declared them wrong.
fn check_outputs<'a, T: TensorMetadata>(
    name: &str,
    results: &[T],
    declared: impl ExactSizeIterator<Item = (&'a [usize], burn::tensor::DType)>,
) {
    assert_eq!(results.len(), declared.len(), "{name}: outputs given against declared");
    for (t, (dims, dtype)) in results.iter().zip(declared) {
        let shape = t.shape().to_vec();
        assert!(
            shape == dims && t.dtype() == dtype,
            "{name}: an output is {shape:?} {:?}, declared {dims:?} {dtype:?}",
            t.dtype()
        );
    }
}

/// Whether [`in_stream`] queues its operations in fusion's stream: unless `ASRT_FUSION_QUEUE` is
/// `0`, read once per process.
pub fn queued() -> bool {
    static QUEUED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *QUEUED.get_or_init(|| std::env::var("ASRT_FUSION_QUEUE").as_deref() != Ok("0"))
}
