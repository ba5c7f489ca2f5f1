//! Bucketing, weighted random order and greedy packing of an epoch's utterances into batches.

use super::{Durations, SamplerConfig};
use crate::pyrandom::PyRandom;

/// Batches in creation order, as packing makes them.
pub(super) struct Packed {
    /// Utterances grouped by bucket, each bucket in key order.
    pub(super) items: Vec<u32>,
    /// Start and length of each batch in `items`.
    pub(super) start: Vec<u64>,
    pub(super) size: Vec<u32>,
    pub(super) bucket: Vec<u8>,
    /// Longest duration of each batch.
    pub(super) longest: Vec<f64>,
}

/// Buckets, orders (by a random key weighted with `weight(utterance)`) and packs every utterance
/// once, or with `draws`, the utterances drawn (an utterance drawn twice is packed twice).
pub(super) fn pack(
    durations: &Durations<'_>,
    draws: Option<Vec<u32>>,
    weight: impl Fn(usize) -> f64,
    config: &SamplerConfig,
    rng: &mut PyRandom,
) -> Packed {
    let n = draws.as_ref().map_or(durations.len(), Vec::len);
    let id = |k: usize| draws.as_ref().map_or(k as u32, |d| d[k]);
    let nb = config.boundaries.len() + 1;
    let bucket_of = |d: f64| config.boundaries.partition_point(|&b| b <= d);
    // Counting sort of utterances by bucket, draw order kept inside each bucket.
    let mut counts = vec![0usize; nb];
    let mut first_seen: Vec<usize> = Vec::new();
    let mut b_of = Vec::with_capacity(n);
    for k in 0..n {
        let b = bucket_of(durations.get(id(k) as usize));
        if counts[b] == 0 {
            first_seen.push(b);
        }
        counts[b] += 1;
        b_of.push(b as u8);
    }
    let mut start = vec![0usize; nb + 1];
    for b in 0..nb {
        start[b + 1] = start[b] + counts[b];
    }
    let mut items = vec![0u32; n];
    let mut fill = start.clone();
    for (k, &b) in b_of.iter().enumerate() {
        items[fill[b as usize]] = id(k);
        fill[b as usize] += 1;
    }
    drop(b_of);
    // `items` holds the draws now: their list is not needed during the packing's peak.
    drop(draws);

    let mut batch_start = Vec::new();
    let mut batch_size = Vec::new();
    let mut batch_bucket = Vec::new();
    let mut longest = Vec::new();
    let mut keyed: Vec<u128> = Vec::new();
    // Gather buffer: durations are read in key order a chunk at a time, as independent loads
    // that overlap in the memory system (loads interleaved with the packing decisions would not).
    const CHUNK: usize = 4096;
    let mut ds = [0f64; CHUNK];
    // Buckets in first-appearance order: Python iterates a dict filled in index order.
    for &b in &first_seen {
        let region = start[b]..start[b + 1];
        keyed.clear();
        keyed.reserve(region.len());
        for &i in &items[region.clone()] {
            let w = weight(i as usize).max(1e-12);
            let key = rng.random().powf(1.0 / w);
            // Non-negative floats order like their bit patterns; (key, index) descending is
            // Python's `sort(reverse=True)` on (key, index) tuples.
            keyed.push((u128::from(key.to_bits()) << 32) | u128::from(i));
        }
        keyed.sort_unstable_by(|a, b| b.cmp(a));
        // The bucket's region of `items` is rewritten in key order, batch after batch.
        let mut pos = region.start;
        let mut open_at = pos;
        let mut batch_seconds = 0.0f64;
        let mut batch_longest = f64::MIN;
        for chunk in keyed.chunks(CHUNK) {
            for (d, &k) in ds.iter_mut().zip(chunk) {
                *d = durations.get(k as u32 as usize);
            }
            for (&k, &d) in chunk.iter().zip(&ds) {
                if batch_seconds + d > config.max_batch_seconds && pos > open_at {
                    batch_start.push(open_at as u64);
                    batch_size.push((pos - open_at) as u32);
                    batch_bucket.push(b as u8);
                    longest.push(batch_longest);
                    open_at = pos;
                    batch_seconds = 0.0;
                    batch_longest = f64::MIN;
                }
                items[pos] = k as u32;
                pos += 1;
                batch_seconds += d;
                batch_longest = batch_longest.max(d);
            }
        }
        if pos > open_at {
            batch_start.push(open_at as u64);
            batch_size.push((pos - open_at) as u32);
            batch_bucket.push(b as u8);
            longest.push(batch_longest);
        }
    }
    Packed { items, start: batch_start, size: batch_size, bucket: batch_bucket, longest }
}
