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

use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorMetadata;
use burn_fusion::stream::OperationStreams;
use burn_fusion::{Fusion, FusionBackend, NoOp};
use burn_ir::{InitOperationIr, OperationIr, OperationOutput};

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
