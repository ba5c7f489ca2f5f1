//! The quota cells of `temperature` mode (one language of one corpus, and optionally one
//! source), their target shares after temperature, and each epoch's draws from endless
//! permutations of every cell.

use super::{check_mix, Mix, PlanError, SamplerConfig};
use crate::rng::{cell_seed, quota_key, quota_seed};

/// One quota cell of `temperature` mode (see [`Mix`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// Language id.
    pub language: u16,
    /// Corpus of the training set.
    pub corpus: u16,
    /// Source id, when sources are split (`source_temperature`); otherwise 0.
    pub source: u16,
    /// Utterances in the cell.
    pub utterances: u64,
    /// Weight of the cell's corpus.
    pub weight: f64,
    /// The cell's target share of an epoch: its language's share after temperature times the
    /// cell's share of that language.
    pub target: f64,
    /// Draws per epoch (largest remainders: within one draw of `target x utterances`).
    pub quota: u64,
}

/// The cells of a training set, in first-appearance order, and how to find an utterance's cell.
pub(super) struct CellTable {
    pub(super) cells: Vec<Cell>,
    /// Dense (corpus, source, language) code -> cell, `u32::MAX` where no utterance falls.
    cell_of_code: Vec<u32>,
    /// Language id -> dense language; `None`: the identity (one corpus, one source).
    dense_language: Option<Vec<u32>>,
    /// Source id -> dense source, when sources are split.
    dense_source: Option<Vec<u32>>,
    n_languages: usize,
    n_sources: usize,
    /// Languages in first-appearance order, each with its cells in first-appearance order.
    by_language: Vec<(u16, Vec<u32>)>,
}

/// At most this many (corpus, source, language) codes: bounds the table's memory (16 MiB).
const MAX_CELL_CODES: usize = 1 << 22;

/// Ids in first-appearance order -> 0, 1, 2, ... (`u32::MAX` for absent ids), and their count.
fn dense_ids(ids: &[u16]) -> (Vec<u32>, usize) {
    let mut map = vec![u32::MAX; 1 << 16];
    let mut n = 0u32;
    for &x in ids {
        if map[x as usize] == u32::MAX {
            map[x as usize] = n;
            n += 1;
        }
    }
    (map, n as usize)
}

impl CellTable {
    /// The cells of `languages` under `mix` (checked by [`check_mix`]), with each cell's target
    /// share and quota for an epoch of `languages.len()` draws.
    pub(super) fn build(
        languages: &[u16],
        mix: &Mix<'_>,
        config: &SamplerConfig,
    ) -> Result<CellTable, PlanError> {
        let split = config.source_temperature.is_some() && !mix.sources.is_empty();
        let (dense_source, n_sources) = if split {
            let (map, n) = dense_ids(mix.sources);
            (Some(map), n.max(1))
        } else {
            (None, 1)
        };
        // One corpus and one source: the language id is the code (no remapping pass).
        let (dense_language, n_languages) = if mix.corpora() * n_sources == 1 {
            (None, 1 << 16)
        } else {
            let (map, n) = dense_ids(languages);
            (Some(map), n.max(1))
        };
        let codes = mix.corpora() * n_sources * n_languages;
        if codes > MAX_CELL_CODES {
            return Err(PlanError::TooManyCells {
                corpora: mix.corpora(),
                sources: n_sources,
                languages: n_languages,
                max: MAX_CELL_CODES,
            });
        }
        let mut t = CellTable {
            cells: Vec::new(),
            cell_of_code: vec![u32::MAX; codes],
            dense_language,
            dense_source,
            n_languages,
            n_sources,
            by_language: Vec::new(),
        };
        for (corpus, range) in corpus_ranges(mix, languages.len()) {
            for i in range {
                let code = t.code(corpus, i, languages, mix);
                let mut cell = t.cell_of_code[code];
                if cell == u32::MAX {
                    cell = t.cells.len() as u32;
                    t.cell_of_code[code] = cell;
                    t.cells.push(Cell {
                        language: languages[i],
                        corpus: corpus as u16,
                        source: if split { mix.sources[i] } else { 0 },
                        utterances: 0,
                        weight: mix.weight(corpus),
                        target: 0.0,
                        quota: 0,
                    });
                }
                t.cells[cell as usize].utterances += 1;
            }
        }
        let mut slot = vec![u32::MAX; 1 << 16];
        for (c, cell) in t.cells.iter().enumerate() {
            let l = cell.language as usize;
            if slot[l] == u32::MAX {
                slot[l] = t.by_language.len() as u32;
                t.by_language.push((cell.language, Vec::new()));
            }
            t.by_language[slot[l] as usize].1.push(c as u32);
        }

        // Languages' shares after temperature, over their weighted counts, summed in
        // first-appearance order (for one corpus: exactly the Python sampler's shares).
        let size = |c: &Cell| c.weight * c.utterances as f64;
        let language_sizes: Vec<f64> = t
            .by_language
            .iter()
            .map(|(_, cells)| cells.iter().map(|&c| size(&t.cells[c as usize])).sum())
            .collect();
        let shares = powered_shares(&language_sizes, config.temperature);
        let total = languages.len() as u64;
        let exact: Vec<f64> = shares.iter().map(|s| s * total as f64).collect();
        let quotas = largest_remainder(&exact, total);
        let within = if split { config.source_temperature.unwrap_or(1.0) } else { 1.0 };
        for (k, (_, cells)) in t.by_language.iter().enumerate() {
            if let [c] = cells[..] {
                let cell = &mut t.cells[c as usize];
                (cell.target, cell.quota) = (shares[k], quotas[k]);
                continue;
            }
            let sizes: Vec<f64> = cells.iter().map(|&c| size(&t.cells[c as usize])).collect();
            let fractions = powered_shares(&sizes, within);
            let exact: Vec<f64> = fractions.iter().map(|f| f * quotas[k] as f64).collect();
            let cell_quotas = largest_remainder(&exact, quotas[k]);
            for ((&c, f), q) in cells.iter().zip(&fractions).zip(cell_quotas) {
                let cell = &mut t.cells[c as usize];
                (cell.target, cell.quota) = (shares[k] * f, q);
            }
        }
        Ok(t)
    }

    /// The dense code of utterance `i`, of corpus `corpus`.
    #[inline]
    fn code(&self, corpus: usize, i: usize, languages: &[u16], mix: &Mix<'_>) -> usize {
        let s = self.dense_source.as_ref().map_or(0, |m| m[mix.sources[i] as usize] as usize);
        let l = languages[i] as usize;
        let l = self.dense_language.as_ref().map_or(l, |m| m[l] as usize);
        (corpus * self.n_sources + s) * self.n_languages + l
    }

    /// Calls `f(utterance, its cell)` for every utterance, in order.
    pub(super) fn for_each(&self, languages: &[u16], mix: &Mix<'_>, mut f: impl FnMut(usize, u32)) {
        for (corpus, range) in corpus_ranges(mix, languages.len()) {
            for i in range {
                f(i, self.cell_of_code[self.code(corpus, i, languages, mix)]);
            }
        }
    }

    /// Epoch `epoch`'s draws (see [`epoch_draws_mixed`]).
    pub(super) fn draws(
        &self,
        languages: &[u16],
        mix: &Mix<'_>,
        config: &SamplerConfig,
        epoch: u64,
    ) -> Vec<u32> {
        // Utterances of each cell, in index order (a counting sort over the cells).
        let mut start = vec![0usize; self.cells.len() + 1];
        for (c, cell) in self.cells.iter().enumerate() {
            start[c + 1] = start[c] + cell.utterances as usize;
        }
        let mut members = vec![0u32; languages.len()];
        let mut fill = start.clone();
        self.for_each(languages, mix, |i, c| {
            let c = c as usize;
            members[fill[c]] = i as u32;
            fill[c] += 1;
        });
        drop(fill);

        let mut draws = Vec::with_capacity(languages.len());
        let mut keys: Vec<u64> = Vec::new();
        for &c in self.by_language.iter().flat_map(|(_, cells)| cells) {
            let cell = &self.cells[c as usize];
            let members = &members[start[c as usize]..start[c as usize + 1]];
            let (n, q) = (cell.utterances, cell.quota);
            let base = cell_seed(config.seed, cell.corpus, cell.source);
            let (mut pos, end) =
                (epoch.saturating_mul(q), epoch.saturating_add(1).saturating_mul(q));
            while pos < end {
                let cycle = pos / n;
                let from = (pos - cycle * n) as usize;
                let to = (end.min((cycle + 1) * n) - cycle * n) as usize;
                // (key, position) packed in a u64: distinct, and ordered as the permutation is.
                let cycle_seed = quota_seed(base, cell.language, cycle);
                keys.clear();
                keys.extend(
                    (0..members.len() as u64)
                        .map(|k| u64::from(quota_key(cycle_seed, k)) << 32 | k),
                );
                // The permutation's places `from..to`: the `to` smallest keys, less the `from`
                // smallest of those.
                if to < keys.len() {
                    keys.select_nth_unstable(to);
                    keys.truncate(to);
                }
                if from > 0 {
                    keys.select_nth_unstable(from);
                }
                draws.extend(keys[from..].iter().map(|&x| members[(x & 0xFFFF_FFFF) as usize]));
                pos = (cycle + 1) * n;
            }
        }
        draws
    }
}

/// Each corpus of `mix` with its range of utterance indices.
fn corpus_ranges<'a>(
    mix: &'a Mix<'_>,
    n: usize,
) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + 'a {
    let end = move |c: usize| mix.corpus_ends.get(c).map_or(n, |&e| e as usize);
    (0..mix.corpora()).map(move |c| (c, if c == 0 { 0 } else { end(c - 1) }..end(c)))
}

/// Target share of each language id after temperature: `count^T` normalised (every present
/// language 1 when `T <= 0`), 0 for absent ids. The sum runs in first-appearance order, as the
/// Python sampler sums its dict, so the shares are bit-identical to its.
pub fn target_shares(languages: &[u16], temperature: f64) -> (Vec<f64>, Vec<u64>) {
    let (counts, order) = language_counts(languages);
    let sizes: Vec<f64> = order.iter().map(|&l| counts[l as usize] as f64).collect();
    let mut shares = vec![0.0; 1 << 16];
    for (&l, s) in order.iter().zip(powered_shares(&sizes, temperature)) {
        shares[l as usize] = s;
    }
    (shares, counts)
}

/// The quota cells of a training set in `temperature` mode: language, corpus, source, size,
/// weight, target share and quota of each (first-appearance order).
pub fn quota_cells(
    languages: &[u16],
    mix: &Mix<'_>,
    config: &SamplerConfig,
) -> Result<Vec<Cell>, PlanError> {
    check_mix(languages.len(), mix, config)?;
    Ok(CellTable::build(languages, mix, config)?.cells)
}

/// Utterances per language id, and the ids present in first-appearance order.
fn language_counts(languages: &[u16]) -> (Vec<u64>, Vec<u16>) {
    let mut counts = vec![0u64; 1 << 16];
    let mut order: Vec<u16> = Vec::new();
    for &l in languages {
        if counts[l as usize] == 0 {
            order.push(l);
        }
        counts[l as usize] += 1;
    }
    (counts, order)
}

/// `size^T` normalised (every entry the same when `T <= 0`), summed in order.
fn powered_shares(sizes: &[f64], temperature: f64) -> Vec<f64> {
    let w = |s: f64| if temperature <= 0.0 { 1.0 } else { s.powf(temperature) };
    let ws: f64 = sizes.iter().map(|&s| w(s)).sum();
    sizes.iter().map(|&s| w(s) / ws).collect()
}

/// Per-utterance sampling weight of each language id, as the Python sampler computes it: the
/// language's target share (see [`target_shares`]) divided by its actual share.
pub fn language_weights(languages: &[u16], temperature: f64) -> Vec<f64> {
    let (mut weights, counts) = target_shares(languages, temperature);
    let total = languages.len() as f64;
    for (w, &c) in weights.iter_mut().zip(&counts) {
        if c > 0 {
            *w /= c as f64 / total;
        }
    }
    weights
}

/// Epoch `epoch`'s draws in `temperature` mode: utterance indices, grouped by language (in
/// first-appearance order), as many as the corpus has utterances. Language `l` with `n` utterances
/// gets a quota `q` of the draws in proportion to its target share (largest remainders, so the
/// quotas sum to the utterance count); its draws for epoch `e` are positions `e q .. (e + 1) q`
/// of the concatenation of permutations `0, 1, 2, ...` of its utterances. Permutation `c` orders
/// the language's `k`-th utterance by ([`quota_key`]`(`[`quota_seed`]`(seed, l, c), k)`, `k`);
/// a slice of it is found by selection, not by sorting (the draws' order does not matter: packing
/// orders them). Cost: per permutation the epoch reaches into, one key per utterance of the
/// language and two linear-time selections, all sequential in memory.
pub fn epoch_draws(
    languages: &[u16],
    config: &SamplerConfig,
    epoch: u64,
) -> Result<Vec<u32>, PlanError> {
    epoch_draws_mixed(languages, &Mix::default(), config, epoch)
}

/// [`epoch_draws`] for a training set: the same per cell (one language of one corpus, and of
/// one source with `source_temperature`; see [`Mix`]), a cell's permutations seeded with
/// [`quota_seed`]`(`[`cell_seed`]`(seed, corpus, source), l, c)`; languages in first-appearance
/// order, each with its cells in first-appearance order.
pub fn epoch_draws_mixed(
    languages: &[u16],
    mix: &Mix<'_>,
    config: &SamplerConfig,
    epoch: u64,
) -> Result<Vec<u32>, PlanError> {
    check_mix(languages.len(), mix, config)?;
    Ok(CellTable::build(languages, mix, config)?.draws(languages, mix, config, epoch))
}

/// Largest remainders: `exact` rounded down, the draws left (`total` less their sum) to the
/// largest fractional parts (ties to the earlier entry).
fn largest_remainder(exact: &[f64], total: u64) -> Vec<u64> {
    let mut q: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let left = total.saturating_sub(q.iter().sum());
    let mut by_fraction: Vec<usize> = (0..exact.len()).collect();
    by_fraction.sort_by(|&a, &b| {
        (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(a.cmp(&b))
    });
    for &k in by_fraction.iter().take(left as usize) {
        q[k] += 1;
    }
    q
}
