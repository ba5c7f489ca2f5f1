//! The TDT (and RNN-T) loss as three CubeCL kernels, the same source for every CubeCL runtime
//! (CUDA, wgpu). Logits may be f32, f16 or bf16; everything is computed in f32.
//!
//! 1. [`tdt_node_probs`], one cube per lattice node `(b, t, u)`: the token and duration
//!    log-normalisers of the node's logits row and the log-probabilities the lattice reads
//!    (blank, the next target, each duration). Nothing of size `V` is written: this is the
//!    memory-light gather (the full log-softmax is never materialised).
//! 2. [`tdt_lattice`], one cube per utterance: alphas over anti-diagonals (every node of
//!    diagonal `t + u = n` depends only on earlier diagonals, durations of 0 included), the
//!    cost, then betas over the diagonals in reverse and, per node, the occupancies of its
//!    arcs, which replace the gathered log-probabilities in the node table.
//! 3. [`tdt_grad`], one cube per node: the gradient of the node's logits row, written over the
//!    logits themselves (`softmax x occupancy` minus the gathered arc terms, NeMo's FastEmit
//!    scaling and clamp), so a loss call needs no second buffer of the logits' size.
//!
//! Log-domain values use a finite "minus infinity", [`NEG`]: `NEG + w` stays far below any
//! reachable score and `log_add(NEG, NEG)` stays `NEG`, so no `inf - inf` NaN can arise from an
//! unreachable node. NaN or infinite logits propagate to the cost (the trainer skips the step).

use burn_cubecl::cubecl;
use cubecl::prelude::*;

/// The finite stand-in for `-inf` in the lattices (well inside f32's range even when summed).
pub const NEG: f32 = -1.0e30;
/// Scores below this are unreachable.
pub const NEG_LIMIT: f32 = -1.0e29;

/// Node-table fields (per node, `FIELDS + D` f32 values).
pub const F_LSE_TOK: usize = 0;
/// Duration log-normaliser.
pub const F_LSE_DUR: usize = 1;
/// Blank log-probability; after the lattice, the blank arcs' total occupancy.
pub const F_BLANK: usize = 2;
/// Next-target log-probability; after the lattice, the target arcs' occupancy x (1 + lambda).
pub const F_LABEL: usize = 3;
/// After the lattice: the node occupancy (the duration softmax's weight; 0 for RNN-T).
pub const F_GAMMA: usize = 4;
/// After the lattice: the token softmax's weight (node occupancy plus FastEmit's term).
pub const F_SCALE: usize = 5;
/// Fixed fields before the per-duration ones (duration log-probabilities; after the lattice,
/// each duration's occupancy).
pub const FIELDS: usize = 6;

#[cube]
fn log_add(a: f32, b: f32) -> f32 {
    let mut hi = a;
    let mut lo = b;
    if b > a {
        hi = b;
        lo = a;
    }
    hi + f32::ln(1.0 + f32::exp(lo - hi))
}

/// Splits a flat node index into `(b, t, u)` and says whether the node is inside its
/// utterance's lattice (`t < T_b`, `u <= U_b`).
#[cube]
fn node_of(
    row: usize,
    frame_lens: &Array<u32>,
    target_lens: &Array<u32>,
    t_max: u32,
    u1: u32,
) -> (usize, u32, u32, bool) {
    let per_b = (t_max * u1) as usize;
    let b = row / per_b;
    let rem = (row % per_b) as u32;
    let t = rem / u1;
    let u = rem % u1;
    let valid = t < frame_lens[b] && u <= target_lens[b];
    (b, t, u, valid)
}

/// The cube's node index for a 2D cube count (wgpu allows 65535 cubes per dimension).
#[cube]
fn cube_row() -> usize {
    (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize
}

/// Tree reduction (max when `is_max`, else sum) of one value per unit over the cube; every
/// unit gets the result. `block` is the cube size, a power of two. Public so that other
/// crates' kernels reduce over a cube the same way.
#[cube]
pub fn cube_reduce(smem: &mut SharedMemory<f32>, value: f32, #[comptime] is_max: bool) -> f32 {
    let tid = UNIT_POS as usize;
    smem[tid] = value;
    sync_cube();
    let mut stride = (CUBE_DIM / 2) as usize;
    while stride > 0 {
        if tid < stride {
            let other = smem[tid + stride];
            let mine = smem[tid];
            if is_max {
                if other > mine {
                    smem[tid] = other;
                }
            } else {
                smem[tid] = mine + other;
            }
        }
        sync_cube();
        stride /= 2;
    }
    let out = smem[0usize];
    sync_cube();
    out
}

/// Stage 1: per node, `lse_tok`, `lse_dur` and the gathered log-probabilities.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tdt_node_probs<E: Float>(
    logits: &Array<E>,
    targets: &Array<u32>,
    frame_lens: &Array<u32>,
    target_lens: &Array<u32>,
    table: &mut Array<f32>,
    t_max: u32,
    u1: u32,
    u_max: u32,
    vocab: u32,
    n_dur: u32,
    rows: u32,
    #[comptime] block: usize,
    #[comptime] with_durations: bool,
) {
    let row = cube_row();
    let mut smem = SharedMemory::<f32>::new(block);
    if row < rows as usize {
        let (b, _t, u, valid) = node_of(row, frame_lens, target_lens, t_max, u1);
        // `valid` is the same for every unit of the cube: the barriers below are uniform.
        if valid {
            let width = (vocab + n_dur) as usize;
            let base = row * width;
            let mut local_max = f32::new(NEG);
            for c in range_stepped(UNIT_POS, vocab, CUBE_DIM) {
                let z = f32::cast_from(logits[base + c as usize]);
                // A NaN is not picked here but reaches the cost through the sum below.
                if z > local_max {
                    local_max = z;
                }
            }
            let m = cube_reduce(&mut smem, local_max, true);
            let mut local_sum = 0.0f32;
            for c in range_stepped(UNIT_POS, vocab, CUBE_DIM) {
                local_sum += f32::exp(f32::cast_from(logits[base + c as usize]) - m);
            }
            let s = cube_reduce(&mut smem, local_sum, false);
            if UNIT_POS == 0 {
                let lse = m + f32::ln(s);
                let stride = FIELDS + n_dur as usize;
                let out = row * stride;
                table[out + F_LSE_TOK] = lse;
                table[out + F_BLANK] = f32::cast_from(logits[base + (vocab - 1) as usize]) - lse;
                let mut label = f32::new(NEG);
                if u < target_lens[b] {
                    let y = targets[b * u_max as usize + u as usize];
                    label = f32::cast_from(logits[base + y as usize]) - lse;
                }
                table[out + F_LABEL] = label;
                table[out + F_LSE_DUR] = 0.0;
                if with_durations {
                    let dbase = base + vocab as usize;
                    let mut dm = f32::new(NEG);
                    for i in 0..n_dur {
                        let z = f32::cast_from(logits[dbase + i as usize]);
                        if z > dm {
                            dm = z;
                        }
                    }
                    let mut ds = 0.0f32;
                    for i in 0..n_dur {
                        ds += f32::exp(f32::cast_from(logits[dbase + i as usize]) - dm);
                    }
                    let dlse = dm + f32::ln(ds);
                    table[out + F_LSE_DUR] = dlse;
                    for i in 0..n_dur {
                        table[out + FIELDS + i as usize] =
                            f32::cast_from(logits[dbase + i as usize]) - dlse;
                    }
                }
            }
        }
    }
}

/// The `u` range `[lo, end)` of anti-diagonal `t + u = n` in a `t_n x (u_n + 1)` lattice.
#[cube]
fn diagonal(n: u32, t_n: u32, u_n: u32) -> (u32, u32) {
    let mut lo = 0u32;
    if n >= t_n {
        lo = n - (t_n - 1);
    }
    let mut hi = n;
    if u_n < n {
        hi = u_n;
    }
    (lo, hi + 1)
}

/// Index of node `(t, u)` of utterance `b` in the per-node arrays.
#[cube]
fn at(b: usize, t: u32, u: u32, t_max: u32, u1: u32) -> usize {
    b * (t_max * u1) as usize + (t * u1 + u) as usize
}

/// TDT arc weight from node `n` with duration index `i`: `lp(token) - sigma + lp(duration)`.
#[cube]
fn arc(table: &Array<f32>, n: usize, field: usize, i: u32, n_dur: u32, sigma: f32) -> f32 {
    let s = FIELDS + n_dur as usize;
    table[n * s + field] - sigma + table[n * s + FIELDS + i as usize]
}

/// Stage 2: one cube per utterance. Costs always; with `want_grad`, the node table's arc terms
/// are replaced by occupancies (see the module documentation).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tdt_lattice<E: Float>(
    table: &mut Array<f32>,
    alpha: &mut Array<f32>,
    beta: &mut Array<f32>,
    costs: &mut Array<E>,
    durations: &Array<u32>,
    frame_lens: &Array<u32>,
    target_lens: &Array<u32>,
    t_max: u32,
    u1: u32,
    n_dur: u32,
    sigma: f32,
    fastemit: f32,
    zero_infinity: u32,
    #[comptime] rnnt: bool,
    #[comptime] want_grad: bool,
) {
    let b = CUBE_POS;
    let t_n = frame_lens[b];
    let u_n = target_lens[b];
    let s = FIELDS + n_dur as usize;
    let mut slot = SharedMemory::<f32>::new(1usize);

    // Forward: diagonal n holds the nodes with t + u = n.
    for n in 0..(t_n + u_n) {
        let (u_lo, u_end) = diagonal(n, t_n, u_n);
        for u in range_stepped(u_lo + UNIT_POS, u_end, CUBE_DIM) {
            let t = n - u;
            let mut a = f32::new(NEG);
            if n == 0 {
                a = 0.0;
            } else if rnnt {
                if t > 0 {
                    let src = at(b, t - 1, u, t_max, u1);
                    a = log_add(a, alpha[src] + table[src * s + F_BLANK]);
                }
                if u > 0 {
                    let src = at(b, t, u - 1, t_max, u1);
                    a = log_add(a, alpha[src] + table[src * s + F_LABEL]);
                }
            } else {
                for i in 0..n_dur {
                    let d = durations[i as usize];
                    if d <= t {
                        if d > 0 {
                            let src = at(b, t - d, u, t_max, u1);
                            a = log_add(a, alpha[src] + arc(table, src, F_BLANK, i, n_dur, sigma));
                        }
                        if u > 0 {
                            let src = at(b, t - d, u - 1, t_max, u1);
                            a = log_add(a, alpha[src] + arc(table, src, F_LABEL, i, n_dur, sigma));
                        }
                    }
                }
            }
            alpha[at(b, t, u, t_max, u1)] = a;
        }
        sync_storage();
    }

    if UNIT_POS == 0 {
        let mut log_p = f32::new(NEG);
        if rnnt {
            let last = at(b, t_n - 1, u_n, t_max, u1);
            log_p = alpha[last] + table[last * s + F_BLANK];
        } else {
            for i in 0..n_dur {
                let d = durations[i as usize];
                if d > 0 && d <= t_n {
                    let src = at(b, t_n - d, u_n, t_max, u1);
                    log_p = log_add(log_p, alpha[src] + arc(table, src, F_BLANK, i, n_dur, sigma));
                }
            }
        }
        let mut cost = -log_p;
        if !rnnt {
            cost *= 1.0 + fastemit;
        }
        if log_p < NEG_LIMIT {
            // +inf, made at run time: WGSL has no infinity literal. |log_p| >= 1e29, so the
            // product overflows.
            cost = f32::abs(log_p) * 1.0e30;
            if zero_infinity != 0 {
                cost = 0.0;
            }
        }
        costs[b] = E::cast_from(cost);
        slot[0usize] = log_p;
    }
    sync_cube();

    if want_grad {
        let log_p = slot[0usize];
        // Backward: beta(t, u) is the log-probability of completing from node (t, u).
        let mut n = t_n + u_n;
        while n > 0 {
            n -= 1;
            let (u_lo, u_end) = diagonal(n, t_n, u_n);
            for u in range_stepped(u_lo + UNIT_POS, u_end, CUBE_DIM) {
                let t = n - u;
                let me = at(b, t, u, t_max, u1);
                let mut bv = f32::new(NEG);
                if rnnt {
                    if t + 1 == t_n && u == u_n {
                        bv = table[me * s + F_BLANK];
                    } else {
                        if t + 1 < t_n {
                            bv = log_add(
                                bv,
                                table[me * s + F_BLANK] + beta[at(b, t + 1, u, t_max, u1)],
                            );
                        }
                        if u < u_n {
                            bv = log_add(
                                bv,
                                table[me * s + F_LABEL] + beta[at(b, t, u + 1, t_max, u1)],
                            );
                        }
                    }
                } else {
                    for i in 0..n_dur {
                        let d = durations[i as usize];
                        if d > 0 {
                            let wb = arc(table, me, F_BLANK, i, n_dur, sigma);
                            if t + d < t_n {
                                bv = log_add(bv, wb + beta[at(b, t + d, u, t_max, u1)]);
                            } else if t + d == t_n && u == u_n {
                                bv = log_add(bv, wb);
                            }
                        }
                        if u < u_n && t + d < t_n {
                            let wl = arc(table, me, F_LABEL, i, n_dur, sigma);
                            bv = log_add(bv, wl + beta[at(b, t + d, u + 1, t_max, u1)]);
                        }
                    }
                }
                beta[me] = bv;
            }
            sync_storage();
        }

        // Occupancies, node by node (each node reads only its own arcs' weights).
        let impossible = log_p < NEG_LIMIT;
        let nodes = t_n * (u_n + 1);
        for k in range_stepped(UNIT_POS, nodes, CUBE_DIM) {
            let t = k / (u_n + 1);
            let u = k % (u_n + 1);
            let me = at(b, t, u, t_max, u1);
            let a = alpha[me];
            let gamma = f32::exp(a + beta[me] - log_p);
            let dead = impossible || a < NEG_LIMIT || gamma == 0.0;
            let mut blank_occ = 0.0f32;
            let mut label_occ = 0.0f32;
            if rnnt {
                if !dead {
                    if t + 1 == t_n && u == u_n {
                        blank_occ = f32::exp(a + table[me * s + F_BLANK] - log_p);
                    } else if t + 1 < t_n {
                        blank_occ = f32::exp(
                            a + table[me * s + F_BLANK] + beta[at(b, t + 1, u, t_max, u1)] - log_p,
                        );
                    }
                    if u < u_n {
                        label_occ = f32::exp(
                            a + table[me * s + F_LABEL] + beta[at(b, t, u + 1, t_max, u1)] - log_p,
                        );
                    }
                }
                table[me * s + F_GAMMA] = 0.0;
                if dead {
                    table[me * s + F_SCALE] = 0.0;
                } else {
                    table[me * s + F_SCALE] = gamma;
                }
            } else {
                for i in 0..n_dur {
                    let d = durations[i as usize];
                    let mut ob = 0.0f32;
                    let mut ol = 0.0f32;
                    if !dead {
                        let wb = arc(table, me, F_BLANK, i, n_dur, sigma);
                        if d > 0 && t + d < t_n {
                            ob = f32::exp(a + wb + beta[at(b, t + d, u, t_max, u1)] - log_p);
                        } else if d > 0 && t + d == t_n && u == u_n {
                            ob = f32::exp(a + wb - log_p);
                        }
                        if u < u_n && t + d < t_n {
                            let wl = arc(table, me, F_LABEL, i, n_dur, sigma);
                            ol = f32::exp(a + wl + beta[at(b, t + d, u + 1, t_max, u1)] - log_p);
                        }
                    }
                    blank_occ += ob;
                    label_occ += ol;
                    // Read by later durations of this node only through `arc`, which reads
                    // F_BLANK / F_LABEL and the duration field of its own index: this field
                    // is not read again.
                    table[me * s + FIELDS + i as usize] = ob + ol;
                }
                let mut scale = gamma;
                if u < u_n {
                    scale += fastemit * label_occ;
                }
                label_occ *= 1.0 + fastemit;
                if dead {
                    table[me * s + F_GAMMA] = 0.0;
                    table[me * s + F_SCALE] = 0.0;
                } else {
                    table[me * s + F_GAMMA] = gamma;
                    table[me * s + F_SCALE] = scale;
                }
            }
            table[me * s + F_BLANK] = blank_occ;
            table[me * s + F_LABEL] = label_occ;
        }
    }
}

/// Stage 3: one cube per node; `grad` holds the node's logits on entry and their gradient on
/// exit. Rows outside the utterance's lattice become zero.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tdt_grad<E: Float>(
    grad: &mut Array<E>,
    table: &Array<f32>,
    targets: &Array<u32>,
    frame_lens: &Array<u32>,
    target_lens: &Array<u32>,
    t_max: u32,
    u1: u32,
    u_max: u32,
    vocab: u32,
    n_dur: u32,
    rows: u32,
    clamp: f32,
    #[comptime] rnnt: bool,
) {
    let row = cube_row();
    if row < rows as usize {
        let (b, _t, u, valid) = node_of(row, frame_lens, target_lens, t_max, u1);
        let width = vocab + n_dur;
        let base = row * width as usize;
        if valid {
            let s = FIELDS + n_dur as usize;
            let node = row * s;
            let lse = table[node + F_LSE_TOK];
            let scale = table[node + F_SCALE];
            let c_blank = table[node + F_BLANK];
            let c_label = table[node + F_LABEL];
            let mut y = vocab;
            if u < target_lens[b] {
                y = targets[b * u_max as usize + u as usize];
            }
            for c in range_stepped(UNIT_POS, vocab, CUBE_DIM) {
                let i = base + c as usize;
                let mut g = 0.0f32;
                if scale != 0.0 {
                    g = f32::exp(f32::cast_from(grad[i]) - lse) * scale;
                }
                if c == vocab - 1 {
                    g -= c_blank;
                }
                if c == y {
                    g -= c_label;
                }
                if clamp > 0.0 {
                    if g > clamp {
                        g = clamp;
                    }
                    if g < -clamp {
                        g = -clamp;
                    }
                }
                grad[i] = E::cast_from(g);
            }
            let gamma = table[node + F_GAMMA];
            let dlse = table[node + F_LSE_DUR];
            for j in range_stepped(UNIT_POS, n_dur, CUBE_DIM) {
                let i = base + (vocab + j) as usize;
                let mut g = 0.0f32;
                if !rnnt {
                    if gamma != 0.0 {
                        g = f32::exp(f32::cast_from(grad[i]) - dlse) * gamma;
                    }
                    g -= table[node + FIELDS + j as usize];
                }
                grad[i] = E::cast_from(g);
            }
        } else {
            for c in range_stepped(UNIT_POS, width, CUBE_DIM) {
                grad[base + c as usize] = E::cast_from(0.0f32);
            }
        }
    }
}
