//! The epoch plan: batches packed from the epoch's utterances (or draws), cost-sorted and dealt
//! to ranks, trimmed to whole optimizer steps and shuffled per rank; its segments (one per
//! world size) and the state that resumes it exactly.

use serde::{Deserialize, Serialize};

use super::cells::{language_weights, CellTable};
use super::pack::pack;
use super::{check, check_mix, Durations, Mix, PlanError, SamplerConfig, SamplerMode, IDLE};
use crate::pyrandom::PyRandom;

/// One stretch of an epoch run with one world size and gradient accumulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// First optimizer step of the segment, counted from the start of the epoch.
    pub start_step: u64,
    /// Ranks.
    pub world_size: u32,
    /// Micro-batches per optimizer step.
    pub grad_accum: u32,
}

/// What a checkpoint stores to resume the sampler exactly: a few numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    /// Epoch.
    pub epoch: u64,
    /// Optimizer steps completed in this epoch.
    pub step: u64,
    /// The epoch's segments so far (at least one).
    pub segments: Vec<Segment>,
}

/// Slot layout of one segment: `world_size` rows of `slots` batch ids (or [`IDLE`]).
#[derive(Debug, Clone)]
struct SegmentPlan {
    seg: Segment,
    slots: usize,
    order: Vec<u32>,
}

impl SegmentPlan {
    fn row(&self, rank: u32) -> &[u32] {
        let r = rank as usize * self.slots;
        &self.order[r..r + self.slots]
    }

    fn steps(&self) -> u64 {
        (self.slots / self.seg.grad_accum as usize) as u64
    }
}

/// The plan of one epoch.
#[derive(Debug, Clone)]
pub struct EpochPlan {
    epoch: u64,
    config: SamplerConfig,
    /// Utterance indices of every batch, grouped by bucket in packing order.
    items: Vec<u32>,
    /// Where batch `id` (its rank in cost-descending order) starts in `items`, and its length.
    start: Vec<u64>,
    size: Vec<u32>,
    /// `len(batch) * longest duration`, descending.
    cost: Vec<f64>,
    /// Longest duration of each batch, seconds.
    longest: Vec<f64>,
    /// Bucket of each batch.
    bucket: Vec<u8>,
    segments: Vec<SegmentPlan>,
}

impl EpochPlan {
    /// Builds epoch `epoch`'s plan for `world_size` ranks accumulating `grad_accum` micro-batches
    /// per optimizer step. Cost: one pass to bucket, one random draw and one `powf` per
    /// utterance, one sort per bucket, one sort of the batches.
    pub fn build(
        durations: Durations<'_>,
        languages: &[u16],
        config: &SamplerConfig,
        epoch: u64,
        world_size: u32,
        grad_accum: u32,
    ) -> Result<EpochPlan, PlanError> {
        let mix = Mix::default();
        EpochPlan::build_mixed(durations, languages, &mix, config, epoch, world_size, grad_accum)
    }

    /// [`EpochPlan::build`] for a training set of several corpora (see [`Mix`]): the arrays are
    /// the corpora's, concatenated in order.
    pub fn build_mixed(
        durations: Durations<'_>,
        languages: &[u16],
        mix: &Mix<'_>,
        config: &SamplerConfig,
        epoch: u64,
        world_size: u32,
        grad_accum: u32,
    ) -> Result<EpochPlan, PlanError> {
        check(&durations, languages, config, world_size, grad_accum)?;
        check_mix(languages.len(), mix, config)?;
        let mut rng = PyRandom::new(config.seed.wrapping_add(epoch));
        let packed = match config.mode {
            SamplerMode::Seed => {
                let weights = language_weights(languages, config.temperature);
                let weight = |i: usize| weights[languages[i] as usize];
                pack(&durations, None, weight, config, &mut rng)
            }
            SamplerMode::Temperature => {
                let draws =
                    CellTable::build(languages, mix, config)?.draws(languages, mix, config, epoch);
                pack(&durations, Some(draws), |_| 1.0, config, &mut rng)
            }
        };

        // Sort batches by cost, descending; the sort is stable, as Python's is. Batches stay
        // where packing put them: only the small per-batch arrays are reordered.
        let n_batches = packed.start.len();
        let mut by_cost: Vec<(f64, u32)> = (0..n_batches)
            .map(|b| (f64::from(packed.size[b]) * packed.longest[b], b as u32))
            .collect();
        by_cost.sort_by(|a, b| b.0.total_cmp(&a.0));
        let pick = |b: &(f64, u32)| b.1 as usize;
        let start = by_cost.iter().map(|b| packed.start[pick(b)]).collect();
        let size = by_cost.iter().map(|b| packed.size[pick(b)]).collect();
        let longest = by_cost.iter().map(|b| packed.longest[pick(b)]).collect();
        let bucket = by_cost.iter().map(|b| packed.bucket[pick(b)]).collect();
        let cost = by_cost.iter().map(|b| b.0).collect();
        drop(by_cost);

        let mut plan = EpochPlan {
            epoch,
            config: config.clone(),
            items: packed.items,
            start,
            size,
            cost,
            longest,
            bucket,
            segments: Vec::new(),
        };
        let first = plan.deal_first(world_size, grad_accum, &mut rng);
        plan.segments.push(first);
        Ok(plan)
    }

    /// Rebuilds the plan a [`SamplerState`] describes (same input and config as the run that
    /// saved it).
    pub fn restore(
        durations: Durations<'_>,
        languages: &[u16],
        config: &SamplerConfig,
        state: &SamplerState,
    ) -> Result<EpochPlan, PlanError> {
        EpochPlan::restore_mixed(durations, languages, &Mix::default(), config, state)
    }

    /// [`EpochPlan::restore`] for a training set of several corpora.
    pub fn restore_mixed(
        durations: Durations<'_>,
        languages: &[u16],
        mix: &Mix<'_>,
        config: &SamplerConfig,
        state: &SamplerState,
    ) -> Result<EpochPlan, PlanError> {
        let first = state.segments.first().ok_or(PlanError::NoSegment)?;
        if first.start_step != 0 {
            return Err(PlanError::FirstSegmentStart(first.start_step));
        }
        let mut plan = EpochPlan::build_mixed(
            durations,
            languages,
            mix,
            config,
            state.epoch,
            first.world_size,
            first.grad_accum,
        )?;
        for s in &state.segments[1..] {
            plan.redeal(s.start_step, s.world_size, s.grad_accum)?;
        }
        if state.step > plan.steps() {
            return Err(PlanError::StepPastEpoch { step: state.step, steps: plan.steps() });
        }
        Ok(plan)
    }

    /// The seed's dealing: batches `r, r + W, ...` to rank r, truncated so every rank has the
    /// same count, trimmed to a multiple of the accumulation, one shuffle applied to every rank.
    fn deal_first(&self, world_size: u32, grad_accum: u32, rng: &mut PyRandom) -> SegmentPlan {
        let w = world_size as usize;
        let per_rank = self.len() / w;
        let slots =
            if grad_accum > 1 { per_rank - per_rank % grad_accum as usize } else { per_rank };
        // Every rank's list has the same length and Python shuffles each with the generator in
        // the same state, so one permutation serves all ranks.
        let mut perm: Vec<u32> = (0..slots as u32).collect();
        rng.shuffle(&mut perm);
        let mut order = Vec::with_capacity(w * slots);
        for r in 0..w {
            let start = order.len();
            order.extend(perm.iter().map(|&p| (p as usize * w + r) as u32));
            self.curriculum(&mut order[start..], grad_accum);
        }
        SegmentPlan { seg: Segment { start_step: 0, world_size, grad_accum }, slots, order }
    }

    /// Moves a rank's shortest batches to the front of its list, shortest first, for the
    /// configured number of steps; the other batches keep their shuffled order. Ranks' lists are
    /// interleaved from one cost ranking, so their k-th shortest batches are alike and steps stay
    /// balanced.
    fn curriculum(&self, row: &mut [u32], grad_accum: u32) {
        let n = (self.config.curriculum_steps.saturating_mul(u64::from(grad_accum)) as usize)
            .min(row.len());
        if n == 0 {
            return;
        }
        let mut by_len: Vec<(usize, u32)> = row.iter().copied().enumerate().collect();
        by_len.sort_by(|a, b| {
            self.longest[a.1 as usize].total_cmp(&self.longest[b.1 as usize]).then(a.0.cmp(&b.0))
        });
        let mut chosen = vec![false; row.len()];
        for &(pos, _) in &by_len[..n] {
            chosen[pos] = true;
        }
        let rest: Vec<u32> =
            row.iter().zip(&chosen).filter(|(_, &c)| !c).map(|(&b, _)| b).collect();
        for (slot, &(_, b)) in row.iter_mut().zip(&by_len[..n]) {
            *slot = b;
        }
        row[n..].copy_from_slice(&rest);
    }

    /// Re-deals the rest of the epoch from optimizer step `at_step` to `world_size` ranks
    /// accumulating `grad_accum` micro-batches: every batch the current segment had not consumed
    /// by then is dealt, in cost order, round robin to the new ranks, and one permutation drawn
    /// from `(seed, epoch, at_step)` orders every rank. Ranks left short at the end get [`IDLE`]
    /// slots, so no batch is dropped or repeated.
    pub fn redeal(
        &mut self,
        at_step: u64,
        world_size: u32,
        grad_accum: u32,
    ) -> Result<(), PlanError> {
        if world_size == 0 || grad_accum == 0 {
            return Err(PlanError::ZeroWorld { world_size, grad_accum });
        }
        let last = self.segments.last().ok_or(PlanError::NoSegment)?;
        let end = last.seg.start_step + last.steps();
        if at_step < last.seg.start_step || at_step > end {
            return Err(PlanError::StepOutsideSegment {
                step: at_step,
                start: last.seg.start_step,
                end,
            });
        }
        let consumed = ((at_step - last.seg.start_step) * u64::from(last.seg.grad_accum)) as usize;
        let mut remaining: Vec<u32> = (0..last.seg.world_size)
            .flat_map(|r| last.row(r)[consumed..].iter().copied())
            .filter(|&b| b != IDLE)
            .collect();
        remaining.sort_unstable();
        let w = world_size as usize;
        let per_rank = remaining.len().div_ceil(w);
        let slots = per_rank.div_ceil(grad_accum as usize) * grad_accum as usize;
        let mut perm: Vec<u32> = (0..slots as u32).collect();
        PyRandom::new(crate::rng::redeal_seed(self.config.seed, self.epoch, at_step))
            .shuffle(&mut perm);
        let mut order = Vec::with_capacity(w * slots);
        for r in 0..w {
            order.extend(
                perm.iter().map(|&p| remaining.get(p as usize * w + r).copied().unwrap_or(IDLE)),
            );
        }
        // The current segment now ends at `at_step`. (A re-deal at a segment's first step
        // leaves it with no slots; it stays in the list so the state replays the same calls.)
        if let Some(last) = self.segments.last_mut() {
            let rows: Vec<u32> =
                (0..last.seg.world_size).flat_map(|r| last.row(r)[..consumed].to_vec()).collect();
            last.order = rows;
            last.slots = consumed;
        }
        let seg = Segment { start_step: at_step, world_size, grad_accum };
        self.segments.push(SegmentPlan { seg, slots, order });
        Ok(())
    }

    /// The epoch number.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Number of batches formed (before truncation and trimming).
    pub fn len(&self) -> usize {
        self.start.len()
    }

    /// Whether no batch was formed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Utterance indices of batch `id` (ids are positions in cost-descending order).
    pub fn batch(&self, id: u32) -> &[u32] {
        let start = self.start[id as usize] as usize;
        &self.items[start..start + self.size[id as usize] as usize]
    }

    /// `len * longest duration` of batch `id`.
    pub fn cost(&self, id: u32) -> f64 {
        self.cost[id as usize]
    }

    /// Longest duration in batch `id`, seconds.
    pub fn longest(&self, id: u32) -> f64 {
        self.longest[id as usize]
    }

    /// Duration bucket of batch `id`.
    pub fn bucket(&self, id: u32) -> usize {
        self.bucket[id as usize] as usize
    }

    /// Optimizer steps in the epoch.
    pub fn steps(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.seg.start_step + s.steps())
    }

    /// The segments so far.
    pub fn segments(&self) -> Vec<Segment> {
        self.segments.iter().map(|s| s.seg).collect()
    }

    /// The state to save after `step` optimizer steps of this epoch.
    pub fn state(&self, step: u64) -> SamplerState {
        SamplerState { epoch: self.epoch, step, segments: self.segments() }
    }

    fn segment_at(&self, step: u64) -> Option<&SegmentPlan> {
        self.segments
            .iter()
            .rev()
            .find(|s| s.seg.start_step <= step && step < s.seg.start_step + s.steps())
    }

    /// World size and accumulation in force at `step`, or `None` past the end of the epoch.
    pub fn layout_at(&self, step: u64) -> Option<Segment> {
        self.segment_at(step).map(|s| s.seg)
    }

    /// Batch ids rank `rank` runs at optimizer step `step`: `grad_accum` entries, [`IDLE`] for
    /// an idle slot. Empty past the end of the epoch or for a rank outside the world.
    pub fn step_batches(&self, step: u64, rank: u32) -> &[u32] {
        match self.segment_at(step) {
            Some(s) if rank < s.seg.world_size => {
                let g = s.seg.grad_accum as usize;
                let k = (step - s.seg.start_step) as usize;
                &s.row(rank)[k * g..(k + 1) * g]
            }
            _ => &[],
        }
    }

    /// Every batch id rank `rank` runs from step `from` to the end of the epoch, in order.
    pub fn rank_batches(&self, rank: u32, from: u64) -> Vec<u32> {
        (from..self.steps()).flat_map(|s| self.step_batches(s, rank).to_vec()).collect()
    }
}
