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
        if rows.checked_mul(cols)? != values.len() {
            return None;
        }
        Self::strided(values, rows, cols, cols, 1)
    }

    /// `[rows, cols]` read from `values` at `r * row_stride + c * col_stride`: a block of a
    /// larger matrix (the LSTM's one step of a `[B, S, 4H]` buffer, for example); `None` when
    /// an element would lie outside `values`.
    pub fn strided(
        values: &'a [f32],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Option<Self> {
        if rows > 0 && cols > 0 {
            let last = (rows - 1)
                .checked_mul(row_stride)?
                .checked_add((cols - 1).checked_mul(col_stride)?)?;
            if last >= values.len() {
                return None;
            }
        }
        Some(View { values, rows, cols, row_stride, col_stride })
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
    if dst.len() != a.rows.checked_mul(b.cols)? {
        return None;
    }
    product_rows(dst, b.cols, a, b, accumulate)
}

/// As [`product`], with `dst`'s row `r` starting at `r * dst_row_stride` (a block of a larger
/// row-major matrix; values between the rows are left alone); `None` when the shapes disagree,
/// rows would overlap (`dst_row_stride < b.cols`) or the last row ends past `dst`.
pub fn product_rows(
    dst: &mut [f32],
    dst_row_stride: usize,
    a: View<'_>,
    b: View<'_>,
    accumulate: bool,
) -> Option<()> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || dst_row_stride < n {
        return None;
    }
    if m > 0 && (m - 1).checked_mul(dst_row_stride)?.checked_add(n)? > dst.len() {
        return None;
    }
    if m == 0 || n == 0 {
        return Some(());
    }
    if k == 0 {
        if !accumulate {
            dst.chunks_mut(dst_row_stride).take(m).for_each(|row| row[..n].fill(0.0));
        }
        return Some(());
    }
    // `row_major` and `strided` built both views with their last element,
    // `(rows - 1) * row_stride + (cols - 1) * col_stride`, inside their values, and `t` swaps
    // shape and strides together; these conversions cannot fail for slices that exist.
    let stride = |s: usize| isize::try_from(s).ok();
    let (a_rs, a_cs, b_rs, b_cs) = (
        stride(a.row_stride)?,
        stride(a.col_stride)?,
        stride(b.row_stride)?,
        stride(b.col_stride)?,
    );
    let dst_rs = stride(dst_row_stride)?;
    // SAFETY: `dst`'s element `(r, c)` is at `r * dst_row_stride + c`, inside `dst` (checked
    // above: the last row ends within it), and rows do not overlap (`dst_row_stride >= n`);
    // `a` and `b` are views whose every element `(r, c)` lies inside their own slices (see
    // above), of shapes `[m, k]` and `[k, n]`. `dst` is a `&mut` borrow, so it aliases neither
    // operand.
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

    /// Blocks of larger matrices (the LSTM's one step of `[B, S, 4H]`): strided operands, and a
    /// destination whose rows are apart, with the values between them left alone.
    #[test]
    fn blocks_of_larger_matrices_match_float64_and_leave_the_rest_alone() {
        let (m, k, n, stride) = (3, 40, 24, 100);
        let (xa, xb) = (values(m * 70, 5), values(k * n, 9));
        // a: rows 70 apart, starting at column 10 of each.
        let a = View::strided(&xa[10..], m, k, 70, 1).unwrap();
        let b = View::row_major(&xb, k, n).unwrap();
        let want = oracle(a, b);
        let base = values(m * stride, 11);
        let mut dst = base.clone();
        product_rows(&mut dst[30..], stride, a, b, true).unwrap();
        let mut worst = 0f64;
        for r in 0..m {
            for c in 0..stride {
                let (got, was) = (dst[r * stride + c], base[r * stride + c]);
                if (30..30 + n).contains(&c) {
                    let w = f64::from(was) + want[r * n + c - 30];
                    worst = worst.max((f64::from(got) - w).abs() / w.abs().max(1.0));
                } else {
                    assert_eq!(got.to_bits(), was.to_bits(), "({r}, {c}) outside the block");
                }
            }
        }
        eprintln!("block product: {worst:e} relative to float64 at most");
        // Sums of 40 products of values in [-1, 1] and a start value, in f32, relative to
        // max(|sum|, 1): measured 5.6e-7 at most.
        assert!(worst < 2e-6, "{worst:e}");
        // Rows that would overlap or run past the end are refused.
        assert!(product_rows(&mut dst[30..], n - 1, a, b, false).is_none());
        assert!(product_rows(&mut dst[80..], stride, a, b, false).is_none());
        assert!(View::strided(&xa[10..], m, k, 70, 1).is_some());
        assert!(View::strided(&xa[11..], m, 70, 70, 1).is_none());
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
