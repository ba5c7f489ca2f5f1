//! Every random number of a training run, and where it comes from.
//!
//! A run's randomness is a pure function of its seed and of counters that checkpoints hold, so a
//! resumed run repeats the uninterrupted one bit for bit. Each use draws from its own stream,
//! named by a [`Stream`] and derived from `(seed, stream, counter)` by [`derive`]; the generator
//! itself is SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
//! OOPSLA 2014), small, fast and identical on every platform.
//!
//! | stream | counter | used for |
//! |---|---|---|
//! | `Init` | none | initial weights (`TdtModel::new` seeds Burn's generator with it) |
//! | `Backend` | micro-batch | Burn's generator before each micro-batch (dropout) |
//! | `Dither` | micro-batch | the front end's dither noise |
//! | `SpecAugment` | micro-batch | frequency and time masks |
//! | `LossBranch` | loss call | whether a loss call takes the RNN-T branch (`omega`) |
//! | `Redeal` | (epoch, step) | the permutation of a re-deal to a new world size |
//!
//! The batch plan's own shuffles use CPython's `random.Random` (`data/pyrandom.rs`) so that plans
//! equal the Python sampler's; that generator is seeded from `(seed + epoch)` as Python's is.

/// A small, fast, portable pseudo-random generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

/// SplitMix64's increment (the golden ratio in 64 bits); also spreads counters over the seed.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    /// A generator started at `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        finalize(self.0)
    }

    /// Uniform in `[0, 1)`, 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n`; 0 when `n` is 0. (Modulo bias is below 2^-40 for the sizes used here.)
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

/// SplitMix64's output function (a bijection of 64-bit words).
fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The purposes random numbers serve in a run, each an independent stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Initial weights.
    Init,
    /// Burn's backend generator, reseeded per micro-batch (dropout).
    Backend,
    /// Dither noise of the front end, per micro-batch.
    Dither,
    /// SpecAugment masks, per micro-batch.
    SpecAugment,
    /// The TDT loss's choice of the RNN-T branch, per loss call.
    LossBranch,
}

impl Stream {
    /// What is mixed into the seed to separate this stream from the others. The values are the
    /// ones the first trainer used, kept so that runs repeat across versions.
    fn salt(self) -> u64 {
        match self {
            Stream::Init | Stream::Backend => 0,
            Stream::Dither => 0xd1e5,
            Stream::SpecAugment => 0x5eca,
            Stream::LossBranch => LOSS_SALT,
        }
    }
}

/// The loss's stream seed: `derive(seed, Backend, 1)`, as the first trainer had it.
const LOSS_SALT: u64 = 1;

/// The seed of draw `counter` of `stream` in a run seeded with `seed`.
pub fn derive(seed: u64, stream: Stream, counter: u64) -> u64 {
    match stream {
        // One draw per run: the counter slot is fixed at the top of the range, out of reach of
        // any micro-batch count.
        Stream::Init => mix(seed, u64::MAX),
        // The loss branch stream: a per-run seed, then one generator per call.
        Stream::LossBranch => mix(seed, LOSS_SALT) ^ counter.wrapping_mul(GOLDEN),
        _ => mix(seed ^ stream.salt(), counter),
    }
}

/// A generator for draw `counter` of `stream`.
pub fn stream(seed: u64, stream: Stream, counter: u64) -> SplitMix64 {
    SplitMix64::new(derive(seed, stream, counter))
}

/// A 64-bit mix of a seed and a counter.
fn mix(seed: u64, counter: u64) -> u64 {
    SplitMix64::new(seed ^ counter.wrapping_mul(GOLDEN)).next_u64()
}

/// The seed of the `cycle`-th permutation of language `language`'s utterances, from which the
/// temperature sampler takes each epoch's quota (`sampler.mode = "temperature"`).
pub fn quota_seed(seed: u64, language: u16, cycle: u64) -> u64 {
    finalize(
        seed ^ 0x51A3_9E0B_7C4D_2F61
            ^ u64::from(language).wrapping_mul(0xD1B5_4A32_D192_ED03)
            ^ cycle.wrapping_mul(GOLDEN),
    )
}

/// The seed a quota cell's permutations start from (`seed` itself for corpus 0's cells of source
/// 0, so that a training set of one corpus draws as that corpus alone does): a cell is one
/// language of one corpus of a training set and, with per-source quotas, of one source.
pub fn cell_seed(seed: u64, corpus: u16, source: u16) -> u64 {
    if corpus == 0 && source == 0 {
        return seed;
    }
    finalize(
        seed ^ 0x2C1B_3C6D_E5A7_F019
            ^ (u64::from(corpus) << 16 | u64::from(source)).wrapping_mul(0x9FB2_1C65_1E98_DF25),
    )
}

/// The sort key of the `k`-th utterance of a language in the permutation seeded with `cycle_seed`
/// (from [`quota_seed`]): the permutation is the order of these keys (ties broken by `k`).
pub fn quota_key(cycle_seed: u64, k: u64) -> u32 {
    (finalize(cycle_seed.wrapping_add(k.wrapping_add(1).wrapping_mul(GOLDEN))) >> 32) as u32
}

/// The seed of the permutation of a re-deal at optimizer step `step` of `epoch` (a 63-bit value:
/// the permutation takes a Python-compatible seed).
pub fn redeal_seed(seed: u64, epoch: u64, step: u64) -> u64 {
    finalize(seed ^ epoch.wrapping_mul(GOLDEN) ^ step.wrapping_mul(0xD1B5_4A32_D192_ED03)) >> 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_published_reference() {
        // Reference values of Vigna's splitmix64.c seeded with 1234567.
        let mut r = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..5).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423,
                4_593_380_528_125_082_431,
                16_408_922_859_458_223_821,
            ]
        );
    }

    #[test]
    fn streams_differ_from_each_other_and_over_counters() {
        let all = [Stream::Backend, Stream::Dither, Stream::SpecAugment, Stream::LossBranch];
        let mut seen = std::collections::HashSet::from([derive(7, Stream::Init, 0)]);
        for s in all {
            for c in 2..50 {
                assert!(seen.insert(derive(7, s, c)), "{s:?} {c}");
            }
        }
    }
}
