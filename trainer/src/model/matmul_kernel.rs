//! Which matmul kernel the linear layers use (`--matmul`, `model::device_matmul`): a choice
//! made once per process before a run, read at each product. Here, not in `device_matmul`, so a
//! build without the CubeCL backends parses the flag too (and has only Burn's product).

use std::sync::atomic::{AtomicU8, Ordering};

/// A matmul kernel: Burn's choice, or one of cubek's strategies (`cmma`: CUDA's warp-level
/// matrix API; `mma`: PTX's `mma` instructions; `tma`: Hopper's tensor memory accelerator;
/// `unit`: one unit per output tile, no tensor cores).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Kernel {
    /// Burn's product (fusion's simple cyclic CMMA, or its own without fusion).
    #[default]
    Burn,
    /// cuBLAS's product (CUDA only; TF32 tensor cores for f32 operands): the library PyTorch's
    /// products run, called on CubeCL's stream (`model::cublas_product`).
    Cublas,
    /// One stage, cyclic loading, CMMA tiles.
    SimpleCyclicCmma,
    /// One stage, cyclic loading, MMA tiles.
    SimpleCyclicMma,
    /// One stage loaded by TMA (Hopper on), CMMA tiles.
    SimpleTmaCmma,
    /// Double-buffered stages, cyclic loading, CMMA tiles.
    DoubleCyclicCmma,
    /// Double-buffered stages, cyclic loading, MMA tiles.
    DoubleCyclicMma,
    /// Double-buffered stages, tilewise loading, CMMA tiles.
    DoubleTilewiseCmma,
    /// Double-buffered stages, hybrid loading, CMMA tiles.
    DoubleHybridCmma,
    /// Double-buffered stages loaded by TMA, CMMA tiles.
    DoubleTmaCmma,
    /// Double-buffered stages loaded by TMA, MMA tiles.
    DoubleTmaMma,
    /// Loading and computing warps specialised, cyclic loading, CMMA tiles.
    SpecializedCyclicCmma,
    /// Loading and computing warps specialised, TMA loading, CMMA tiles.
    SpecializedTmaCmma,
    /// Double-buffered stages in a fixed order, CMMA tiles.
    OrderedDoubleCmma,
    /// Double-buffered stages in a fixed order, MMA tiles.
    OrderedDoubleMma,
    // The rest of Burn 0.21's own autotune candidates for accelerated products (burn-cubecl's
    // `kernel/matmul/tune`), which `Burn` does not tune over, and the same options on the TMA
    // kernels: timed by `asrt-bench matmul` on a GPU before any is chosen.
    /// [`Kernel::SimpleCyclicCmma`] with several rows of tiles per plane.
    SimpleCyclicCmmaMultiRows,
    /// [`Kernel::SimpleCyclicMma`] with several rows of tiles per plane.
    SimpleCyclicMmaMultiRows,
    /// One stage loaded by TMA, MMA tiles.
    SimpleTmaMma,
    /// [`Kernel::SimpleTmaCmma`] with several rows of tiles per plane.
    SimpleTmaCmmaMultiRows,
    /// [`Kernel::SimpleTmaMma`] with several rows of tiles per plane.
    SimpleTmaMmaMultiRows,
    /// [`Kernel::DoubleCyclicMma`] with loading and computing warps specialised.
    DoubleCyclicMmaSpecialized,
    /// [`Kernel::DoubleTmaCmma`] with loading and computing warps specialised.
    DoubleTmaCmmaSpecialized,
    /// [`Kernel::DoubleTmaMma`] with loading and computing warps specialised.
    DoubleTmaMmaSpecialized,
    /// Double-buffered stages, asynchronous cyclic loading (`cp.async`), MMA tiles.
    DoubleAsyncCyclicMma,
    /// Double-buffered stages, asynchronous strided loading (`cp.async`), MMA tiles.
    DoubleAsyncStridedMma,
    /// Loading and computing warps specialised, cyclic loading, MMA tiles.
    SpecializedCyclicMma,
    /// Loading and computing warps specialised, TMA loading, MMA tiles.
    SpecializedTmaMma,
    /// [`Kernel::OrderedDoubleMma`] with Burn's autotune's first setting: k split in 2
    /// partitions, 4 rows of planes, 2 rows per plane.
    OrderedDoubleMmaRows4,
    /// [`Kernel::OrderedDoubleMma`] with 8 rows of planes (k in 2 partitions, 2 rows per plane).
    OrderedDoubleMmaRows8,
    /// One unit per output tile, one stage (no tensor cores).
    SimpleUnit,
    /// One unit per output tile, double-buffered (no tensor cores).
    DoubleUnit,
}

impl Kernel {
    /// Every kernel, [`Kernel::Burn`] first (the enum's order, as clap lists them).
    pub fn all() -> &'static [Kernel] {
        <Kernel as clap::ValueEnum>::value_variants()
    }

    /// The name `--matmul` takes.
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self).map_or_else(String::new, |v| v.get_name().into())
    }
}

/// The kernel the linear layers use, as its index in [`Kernel::all`].
static CHOSEN: AtomicU8 = AtomicU8::new(0);

/// Sets the kernel the linear layers use from now on, in this process.
pub fn choose(kernel: Kernel) {
    let at = Kernel::all().iter().position(|k| *k == kernel).unwrap_or(0);
    CHOSEN.store(at as u8, Ordering::Relaxed);
}

/// The kernel the linear layers use.
#[cfg_attr(not(any(feature = "wgpu", feature = "cuda")), allow(dead_code))]
pub fn chosen() -> Kernel {
    Kernel::all().get(CHOSEN.load(Ordering::Relaxed) as usize).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel's name parses back to it, and the choice stored is the one read (Burn's by
    /// default in a process that chose none; here the index round trip only, as other tests
    /// in this process read the choice).
    #[test]
    fn names_round_trip() {
        for &k in Kernel::all() {
            assert_eq!(<Kernel as clap::ValueEnum>::from_str(&k.name(), false), Ok(k));
            let at = Kernel::all().iter().position(|x| *x == k).unwrap();
            assert_eq!(Kernel::all()[at], k);
        }
        assert_eq!(Kernel::default(), Kernel::Burn);
        assert_eq!(Kernel::SpecializedTmaCmma.name(), "specialized-tma-cmma");
    }
}
