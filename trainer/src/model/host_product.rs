//! Matrix products on the host, split over rayon's thread pool: the CPU backend's linear
//! layers (`host_linear`).
//!
//! NdArray's product (matrixmultiply) packs its operands on the calling thread and, in a
//! rank-2 product, runs the kernels there and on at most one helper thread of its own pool:
//! profiling the 0.6B-shape step put two thirds of its samples on the calling thread
//! (bench/RESULTS.md, "The step on every thread"). `gemm` splits the output over rayon's
//! threads, packing included, and reads operands of any stride, so a transpose costs nothing.
//!
//! Invariant: the split is over the output only, never the inner dimension, so each value is
//! summed in the same order at any thread count (exact resume compares bits; tested).

use gemm::{gemm, Parallelism};

/// A matrix read in place: element `(r, c)` at `r * row_stride + c * col_stride`.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    values: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> View<'a> {
    /// `values` as a row-major `[rows, cols]` matrix; `None` when the length differs.
    pub fn row_major(values: &'a [f32], rows: usize, cols: usize) -> Option<Self> {
        (rows.checked_mul(cols)? == values.len()).then_some(View {
            values,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        })
    }

    /// The transpose, read from the same values.
    pub fn t(self) -> Self {
        View {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }
}

/// `dst = a b` (or `dst += a b` with `accumulate`) for a row-major `dst` of `[a.rows, b.cols]`;
/// `None` when the shapes disagree.
pub fn product(dst: &mut [f32], a: View<'_>, b: View<'_>, accumulate: bool) -> Option<()> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || dst.len() != m.checked_mul(n)? {
        return None;
    }
    if m == 0 || n == 0 {
        return Some(());
    }
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return Some(());
    }
    // `row_major` built both views from matching lengths and `t` swaps shape and strides
    // together, so the last element, `(rows - 1) * row_stride + (cols - 1) * col_stride`, is
    // inside each view's values; these conversions cannot fail for slices that exist.
    let stride = |s: usize| isize::try_from(s).ok();
    let (a_rs, a_cs, b_rs, b_cs) = (
        stride(a.row_stride)?,
        stride(a.col_stride)?,
        stride(b.row_stride)?,
        stride(b.col_stride)?,
    );
    let dst_rs = stride(n)?;
    // SAFETY: `dst` holds `m * n` values, row-major (row stride `n`, column stride 1); `a` and
    // `b` are views whose every element `(r, c)` lies inside their own slices (see above), of
    // shapes `[m, k]` and `[k, n]`. `dst` is a `&mut` borrow, so it aliases neither operand.
    // With `accumulate` false, `gemm` does not read `dst` (`read_dst` false).
    unsafe {
        gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs,
            accumulate,
            a.values.as_ptr(),
            a_cs,
            a_rs,
            b.values.as_ptr(),
            b_cs,
            b_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism(),
        );
    }
    Some(())
}

/// Over the current pool's threads (`gemm` keeps products below its threshold on one), or
/// none on a one-thread pool.
fn parallelism() -> Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => Parallelism::None,
        n => Parallelism::Rayon(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A float64 product of the views, element by element.
    fn oracle(a: View<'_>, b: View<'_>) -> Vec<f64> {
        let at = |v: &View<'_>, r: usize, c: usize| {
            f64::from(v.values[r * v.row_stride + c * v.col_stride])
        };
        let mut out = Vec::with_capacity(a.rows * b.cols);
        for r in 0..a.rows {
            for c in 0..b.cols {
                out.push((0..a.cols).map(|i| at(&a, r, i) * at(&b, i, c)).sum());
            }
        }
        out
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// Every transpose combination against float64, and the same bits on 1, 2 and 3 threads at
    /// a size `gemm` splits (`m n k` = 160 * 96 * 200, above its 48 * 48 * 256).
    #[test]
    fn products_match_float64_and_do_not_depend_on_the_thread_count() {
        let (m, k, n) = (160, 200, 96);
        let (xa, xb, base) = (values(m * k, 1), values(k * n, 7), values(m * n, 3));
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let a = if ta {
                View::row_major(&xa, k, m).unwrap().t()
            } else {
                View::row_major(&xa, m, k).unwrap()
            };
            let b = if tb {
                View::row_major(&xb, n, k).unwrap().t()
            } else {
                View::row_major(&xb, k, n).unwrap()
            };
            let want = oracle(a, b);
            let run = |threads: usize, accumulate: bool| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let mut dst = base.clone();
                pool.install(|| product(&mut dst, a, b, accumulate)).unwrap();
                dst
            };
            let one = run(1, false);
            let worst = one
                .iter()
                .zip(&want)
                .map(|(&g, &w)| (f64::from(g) - w).abs() / w.abs().max(1.0))
                .fold(0.0, f64::max);
            // Sums of 200 products of values in [-1, 1] in f32, relative to max(|sum|, 1):
            // measured 5.4e-6 at most over the four
            // (both operands transposed).
            assert!(worst < 1e-5, "transposes {ta} {tb}: {worst:e}");
            for threads in [2, 3] {
                assert!(run(threads, false) == one, "{threads} threads, transposes {ta} {tb}");
            }
            let acc = run(2, true);
            for ((&s, &b0), &p) in acc.iter().zip(&base).zip(&one) {
                assert!(
                    (s - (b0 + p)).abs() <= 1e-5 * (1.0 + s.abs()),
                    "accumulate: {s} against {b0} + {p}"
                );
            }
        }
    }

    #[test]
    fn mismatched_shapes_are_refused() {
        let (a, b) = (vec![0f32; 6], vec![0f32; 6]);
        let (a, b) = (View::row_major(&a, 2, 3).unwrap(), View::row_major(&b, 2, 3).unwrap());
        assert!(product(&mut [0f32; 9], a, b, false).is_none());
        assert!(product(&mut [0f32; 5], a, b.t(), false).is_none());
        assert!(product(&mut [0f32; 4], a, b.t(), false).is_some());
        assert!(View::row_major(&[0f32; 5], 2, 3).is_none());
    }
}
