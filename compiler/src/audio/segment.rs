//! A segment of a longer recording: an offset and a duration in seconds, cut from the decoded
//! samples at the recording's own rate (before resampling), exact to the sample.
//!
//! Sample `round(offset * rate)` is the first one; `round(duration * rate)` samples are taken.
//! Manifests write durations rounded (NeMo's scripts to 2-3 decimals, Kaldi's `segments` to
//! 2), so an end up to [`END_SLACK`] seconds past the recording's last sample is cut at that
//! sample; further is a `segment_beyond_end` reject, as is an offset at or past the end.

use super::pcm::Reject;

/// How far past the end of a recording a segment's end may claim to be and still be cut at the
/// end: half of the last digit of a duration written with two decimals, and then some.
pub const END_SLACK: f64 = 0.01;

/// Where a segment lies in its recording, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Segment {
    /// Start, seconds from the start of the recording.
    pub offset: f64,
    /// Length in seconds; `None`: to the end of the recording.
    pub duration: Option<f64>,
}

impl Segment {
    /// The sample range `[first, end)` of a recording of `len` samples at `rate`, or why there
    /// is none.
    pub fn range(&self, len: usize, rate: u32) -> Result<std::ops::Range<usize>, Reject> {
        let r = f64::from(rate);
        let bad = |what: &str| {
            Reject::SegmentBeyondEnd(format!(
                "{what} (offset {} s, duration {}, recording {:.6} s = {len} samples at {rate} Hz)",
                self.offset,
                self.duration.map_or("to the end".into(), |d| format!("{d} s")),
                len as f64 / r
            ))
        };
        if !(self.offset.is_finite() && self.offset >= 0.0) {
            return Err(bad("the offset is negative or not a number"));
        }
        let first = (self.offset * r).round();
        if first >= len as f64 {
            return Err(bad("the segment starts at or after the end of the recording"));
        }
        let first = first as usize;
        let Some(duration) = self.duration else {
            return Ok(first..len);
        };
        if !(duration.is_finite() && duration > 0.0) {
            return Err(bad("the duration is not a positive number"));
        }
        let end = first as f64 + (duration * r).round();
        if end > len as f64 + END_SLACK * r {
            return Err(bad("the segment ends more than 10 ms after the recording"));
        }
        Ok(first..(end as usize).min(len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(offset: f64, duration: Option<f64>) -> Segment {
        Segment { offset, duration }
    }

    #[test]
    fn cuts_are_exact_to_the_sample() {
        assert_eq!(seg(0.5, Some(0.6)).range(48_000, 16_000).unwrap(), 8_000..17_600);
        assert_eq!(seg(0.0, None).range(100, 16_000).unwrap(), 0..100);
        // 10 ms past the end at 16 kHz is 160 samples: cut at the end.
        assert_eq!(seg(1.0, Some(2.01)).range(48_000, 16_000).unwrap(), 16_000..48_000);
    }

    #[test]
    fn beyond_the_end_is_refused() {
        let r = |s: Segment| s.range(48_000, 16_000).unwrap_err();
        for s in [seg(3.0, Some(0.1)), seg(1.0, Some(2.02)), seg(-0.1, None), seg(0.0, Some(0.0))] {
            assert!(matches!(r(s), Reject::SegmentBeyondEnd(_)), "{s:?}");
        }
    }
}
