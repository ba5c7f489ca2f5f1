//! A linear layer's product through cuBLAS (`--matmul cublas`), on CUDA: `a [m, k] · b [k, n]`
//! written in f32, from f32 operands (TF32 tensor cores, as cubek's f32 kernels and PyTorch's
//! default for `matmul` with TF32 allowed) or two bf16 or f16 ones (mixed precision's).
//!
//! Why: on an H200 cubek's fastest kernel reached 81 TFLOP/s over the 0.6B preset's products
//! (bench/RESULTS.md, 2026-11-30), a sixth of the chip's dense TF32 rate: CubeCL 0.10 emits
//! `mma.sync` tiles but no Hopper `wgmma`. PyTorch's products, which run cuBLAS, make most of
//! the difference between its step and asrt's.
//!
//! How it is ordered with CubeCL's kernels: cuBLAS is enqueued on the CUDA stream whose memory
//! pool holds the product's new buffer, which is the stream CubeCL gives the calling thread.
//! CubeCL 0.10 does not name its streams; the patched cubecl-cuda (`patches/`,
//! `scripts/vendor.sh`) adds the stream to the resource `ComputeClient::get_resource`
//! returns. `get_resource` runs on CubeCL's server in order with the launches before it, and,
//! as a launch does, first makes the current stream wait for an operand's own stream. So the
//! product follows every kernel that wrote its operands and precedes every kernel the thread
//! launches after it.
//!
//! Invariants: the product is row-major and contiguous; the operands are read as they are
//! (plain or transposed, any row pitch: [`column_major::gemm`]), others made contiguous first;
//! the operands stay alive (held here) until cuBLAS is enqueued, and the stream orders their
//! reuse after it; every failure is an error, never a panic (cuBLAS missing included).

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::OnceLock;

use burn::tensor::{DType, TensorMetadata};
use burn_cubecl::cubecl::cuda::{CudaRuntime, GpuResource};
use burn_cubecl::tensor::CubeTensor;
use cudarc::cublas::result as blas;
use cudarc::cublas::sys as blas_sys;
use cudarc::driver::sys as driver;

use super::column_major::{self, Operand};
use super::device_op::{contiguous, empty};

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
    /// Operand types cuBLAS is not asked to multiply here.
    #[error("operands of {a:?} and {b:?}: cuBLAS takes two f32, two bf16 or two f16 operands")]
    Types {
        /// The first operand's type.
        a: DType,
        /// The second's.
        b: DType,
    },
    /// A side past cuBLAS's 32-bit sizes, or an empty sum.
    #[error("a [{m}, {k}] · [{k}, {n}] product: cuBLAS takes sides of 1 to 2^31 - 1 here")]
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
    /// context current then). Kept for the process: a handle holds its workspace.
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

/// CubeCL's resource for `t`'s buffer, in order with the thread's launches (see the module):
/// its device address, its pool's stream (the patch's), and CubeCL's guard, which keeps the
/// memory from being handed out again while it is held.
fn resource(
    t: &CubeTensor<CudaRuntime>,
    which: &'static str,
) -> Result<(u64, driver::CUstream, impl Sized), CublasProductError> {
    let managed = t
        .client
        .get_resource(t.handle.clone())
        .map_err(|e| CublasProductError::Resource { which, why: format!("{e:?}") })?;
    let r: &GpuResource = managed.resource();
    Ok((r.ptr, r.stream, managed))
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

/// An operand as cuBLAS reads it: a plain or transposed matrix as it is, anything else made
/// contiguous.
fn readable(t: CubeTensor<CudaRuntime>) -> CubeTensor<CudaRuntime> {
    let (shape, s) = (t.meta.shape(), t.meta.strides());
    if shape.num_dims() == 2 && column_major::operand(shape[0], shape[1], [s[0], s[1]]).is_some() {
        t
    } else {
        contiguous(t)
    }
}

/// `a [m, k] · b [k, n]` through cuBLAS, in f32 (see the module).
pub fn product(
    a: CubeTensor<CudaRuntime>,
    b: CubeTensor<CudaRuntime>,
) -> Result<CubeTensor<CudaRuntime>, CublasProductError> {
    loaded()?;
    let (ty, compute) = types(a.dtype, b.dtype)?;
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let side = |x: usize| x >= 1 && x <= i32::MAX as usize;
    if !(side(m) && side(k) && side(n)) {
        return Err(CublasProductError::Size { m, k, n });
    }
    let (a, b) = (readable(a), readable(b));
    let strides = |t: &CubeTensor<CudaRuntime>| [t.meta.strides()[0], t.meta.strides()[1]];
    let gemm = column_major::gemm([m, k], strides(&a), [k, n], strides(&b))
        .ok_or(CublasProductError::Size { m, k, n })?;
    let lds = [gemm.first.ld, gemm.second.ld, gemm.ldc];
    if lds.iter().any(|&ld| ld > i32::MAX as usize) {
        return Err(CublasProductError::Size { m, k, n });
    }
    let out = empty::<CudaRuntime>(&a.client, &a.device, vec![m, n]);
    // The product's buffer first: it is new, so its pool's stream is this thread's.
    let (c_ptr, stream, _c) = resource(&out, "product")?;
    let (a_ptr, _, _a) = resource(&a, "first operand")?;
    let (b_ptr, _, _b) = resource(&b, "second operand")?;
    let handle = handle_on(stream)?;
    let op = |o: Operand| {
        if o.transposed {
            blas_sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            blas_sys::cublasOperation_t::CUBLAS_OP_N
        }
    };
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the three addresses are CubeCL's live buffers (held until this returns) of the
    // sizes the strides describe ([`column_major::gemm`] checked the leading dimensions);
    // `handle` is bound to the product's stream; alpha and beta are host f32, as the compute
    // types here take them.
    unsafe {
        blas::gemm_ex(
            handle,
            op(gemm.first),
            op(gemm.second),
            gemm.m as i32,
            gemm.n as i32,
            gemm.k as i32,
            (&alpha as *const f32).cast::<c_void>(),
            b_ptr as *const c_void,
            ty,
            gemm.first.ld as i32,
            a_ptr as *const c_void,
            ty,
            gemm.second.ld as i32,
            (&beta as *const f32).cast::<c_void>(),
            c_ptr as *mut c_void,
            blas_sys::cudaDataType::CUDA_R_32F,
            gemm.ldc as i32,
            compute,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| CublasProductError::Blas { call: "cublasGemmEx", status: e.to_string() })?;
    Ok(out)
}
