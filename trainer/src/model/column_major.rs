//! How a row-major product `C [m, n] = A [m, k] · B [k, n]` is handed to a column-major BLAS
//! (cuBLAS's `gemm`, `model::cublas_product`) without copying an operand: which operand goes
//! first, whether each is transposed, and its leading dimension, from the operands' strides.
//!
//! Why the operands swap: a row-major `C` is the column-major `Cᵀ [n, m]`, and
//! `Cᵀ = Bᵀ · Aᵀ`. A row-major `B` (strides `[s, 1]`) read column-major with leading dimension
//! `s` already is `Bᵀ`, so it goes first untransposed; a transposed view of `B` (strides
//! `[1, s]`) is `B` column-major, so it goes first transposed. The same holds for `A` second.
//!
//! Stacks of products (`[O, H, m, k] · [O, H, k, n]`, the attention's, [`batched`]) go as few
//! strided-batched calls (`gemm_strided_batched`): one over all `O·H` matrices where every
//! operand's outer stride is `H` times its inner one, else one call of `H` per outer index,
//! each from its own offsets. An operand of outer size 1 is read by every outer index (stride
//! 0, the position encoding's `[1, H, 2T - 1, dk]`); a product summed over the outer axis (that
//! operand's gradient) is the same calls in a row into one output, each after the first adding
//! to it (`beta = 1`).
//!
//! Invariants: `C` is written contiguous (`ldc = n`); an operand whose strides are neither of
//! those two forms, or whose leading dimension is shorter than BLAS requires, is refused
//! (`None`), and the caller makes it contiguous first. Calls into one output run in the order
//! given, on one stream.

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

/// A stack of matrices `[outer, inner, rows, cols]` as stored: shape and strides in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stack {
    /// `[outer, inner, rows, cols]`.
    pub shape: [usize; 4],
    /// Elements between neighbours along each axis.
    pub strides: [usize; 4],
}

/// One strided-batched call: `count` products, the `i`-th reading each operand at its offset
/// plus `i` times its stride (elements), in the order first operand (the row-major `B`),
/// second (`A`), product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// Products in the call.
    pub count: usize,
    /// Where each buffer's first matrix starts.
    pub offsets: [usize; 3],
    /// Between consecutive matrices of each buffer.
    pub strides: [usize; 3],
    /// The call adds to the product (`beta = 1`) instead of writing it (`beta = 0`).
    pub accumulate: bool,
}

/// A stack of products as BLAS calls (see the module).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batched {
    /// Each product's arguments (the same for all).
    pub gemm: Gemm,
    /// The calls, in order.
    pub groups: Vec<Group>,
    /// The product's shape, `[O or 1, H, m, n]`, written contiguous.
    pub shape: [usize; 4],
}

impl Batched {
    /// How many elements from its start each buffer's calls reach (first operand, second,
    /// product): the extent of the last matrix each call reads or writes.
    pub fn reach(&self) -> [usize; 3] {
        let g = &self.gemm;
        // BLAS's op(first) is M × K and op(second) K × N; a stored matrix spans (columns - 1)
        // leading dimensions plus its rows.
        let span = |o: Operand, rows: usize, cols: usize| {
            let (rows, cols) = if o.transposed { (cols, rows) } else { (rows, cols) };
            if rows * cols == 0 {
                0
            } else {
                (cols - 1) * o.ld + rows
            }
        };
        let c = Operand { transposed: false, ld: g.ldc };
        let one = [span(g.first, g.m, g.k), span(g.second, g.k, g.n), span(c, g.m, g.n)];
        let mut reach = [0; 3];
        for group in self.groups.iter().filter(|group| group.count > 0) {
            for (i, r) in reach.iter_mut().enumerate() {
                *r = (*r).max(group.offsets[i] + (group.count - 1) * group.strides[i] + one[i]);
            }
        }
        reach
    }
}

/// The calls for `a [Oa, H, m, k] · b [Ob, H, k, n]` with `Oa` and `Ob` equal or one of them 1
/// (read by every outer index), summed over the outer axis into `[1, H, m, n]` where
/// `sum_outer`; `None` where the shapes do not chain or an operand's matrices are neither
/// plain nor transposed (see the module).
pub fn batched(a: &Stack, b: &Stack, sum_outer: bool) -> Option<Batched> {
    let ([oa, h, m, k], [ob, hb, kb, n]) = (a.shape, b.shape);
    if h != hb || k != kb || (oa != ob && oa != 1 && ob != 1) {
        return None;
    }
    let outer = oa.max(ob);
    let gemm = gemm([m, k], [a.strides[2], a.strides[3]], [k, n], [b.strides[2], b.strides[3]])?;
    // Strides as read: an axis of length 1 is read at offset 0 by every index.
    let read = |s: &Stack| {
        let axis = |i: usize| if s.shape[i] == 1 { 0 } else { s.strides[i] };
        [axis(0), axis(1)]
    };
    let matrix = m * n;
    let c = [if sum_outer { 0 } else { h * matrix }, matrix];
    let [eb, ea] = [read(b), read(a)];
    let mut groups = Vec::new();
    // One call over all O·H matrices where each buffer's outer stride is H inner ones.
    let uniform = |[o, i]: [usize; 2]| outer == 1 || h == 1 || o == h * i;
    if !sum_outer && [eb, ea, c].into_iter().all(uniform) {
        let stride = |[o, i]: [usize; 2]| if h == 1 { o } else { i };
        groups.push(Group {
            count: outer * h,
            offsets: [0; 3],
            strides: [stride(eb), stride(ea), stride(c)],
            accumulate: false,
        });
    } else {
        for o in 0..outer {
            groups.push(Group {
                count: h,
                offsets: [o * eb[0], o * ea[0], o * c[0]],
                strides: [eb[1], ea[1], c[1]],
                accumulate: sum_outer && o > 0,
            });
        }
    }
    let shape = [if sum_outer { 1 } else { outer }, h, m, n];
    Some(Batched { gemm, groups, shape })
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

    /// The calls of `plan` run as BLAS runs them, on `first` (the row-major `B`'s memory) and
    /// `second` (`A`'s), into a zeroed product buffer of `plan.shape`.
    fn run_batched(plan: &Batched, first: &[f64], second: &[f64]) -> Vec<f64> {
        let [o, h, m, n] = plan.shape;
        let mut c = vec![0.0; o * h * m * n];
        for g in &plan.groups {
            for i in 0..g.count {
                let at = |buffer: usize| g.offsets[buffer] + i * g.strides[buffer];
                let one = reference(&plan.gemm, &first[at(0)..], &second[at(1)..]);
                for (slot, v) in c[at(2)..at(2) + m * n].iter_mut().zip(one) {
                    *slot = if g.accumulate { *slot + v } else { v };
                }
            }
        }
        c
    }

    /// A `[o, h, rows, cols]` stack of distinct values with the matrices' `strides` and the
    /// outer axes either packed (`o` stride `h` matrices) or not (a gap between outer
    /// indices, the inner axis stepping first), and its values row-major.
    fn stack(
        [o, h, rows, cols]: [usize; 4],
        matrix: [usize; 2],
        packed: bool,
        seed: f64,
    ) -> (Stack, Vec<f64>, Vec<f64>) {
        let (one, values) = stored(rows, cols, matrix, 0.0);
        let size = one.len().max(1) + 2;
        let strides = [if packed { h * size } else { h * size + 7 }, size, matrix[0], matrix[1]];
        let len = (o - 1) * strides[0] + (h - 1) * strides[1] + size;
        let mut memory = vec![f64::NAN; len];
        let mut logical = Vec::new();
        for x in 0..o {
            for y in 0..h {
                let shift = seed + (x * 5 + y) as f64 * 0.37;
                for (i, v) in one.iter().enumerate() {
                    if !v.is_nan() {
                        memory[x * strides[0] + y * strides[1] + i] = v + shift;
                    }
                }
                logical.extend(values.iter().map(|v| v + shift));
            }
        }
        (Stack { shape: [o, h, rows, cols], strides }, memory, logical)
    }

    #[test]
    fn stacks_of_products_give_each_products_value_broadcast_and_summed() {
        // (outer of a, outer of b, inner, m, k, n)
        let shapes =
            [(3, 3, 2, 4, 3, 5), (3, 1, 2, 3, 4, 2), (1, 3, 4, 2, 3, 3), (2, 2, 1, 3, 2, 4)];
        for (oa, ob, h, m, k, n) in shapes {
            for sum_outer in [false, true] {
                for (la, lb) in layouts(m, k).into_iter().zip(layouts(k, n).into_iter().rev()) {
                    for packed in [true, false] {
                        let (sa, a, av) = stack([oa, h, m, k], la, packed, 0.5);
                        let (sb, b, bv) = stack([ob, h, k, n], lb, !packed, -0.25);
                        let plan = batched(&sa, &sb, sum_outer).expect("chains");
                        let outer = oa.max(ob);
                        assert_eq!(plan.shape, [if sum_outer { 1 } else { outer }, h, m, n]);
                        let [rb, ra, rc] = plan.reach();
                        assert!(
                            rb <= b.len() && ra <= a.len(),
                            "{:?} past {} {}",
                            plan.reach(),
                            b.len(),
                            a.len()
                        );
                        assert_eq!(
                            rc,
                            plan.shape.iter().product::<usize>(),
                            "the product's last element"
                        );
                        let got = run_batched(&plan, &b, &a);
                        let mut want = vec![0.0; plan.shape.iter().product()];
                        for x in 0..outer {
                            let (xa, xb) =
                                (if oa == 1 { 0 } else { x }, if ob == 1 { 0 } else { x });
                            for y in 0..h {
                                let (ma, mb) = ((xa * h + y) * m * k, (xb * h + y) * k * n);
                                let mc = ((if sum_outer { 0 } else { x }) * h + y) * m * n;
                                for i in 0..m {
                                    for j in 0..n {
                                        want[mc + i * n + j] += (0..k)
                                            .map(|l| av[ma + i * k + l] * bv[mb + l * n + j])
                                            .sum::<f64>();
                                    }
                                }
                            }
                        }
                        let case = format!(
                            "{oa}/{ob} x {h}, {m}x{k}x{n}, sum {sum_outer}, {la:?} {lb:?}, packed {packed}: {:?}",
                            plan.groups
                        );
                        for (g, w) in got.iter().zip(&want) {
                            assert!(
                                (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                                "{case}: {g} != {w}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn packed_stacks_take_one_call_and_others_one_per_outer_index() {
        let dense = |shape: [usize; 4]| Stack {
            shape,
            strides: [shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1],
        };
        // The content scores: q [B, H, T, dk] · kᵀ (a transposed view of [B, H, T, dk]).
        let q = dense([6, 8, 40, 16]);
        let mut kt = dense([6, 8, 40, 16]);
        kt.shape = [6, 8, 16, 40];
        kt.strides = [kt.strides[0], kt.strides[1], 1, 16];
        let plan = batched(&q, &kt, false).unwrap();
        assert_eq!(plan.groups.len(), 1);
        assert_eq!(plan.groups[0].count, 48);
        assert_eq!(plan.groups[0].strides, [640, 640, 1600]);
        assert!(plan.gemm.first.transposed && !plan.gemm.second.transposed);
        // The position scores: rᵀ [1, H, dk, 2T - 1] read by every outer index.
        let mut rt = dense([1, 8, 79, 16]);
        rt.shape = [1, 8, 16, 79];
        rt.strides = [rt.strides[0], rt.strides[1], 1, 16];
        let plan = batched(&q, &rt, false).unwrap();
        assert_eq!(plan.groups.len(), 6);
        assert_eq!(plan.groups[5].offsets, [0, 5 * 8 * 640, 5 * 8 * 40 * 79]);
        assert!(plan.groups.iter().all(|g| g.count == 8 && !g.accumulate));
        // Its gradient summed over the batch: six calls into one output, all but the first adding.
        let plan = batched(&q, &dense([6, 8, 16, 79]), true).unwrap();
        assert_eq!(plan.shape, [1, 8, 40, 79]);
        let adds: Vec<bool> = plan.groups.iter().map(|g| g.accumulate).collect();
        assert_eq!(adds, [false, true, true, true, true, true]);
        assert!(plan.groups.iter().all(|g| g.offsets[2] == 0));
        // Shapes that do not chain, and outer sizes that do not broadcast.
        assert_eq!(batched(&q, &dense([6, 4, 16, 79]), false), None);
        assert_eq!(batched(&q, &dense([6, 8, 15, 79]), false), None);
        assert_eq!(batched(&q, &dense([3, 8, 16, 79]), false), None);
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
