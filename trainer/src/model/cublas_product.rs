//! A linear layer's product through cuBLAS (`--matmul cublas`), on CUDA: `a [m, k] · b [k, n]`
//! written in f32, from f32 operands (TF32 tensor cores, as cubek's f32 kernels and PyTorch's
//! default for `matmul` with TF32 allowed) or two bf16 or f16 ones (mixed precision's); and
//! the attention's stacks of products `[O, H, m, k] · [O or 1, H, k, n]` ([`batched`]), as
//! strided-batched calls ([`column_major::batched`]), summed over `O` where asked.
//!
//! Why: on an H200 cubek's fastest kernel reached 81 TFLOP/s over the 0.6B preset's products
//! (bench/RESULTS.md, 2026-11-30), a sixth of the chip's dense TF32 rate: CubeCL 0.10 emits
//! `mma.sync` tiles but no Hopper `wgmma`. PyTorch's products, which run cuBLAS, make most of
//! the difference between its step and asrt's.
//!
//! How it is ordered with CubeCL's kernels: the call runs on CubeCL's device thread, the one
//! that launches the kernels, as a task queued behind the launches before it (CubeCL's
//! `DeviceHandle::submit`, the way `ComputeClient` sends a launch). There it asks the server for
//! the three buffers (`ComputeServer::get_resource`, which first makes the product's stream wait
//! for an operand's own, as a launch does) and enqueues cuBLAS on the stream whose memory pool
//! holds the product's new buffer: the stream of the thread that asked for the product. CubeCL
//! 0.10 does not name its streams; the patched cubecl-cuda (`patches/`, `scripts/vendor.sh`)
//! adds the stream to the resource. So the product follows every kernel that wrote its operands
//! and precedes every kernel launched after it, and the calling thread does not wait: a blocking
//! round trip to the device thread for each of the 0.6B step's 1,316 products would make the
//! threads wait on each other (bench/RESULTS.md: such round trips to fusion's thread made an
//! H200's step slower although its products were 1.75x faster).
//!
//! Errors: the first product on each thread and device waits for its call (creating cuBLAS's
//! handle, the first `cublasGemmEx`), so that a library that does not work falls back to Burn's
//! product. A later call that fails on the device thread cannot fall back (its output is
//! already in use): it is recorded with [`crate::device_failure::defer`], and the next device
//! check fails the micro-batch naming it. `ASRT_CUBLAS_WAIT=1` makes every product wait for its
//! call (one round trip each), to measure what not waiting gains.
//!
//! Invariants: the product is row-major and contiguous; the operands are read as they are
//! (plain or transposed, any row pitch: [`column_major::gemm`]), others made contiguous first;
//! the call holds the three buffers' bindings until cuBLAS is enqueued, and the stream orders
//! their reuse after it; every failure is an error, never a panic (cuBLAS missing included).

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::OnceLock;

use burn::tensor::{DType, TensorMetadata};
use burn_cubecl::cubecl::cuda::{CudaRuntime, GpuResource};
use burn_cubecl::cubecl::device::{Device, DeviceId};
use burn_cubecl::cubecl::device_handle::DeviceHandle;
use burn_cubecl::cubecl::server::{Binding, ComputeServer};
use burn_cubecl::cubecl::Runtime;
use burn_cubecl::tensor::CubeTensor;
use cudarc::cublas::result as blas;
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::sys as driver;

use super::column_major::{self, Batched, Group, Operand, Stack};
use super::device_op::{contiguous, empty};

/// CubeCL's CUDA server, the state its device thread owns.
type Server = <CudaRuntime as Runtime>::Server;

/// Why a product could not run through cuBLAS.
#[derive(Debug, thiserror::Error)]
pub enum CublasProductError {
    /// No cuBLAS library loads under the names cudarc tries.
    #[error(
        "cuBLAS does not load (tried {tried}); put the folder holding libcublas (the CUDA \
         toolkit's lib64, or pip's nvidia-cublas wheel) on LD_LIBRARY_PATH"
    )]
    NotLoaded {
        /// The file names tried.
        tried: String,
    },
    /// Stacks whose shapes do not chain, or an outer size neither equal nor 1.
    #[error("stacks of {a:?} · {b:?}: expected [O, H, m, k] · [O, H, k, n], either O may be 1")]
    Stacks {
        /// The first operand's shape.
        a: Vec<usize>,
        /// The second's.
        b: Vec<usize>,
    },
    /// Operand types cuBLAS is not asked to multiply here.
    #[error("operands of {a:?} and {b:?}: cuBLAS takes two f32, two bf16 or two f16 operands")]
    Types {
        /// The first operand's type.
        a: DType,
        /// The second's.
        b: DType,
    },
    /// A side or a count past cuBLAS's 32-bit sizes, or an empty product or sum.
    #[error(
        "a [{m}, {k}] · [{k}, {n}] product: cuBLAS takes sides and stacks of 1 to 2^31 - 1 here"
    )]
    Size {
        /// Rows of the product.
        m: usize,
        /// The shared length.
        k: usize,
        /// Columns of the product.
        n: usize,
    },
    /// CubeCL gave no resource for an operand.
    #[error("CubeCL's resource for the {which}: {why}")]
    Resource {
        /// `first operand`, `second operand` or `product`.
        which: &'static str,
        /// CubeCL's error.
        why: String,
    },
    /// CubeCL's device thread did not run the call.
    #[error("CubeCL's device thread for {device:?} did not run the product")]
    Thread {
        /// The device.
        device: DeviceId,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver, {call}: {code:?}")]
    Driver {
        /// The call.
        call: &'static str,
        /// Its result.
        code: driver::CUresult,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS, {call}: {status}")]
    Blas {
        /// The call.
        call: &'static str,
        /// Its status.
        status: String,
    },
}

/// Whether cuBLAS loads, asked once: cudarc panics on the first call into a library it cannot
/// open, so nothing calls it before this says yes.
fn loaded() -> Result<(), CublasProductError> {
    static LOADS: OnceLock<bool> = OnceLock::new();
    // SAFETY: only opens the library (`dlopen`) under cudarc's candidate names.
    if *LOADS.get_or_init(|| unsafe { blas_sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(CublasProductError::NotLoaded {
            tried: cudarc::get_lib_name_candidates("cublas").join(", "),
        })
    }
}

thread_local! {
    /// This thread's cuBLAS handle for each CUDA context (`cublasCreate` binds a handle to the
    /// context current then): the calls run on CubeCL's device threads, one per device, so
    /// each holds one. Kept for the process: a handle holds its workspace.
    static HANDLES: RefCell<Vec<(usize, blas_sys::cublasHandle_t)>> = const { RefCell::new(Vec::new()) };
}

/// Makes the context owning `stream` current on this thread and returns this thread's cuBLAS
/// handle for it, bound to `stream`.
fn handle_on(stream: driver::CUstream) -> Result<blas_sys::cublasHandle_t, CublasProductError> {
    let mut context: driver::CUcontext = std::ptr::null_mut();
    // SAFETY: `stream` is a live stream of CubeCL's server (it holds the product's buffer);
    // the calls only read its context and make that context current on this thread.
    unsafe {
        let code = driver::cuStreamGetCtx(stream, &mut context);
        if code != driver::CUresult::CUDA_SUCCESS {
            return Err(CublasProductError::Driver { call: "cuStreamGetCtx", code });
        }
        let code = driver::cuCtxSetCurrent(context);
        if code != driver::CUresult::CUDA_SUCCESS {
            return Err(CublasProductError::Driver { call: "cuCtxSetCurrent", code });
        }
    }
    let blas_error =
        |call| move |e: blas::CublasError| CublasProductError::Blas { call, status: e.to_string() };
    let handle = HANDLES.with(|handles| {
        let mut handles = handles.borrow_mut();
        if let Some((_, h)) = handles.iter().find(|(c, _)| *c == context as usize) {
            return Ok(*h);
        }
        let h = blas::create_handle().map_err(blas_error("cublasCreate"))?;
        handles.push((context as usize, h));
        Ok(h)
    })?;
    // SAFETY: `handle` was created in `stream`'s context, current on this thread.
    unsafe { blas::set_stream(handle, stream as blas_sys::cudaStream_t) }
        .map_err(blas_error("cublasSetStream"))?;
    Ok(handle)
}

/// cuBLAS's element type for an operand type, and the compute type for the pair.
fn types(
    a: DType,
    b: DType,
) -> Result<(blas_sys::cudaDataType, blas_sys::cublasComputeType_t), CublasProductError> {
    use blas_sys::cublasComputeType_t as C;
    use blas_sys::cudaDataType as T;
    match (a, b) {
        (DType::F32, DType::F32) => Ok((T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F_FAST_TF32)),
        (DType::BF16, DType::BF16) => Ok((T::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F)),
        (DType::F16, DType::F16) => Ok((T::CUDA_R_16F, C::CUBLAS_COMPUTE_32F)),
        _ => Err(CublasProductError::Types { a, b }),
    }
}

/// An operand as cuBLAS reads it: a plain or transposed matrix (or a stack of them, the last two
/// axes) as it is, anything else made contiguous.
fn readable(t: CubeTensor<CudaRuntime>) -> CubeTensor<CudaRuntime> {
    let (shape, s) = (t.meta.shape(), t.meta.strides());
    let d = shape.num_dims();
    if d >= 2 && column_major::operand(shape[d - 2], shape[d - 1], [s[d - 2], s[d - 1]]).is_some() {
        t
    } else {
        contiguous(t)
    }
}

/// One product's cuBLAS calls, made on the calling thread and run on CubeCL's device thread.
struct Call {
    /// The column-major arguments and the calls (one for a linear layer's product).
    plan: Batched,
    /// The operands' element type.
    ty: blas_sys::cudaDataType,
    /// The compute type for it.
    compute: blas_sys::cublasComputeType_t,
    /// The product's buffer (its stream, the one it was made on, is the stream whose pool
    /// cuBLAS joins), then the first and second operands'.
    buffers: [Binding; 3],
}

impl Call {
    /// Enqueues the call on the device thread (see the module): the buffers' resources in order
    /// with the launches before it, then cuBLAS on the product's stream.
    fn enqueue(self, server: &mut Server) -> Result<(), CublasProductError> {
        let Self { plan, ty, compute, buffers: [c, a, b] } = self;
        let stream = c.stream;
        let mut resource = |binding: Binding, which: &'static str| {
            server
                .get_resource(binding, stream)
                .map_err(|e| CublasProductError::Resource { which, why: format!("{e:?}") })
        };
        // The product's buffer first: it is new, so its pool's stream is the asking thread's.
        let c = resource(c, "product")?;
        let a = resource(a, "first operand")?;
        let b = resource(b, "second operand")?;
        let (c, a, b): (&GpuResource, &GpuResource, &GpuResource) =
            (c.resource(), a.resource(), b.resource());
        let size = if ty == blas_sys::cudaDataType::CUDA_R_32F { 4 } else { 2 };
        // A plan reaching past a buffer would be a wrong stride here, and memory another tensor
        // holds there: refused, not run.
        let [reach_b, reach_a, reach_c] = plan.reach();
        for (which, reach, elem, resource) in [
            ("first operand", reach_a, size, a),
            ("second operand", reach_b, size, b),
            ("product", reach_c, 4, c),
        ] {
            if (reach * elem) as u64 > resource.size {
                return Err(CublasProductError::Resource {
                    which,
                    why: format!(
                        "the calls reach {} bytes into {} bytes",
                        reach * elem,
                        resource.size
                    ),
                });
            }
        }
        let Batched { gemm, groups, .. } = plan;
        let handle = handle_on(c.stream)?;
        let op = |o: Operand| {
            if o.transposed {
                blas_sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                blas_sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let alpha = 1.0f32;
        let (beta_write, beta_add) = (0.0f32, 1.0f32);
        for Group { count, offsets: [off_b, off_a, off_c], strides, accumulate } in groups {
            let beta: *const c_void =
                if accumulate { &beta_add as *const f32 } else { &beta_write as *const f32 }.cast();
            let first = (b.ptr + (off_b * size) as u64) as *const c_void;
            let second = (a.ptr + (off_a * size) as u64) as *const c_void;
            let product = (c.ptr + (off_c * 4) as u64) as *mut c_void;
            let (t1, t2) = (op(gemm.first), op(gemm.second));
            let (m, n, k) = (gemm.m as i32, gemm.n as i32, gemm.k as i32);
            let (ld1, ld2, ldc) = (gemm.first.ld as i32, gemm.second.ld as i32, gemm.ldc as i32);
            let (f32_out, algo) = (
                blas_sys::cudaDataType::CUDA_R_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            );
            let alpha = (&alpha as *const f32).cast::<c_void>();
            // SAFETY: the three addresses are CubeCL's live buffers (their resources are held
            // until this returns), offset within them by the plan, whose matrices lie inside the
            // sizes the strides describe ([`column_major::batched`] checked the leading
            // dimensions, [`run_plan`] that every size fits an i32); `handle` is bound to the
            // product's stream; alpha and beta are host f32, as the compute types here take
            // them. Calls adding to the product follow the one writing it on that stream.
            let done = unsafe {
                if count == 1 {
                    blas::gemm_ex(
                        handle, t1, t2, m, n, k, alpha, first, ty, ld1, second, ty, ld2, beta,
                        product, f32_out, ldc, compute, algo,
                    )
                } else {
                    let [s1, s2, sc] = strides.map(|s| s as i64);
                    blas::gemm_strided_batched_ex(
                        handle,
                        t1,
                        t2,
                        m,
                        n,
                        k,
                        alpha,
                        first,
                        ty,
                        ld1,
                        s1,
                        second,
                        ty,
                        ld2,
                        s2,
                        beta,
                        product,
                        f32_out,
                        ldc,
                        sc,
                        count as i32,
                        compute,
                        algo,
                    )
                }
            };
            done.map_err(|e| CublasProductError::Blas {
                call: if count == 1 { "cublasGemmEx" } else { "cublasGemmStridedBatchedEx" },
                status: e.to_string(),
            })?;
        }
        Ok(())
    }
}

/// Whether every product waits for its call (`ASRT_CUBLAS_WAIT=1`), read once.
fn always_wait() -> bool {
    static WAIT: OnceLock<bool> = OnceLock::new();
    *WAIT.get_or_init(|| std::env::var("ASRT_CUBLAS_WAIT").is_ok_and(|v| v == "1"))
}

thread_local! {
    /// The devices whose first product this thread has seen succeed, with the handle to their
    /// device thread: their later calls are queued without waiting.
    static PROVEN: RefCell<Vec<(DeviceId, DeviceHandle<Server>)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `call` on `device`'s device thread: queued without waiting once this thread has seen a
/// product succeed there, else waited for (see the module).
fn run(device: DeviceId, call: Call) -> Result<(), CublasProductError> {
    let proven =
        PROVEN.with(|p| p.borrow().iter().find(|(d, _)| *d == device).map(|(_, h)| h.clone()));
    if let Some(queue) = proven.as_ref().filter(|_| !always_wait()) {
        queue.submit(move |server| {
            if let Err(e) = call.enqueue(server) {
                crate::device_failure::defer(format!(
                    "a cuBLAS product (--matmul cublas) queued on {device:?} failed, so the \
                     results that use it are wrong: {e}"
                ));
            }
        });
        return Ok(());
    }
    // The handle of the device's existing server (its client made the tensors).
    let queue = proven.unwrap_or_else(|| DeviceHandle::<Server>::new(device));
    queue
        .submit_blocking(move |server| call.enqueue(server))
        .map_err(|_| CublasProductError::Thread { device })??;
    PROVEN.with(|p| {
        let mut p = p.borrow_mut();
        if !p.iter().any(|(d, _)| *d == device) {
            p.push((device, queue));
        }
    });
    Ok(())
}

/// `a [m, k] · b [k, n]` through cuBLAS, in f32 (see the module).
pub fn product(
    a: CubeTensor<CudaRuntime>,
    b: CubeTensor<CudaRuntime>,
) -> Result<CubeTensor<CudaRuntime>, CublasProductError> {
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let (a, b) = (readable(a), readable(b));
    let matrix = |t: &CubeTensor<CudaRuntime>, rows, cols| Stack {
        shape: [1, 1, rows, cols],
        strides: [0, 0, t.meta.strides()[0], t.meta.strides()[1]],
    };
    let plan = column_major::batched(&matrix(&a, m, k), &matrix(&b, k, n), false)
        .ok_or(CublasProductError::Size { m, k, n })?;
    run_plan(a, b, plan, vec![m, n])
}

/// The stack of products `a [O, H, m, k] · b [O or 1, H, k, n]` (either's `O` may be 1, read by
/// every outer index) through cuBLAS in f32, `[O, H, m, n]`; summed over the outer axis,
/// `[1, H, m, n]`, where `sum_outer` (the gradient of an operand read by every outer index).
pub fn batched(
    a: CubeTensor<CudaRuntime>,
    b: CubeTensor<CudaRuntime>,
    sum_outer: bool,
) -> Result<CubeTensor<CudaRuntime>, CublasProductError> {
    let dims = |t: &CubeTensor<CudaRuntime>| {
        let shape = t.meta.shape();
        (0..shape.num_dims()).map(|i| shape[i]).collect::<Vec<_>>()
    };
    // Built only on refusal: the shapes' copies are not made on each stack's call.
    let refused = |a: &CubeTensor<CudaRuntime>, b: &CubeTensor<CudaRuntime>| {
        CublasProductError::Stacks { a: dims(a), b: dims(b) }
    };
    if a.meta.shape().num_dims() != 4 || b.meta.shape().num_dims() != 4 {
        return Err(refused(&a, &b));
    }
    let (a, b) = (readable(a), readable(b));
    let stack = |t: &CubeTensor<CudaRuntime>| {
        let (shape, strides) = (t.meta.shape(), t.meta.strides());
        Stack {
            shape: [shape[0], shape[1], shape[2], shape[3]],
            strides: [strides[0], strides[1], strides[2], strides[3]],
        }
    };
    let plan =
        column_major::batched(&stack(&a), &stack(&b), sum_outer).ok_or_else(|| refused(&a, &b))?;
    let shape = plan.shape.to_vec();
    run_plan(a, b, plan, shape)
}

/// Runs `plan` on `a` and `b` (as [`readable`] left them) into a new f32 buffer of `shape`
/// (the plan's, or a linear layer's `[m, n]`).
fn run_plan(
    a: CubeTensor<CudaRuntime>,
    b: CubeTensor<CudaRuntime>,
    plan: Batched,
    shape: Vec<usize>,
) -> Result<CubeTensor<CudaRuntime>, CublasProductError> {
    loaded()?;
    let (ty, compute) = types(a.dtype, b.dtype)?;
    let g = &plan.gemm;
    let (m, k, n) = (g.n, g.k, g.m);
    // An empty product or sum too (Burn's product takes those).
    let fits = |x: usize| x >= 1 && x <= i32::MAX as usize;
    let sizes = [m, k, n, g.first.ld, g.second.ld, g.ldc];
    let counts = plan.groups.iter().map(|g| g.count);
    if plan.groups.is_empty() || !sizes.into_iter().chain(counts).all(fits) {
        return Err(CublasProductError::Size { m, k, n });
    }
    let out = empty::<CudaRuntime>(&a.client, &a.device, shape);
    let call = Call {
        plan,
        ty,
        compute,
        buffers: [out.handle.clone().binding(), a.handle.binding(), b.handle.binding()],
    };
    run(out.device.to_id(), call)?;
    Ok(out)
}
