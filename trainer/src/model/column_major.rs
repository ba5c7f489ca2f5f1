//! How a row-major product `C [m, n] = A [m, k] · B [k, n]` is handed to a column-major BLAS
//! (cuBLAS's `gemm`, `model::cublas_product`) without copying an operand: which operand goes
//! first, whether each is transposed, and its leading dimension, from the operands' strides.
//!
//! Why the operands swap: a row-major `C` is the column-major `Cᵀ [n, m]`, and
//! `Cᵀ = Bᵀ · Aᵀ`. A row-major `B` (strides `[s, 1]`) read column-major with leading dimension
//! `s` already is `Bᵀ`, so it goes first untransposed; a transposed view of `B` (strides
//! `[1, s]`) is `B` column-major, so it goes first transposed. The same holds for `A` second.
//!
//! Invariants: `C` is written contiguous (`ldc = n`); an operand whose strides are neither of
//! those two forms, or whose leading dimension is shorter than BLAS requires, is refused
//! (`None`), and the caller makes it contiguous first.

/// One operand as BLAS reads it: transposed or not, and the distance between its stored
/// columns (`lda`/`ldb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// BLAS's `op` is a transpose (`CUBLAS_OP_T`).
    pub transposed: bool,
    /// The leading dimension: elements between stored columns.
    pub ld: usize,
}

/// The arguments of BLAS's `gemm` for a row-major product (see the module): BLAS computes
/// `M × N` from a first operand of `M × K` and a second of `K × N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    /// Columns of the row-major product (`n`).
    pub m: usize,
    /// Rows of the row-major product (`m`).
    pub n: usize,
    /// The shared length (`k`).
    pub k: usize,
    /// The row-major `B`, read first.
    pub first: Operand,
    /// The row-major `A`, read second.
    pub second: Operand,
    /// The product's leading dimension (`n`: written contiguous).
    pub ldc: usize,
}

/// How BLAS reads a row-major `rows × cols` operand with `strides` so that `op` of it is its
/// transpose (`cols × rows`), or `None` for other layouts, or a leading dimension shorter than
/// BLAS requires (the stored matrix's rows: `cols` untransposed, `rows` transposed).
pub fn operand(rows: usize, cols: usize, strides: [usize; 2]) -> Option<Operand> {
    // Row-major (unit stride along the columns): column-major it is the transpose, stored
    // `cols × rows` with `strides[0]` between stored columns.
    if (strides[1] == 1 || cols == 1) && strides[0] >= cols.max(1) {
        return Some(Operand { transposed: false, ld: strides[0] });
    }
    // A transposed view (unit stride along the rows): column-major it is the operand itself,
    // stored `rows × cols`, which BLAS transposes.
    if (strides[0] == 1 || rows == 1) && strides[1] >= rows.max(1) {
        return Some(Operand { transposed: true, ld: strides[1] });
    }
    None
}

/// `gemm`'s arguments for `C [m, n] = A [m, k] · B [k, n]` from the operands' strides, or `None`
/// where an operand is not a plain or transposed matrix (see the module).
pub fn gemm(
    [m, k]: [usize; 2],
    a_strides: [usize; 2],
    [kb, n]: [usize; 2],
    b_strides: [usize; 2],
) -> Option<Gemm> {
    if k != kb {
        return None;
    }
    Some(Gemm {
        m: n,
        n: m,
        k,
        first: operand(k, n, b_strides)?,
        second: operand(m, k, a_strides)?,
        ldc: n.max(1),
    })
}

/// Column-major `C = op(A) · op(B)` in float64 as BLAS defines it (the tests' oracle for
/// [`gemm`]'s arguments): `op(A)` is `M × K`, `op(B)` is `K × N`, `C` has leading dimension
/// `ldc`.
#[cfg(test)]
fn reference(g: &Gemm, a: &[f64], b: &[f64]) -> Vec<f64> {
    let at = |x: &[f64], o: Operand, i: usize, l: usize| {
        if o.transposed {
            x[l + i * o.ld]
        } else {
            x[i + l * o.ld]
        }
    };
    let mut c = vec![0.0; g.ldc * g.n];
    for j in 0..g.n {
        for i in 0..g.m {
            c[i + j * g.ldc] = (0..g.k).map(|l| at(a, g.first, i, l) * at(b, g.second, l, j)).sum();
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `rows × cols` matrix of distinct values stored with `strides` (and padding between
    /// its rows or columns), and its values row-major.
    fn stored(rows: usize, cols: usize, strides: [usize; 2], seed: f64) -> (Vec<f64>, Vec<f64>) {
        let len = if rows * cols == 0 {
            0
        } else {
            (rows - 1) * strides[0] + (cols - 1) * strides[1] + 1
        };
        let mut memory = vec![f64::NAN; len];
        let mut values = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                let v = seed + (r * 31 + c * 7) as f64 * 0.001 - (r as f64 * c as f64).sin();
                memory[r * strides[0] + c * strides[1]] = v;
                values.push(v);
            }
        }
        (memory, values)
    }

    /// Row-major, padded rows, transposed, padded transposed.
    fn layouts(rows: usize, cols: usize) -> Vec<[usize; 2]> {
        vec![[cols, 1], [cols + 3, 1], [1, rows], [1, rows + 5]]
    }

    #[test]
    fn every_layout_gives_the_row_major_product() {
        for (m, k, n) in [(3, 4, 5), (1, 6, 2), (4, 1, 3), (5, 3, 1), (2, 2, 2), (1, 1, 1)] {
            for sa in layouts(m, k) {
                for sb in layouts(k, n) {
                    let (a, av) = stored(m, k, sa, 0.5);
                    let (b, bv) = stored(k, n, sb, -0.25);
                    let g = gemm([m, k], sa, [k, n], sb).expect("a plain or transposed matrix");
                    assert_eq!((g.m, g.n, g.k, g.ldc), (n, m, k, n));
                    // The first operand is B's memory, the second A's.
                    let got = reference(&g, &b, &a);
                    for i in 0..m {
                        for j in 0..n {
                            let want: f64 = (0..k).map(|l| av[i * k + l] * bv[l * n + j]).sum();
                            // C row-major [m, n] is Cᵀ column-major: element (i, j) at i * n + j.
                            let have = got[i * n + j];
                            assert!(
                                (have - want).abs() <= 1e-12 * want.abs().max(1.0),
                                "m {m} k {k} n {n}, A {sa:?}, B {sb:?}: ({i}, {j}) {have} != {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn other_layouts_are_refused() {
        // Neither stride is 1.
        assert_eq!(gemm([3, 4], [8, 2], [4, 5], [5, 1]), None);
        // Rows overlapping (a stride shorter than the row).
        assert_eq!(gemm([3, 4], [2, 1], [4, 5], [5, 1]), None);
        assert_eq!(gemm([3, 4], [4, 1], [4, 5], [1, 2]), None);
        // Shapes that do not chain.
        assert_eq!(gemm([3, 4], [4, 1], [5, 5], [5, 1]), None);
    }

    #[test]
    fn transposes_and_leading_dimensions() {
        // x [rows, in] · w [in, out], both row-major: w first, untransposed, ld out.
        let g = gemm([6, 4], [4, 1], [4, 8], [8, 1]).unwrap();
        assert_eq!(g.first, Operand { transposed: false, ld: 8 });
        assert_eq!(g.second, Operand { transposed: false, ld: 4 });
        // dy [rows, out] · wᵀ (a view of w [in, out]): wᵀ first, transposed, ld out.
        let g = gemm([6, 8], [8, 1], [8, 4], [1, 8]).unwrap();
        assert_eq!(g.first, Operand { transposed: true, ld: 8 });
        // xᵀ (a view of x [rows, in]) · dy: xᵀ second, transposed, ld in.
        let g = gemm([4, 6], [1, 4], [6, 8], [8, 1]).unwrap();
        assert_eq!(g.second, Operand { transposed: true, ld: 4 });
    }
}
