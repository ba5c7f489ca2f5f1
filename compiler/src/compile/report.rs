//! The compile report: a JSON summary and a JSON-lines record of every dropped, retagged or
//! flagged row.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::inputs::AudioRef;
use crate::lang::Method;
use crate::manifest::ManifestRow;
pub use crate::reason::{Kind, Reason};

/// A language change, as recorded for a retagged row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Retag {
    /// Normalised label.
    pub from: String,
    /// Language the row got.
    pub to: String,
    /// How the language was decided.
    pub method: Method,
    /// Confidence of the evidence in [0, 1].
    pub confidence: f64,
}

/// One line of the JSON-lines file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// Row number in the input, from 0 (over all shards for the raw shard layout).
    pub row: u64,
    /// Segment id, if the row has one.
    pub segment_id: Option<String>,
    /// Shard id, if the row has one.
    pub shard_id: Option<String>,
    /// Dropped, retagged or flagged.
    pub kind: Kind,
    /// Machine-readable reason (README.md's reason table lists them).
    pub reason: Reason,
    /// Human-readable detail.
    pub detail: String,
    /// The audio file (or the archive holding it), where one is involved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// The archive member holding the audio, for a tarred input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// Where the row was read (`FILE:LINE`, `ARCHIVE:KEY`), for the layouts that are not
    /// parquet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// The language change, for a retagged row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retag: Option<Retag>,
}

impl Entry {
    /// An entry for `row`, of the reason's kind, with no file and no retag.
    pub(crate) fn new(row: &ManifestRow, reason: Reason, detail: String) -> Entry {
        Entry {
            row: row.row,
            segment_id: row.segment_id.clone(),
            shard_id: row.shard_id.clone(),
            kind: reason.kind(),
            reason,
            detail,
            file: None,
            member: None,
            origin: row.origin.clone(),
            retag: None,
        }
    }

    /// The entry naming `audio`'s file (or archive) and member.
    pub(crate) fn with_audio(mut self, audio: &AudioRef) -> Entry {
        self.file = audio.file().map(Path::to_path_buf);
        self.member = audio.member().map(str::to_owned);
        self
    }
}

/// CPU seconds spent in each stage, summed over worker threads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageSeconds {
    /// Reading the manifest or shard tables.
    pub read_input: f64,
    /// Deduplication, cleaning and language decisions (one thread).
    pub text_and_language: f64,
    /// Reading and decoding FLAC, downmixing.
    pub decode: f64,
    /// Resampling to 16 kHz and conversion to 16-bit.
    pub resample: f64,
    /// SentencePiece.
    pub tokenize: f64,
    /// Hashing PCM for audio deduplication.
    pub hash: f64,
    /// Appending to the corpus and finishing it (one thread).
    pub write: f64,
}

/// The JSON summary (`<corpus>.report.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The input, as given.
    pub input: String,
    /// The corpus written.
    pub output: String,
    /// Rows read.
    pub rows: u64,
    /// Rows in the corpus.
    pub kept: u64,
    /// Rows not in the corpus.
    pub dropped: u64,
    /// Dropped rows per reason.
    pub dropped_by_reason: BTreeMap<Reason, u64>,
    /// Kept rows with a flag, per reason.
    pub flagged_by_reason: BTreeMap<Reason, u64>,
    /// Kept rows whose language differs from their label.
    pub retagged: u64,
    /// Retags per `from->to` pair.
    pub retags: BTreeMap<String, u64>,
    /// Retags per method.
    pub retags_by_method: BTreeMap<Method, u64>,
    /// Token sequences cut at the limit.
    pub truncated: u64,
    /// Hours per (normalised) label over every row read, as the input's durations claim.
    pub hours_before: BTreeMap<String, f64>,
    /// Hours per final language in the corpus, from the decoded audio.
    pub hours_after: BTreeMap<String, f64>,
    /// Hours of audio decoded (kept or not).
    pub decoded_hours: f64,
    /// Corpus file size in bytes.
    pub corpus_bytes: u64,
    /// Wall-clock seconds of the whole compile.
    pub wall_seconds: f64,
    /// Worker threads.
    pub jobs: usize,
    /// Decoded audio seconds per wall second.
    pub realtime_factor: f64,
    /// Decoded audio seconds per wall second per worker thread.
    pub realtime_factor_per_job: f64,
    /// Where the time went.
    pub stage_seconds: StageSeconds,
    /// The JSON-lines file listing every dropped, retagged or flagged row.
    pub entries_file: String,
    /// Parts merged into this corpus (`asrc merge`); absent for one compile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<u32>,
}

impl Summary {
    /// Dropped rows as a fraction of rows read (0 for an empty input).
    pub fn reject_fraction(&self) -> f64 {
        if self.rows == 0 {
            0.0
        } else {
            self.dropped as f64 / self.rows as f64
        }
    }

    /// Adds another compile's counts, hours and times to these (`asrc merge` sums its parts'
    /// reports this way). What does not add up is kept from `self`: the input, the output and
    /// its entries file, the corpus size and the worker count; the real-time factors are
    /// recomputed over the summed wall time.
    pub fn add(&mut self, other: &Summary) {
        fn add_map<K: Ord + Clone, V: Copy + std::ops::AddAssign + Default>(
            a: &mut BTreeMap<K, V>,
            b: &BTreeMap<K, V>,
        ) {
            for (k, v) in b {
                *a.entry(k.clone()).or_default() += *v;
            }
        }
        self.rows += other.rows;
        self.kept += other.kept;
        self.dropped += other.dropped;
        add_map(&mut self.dropped_by_reason, &other.dropped_by_reason);
        add_map(&mut self.flagged_by_reason, &other.flagged_by_reason);
        self.retagged += other.retagged;
        add_map(&mut self.retags, &other.retags);
        add_map(&mut self.retags_by_method, &other.retags_by_method);
        self.truncated += other.truncated;
        add_map(&mut self.hours_before, &other.hours_before);
        add_map(&mut self.hours_after, &other.hours_after);
        self.decoded_hours += other.decoded_hours;
        self.wall_seconds += other.wall_seconds;
        let (s, o) = (&mut self.stage_seconds, &other.stage_seconds);
        s.read_input += o.read_input;
        s.text_and_language += o.text_and_language;
        s.decode += o.decode;
        s.resample += o.resample;
        s.tokenize += o.tokenize;
        s.hash += o.hash;
        s.write += o.write;
        self.set_realtime_factors();
    }

    /// Records a row that a later stage dropped after it was counted as kept (`asrc merge`'s
    /// duplicate audio across parts): `hours` of `language` leave the corpus.
    pub fn drop_kept(&mut self, reason: Reason, language: &str, hours: f64) {
        self.kept -= 1;
        self.dropped += 1;
        *self.dropped_by_reason.entry(reason).or_default() += 1;
        *self.hours_after.entry(language.to_owned()).or_default() -= hours;
    }

    /// The real-time factors of the decoded hours over the wall time.
    pub fn set_realtime_factors(&mut self) {
        let audio = self.decoded_hours * 3600.0;
        self.realtime_factor = audio / self.wall_seconds.max(1e-9);
        self.realtime_factor_per_job = self.realtime_factor / self.jobs.max(1) as f64;
    }

    /// Records an entry's counts (not its line).
    pub(crate) fn count(&mut self, e: &Entry) {
        match e.kind {
            Kind::Dropped => {
                self.dropped += 1;
                *self.dropped_by_reason.entry(e.reason).or_default() += 1;
            }
            Kind::Flagged => {
                *self.flagged_by_reason.entry(e.reason).or_default() += 1;
            }
            Kind::Retagged => {
                self.retagged += 1;
                if let Some(r) = &e.retag {
                    *self.retags.entry(format!("{}->{}", r.from, r.to)).or_default() += 1;
                    *self.retags_by_method.entry(r.method).or_default() += 1;
                }
            }
        }
    }
}

/// Writes entries as JSON lines.
pub(crate) struct EntryWriter {
    out: std::io::BufWriter<std::fs::File>,
}

impl EntryWriter {
    pub(crate) fn create(path: &std::path::Path) -> std::io::Result<EntryWriter> {
        Ok(EntryWriter { out: std::io::BufWriter::new(std::fs::File::create(path)?) })
    }

    pub(crate) fn write(&mut self, e: &Entry) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.out, e)?;
        self.out.write_all(b"\n")
    }

    pub(crate) fn finish(mut self) -> std::io::Result<()> {
        self.out.flush()?;
        self.out.get_ref().sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(rows: u64, dropped: u64, lang: &str, hours: f64, wall: f64) -> Summary {
        Summary {
            input: "in.parquet".into(),
            output: "p.asrcorpus".into(),
            rows,
            kept: rows - dropped,
            dropped,
            dropped_by_reason: [(Reason::DuplicateRow, dropped)].into(),
            hours_before: [(lang.to_owned(), hours)].into(),
            hours_after: [(lang.to_owned(), hours)].into(),
            decoded_hours: hours,
            wall_seconds: wall,
            jobs: 2,
            stage_seconds: StageSeconds { decode: wall, ..StageSeconds::default() },
            ..Summary::default()
        }
    }

    #[test]
    fn summaries_add_counts_hours_and_times_and_keep_what_does_not_add_up() {
        let mut a = part(10, 1, "en", 0.5, 2.0);
        a.add(&part(6, 2, "de", 0.25, 1.0));
        a.add(&part(4, 0, "en", 0.25, 1.0));
        assert_eq!((a.rows, a.kept, a.dropped), (20, 17, 3));
        assert_eq!(a.dropped_by_reason[&Reason::DuplicateRow], 3);
        assert_eq!(a.hours_after["en"], 0.75);
        assert_eq!(a.hours_before["de"], 0.25);
        assert_eq!((a.decoded_hours, a.wall_seconds, a.stage_seconds.decode), (1.0, 4.0, 4.0));
        assert_eq!((a.input.as_str(), a.jobs), ("in.parquet", 2));
        assert_eq!(a.realtime_factor, 3600.0 / 4.0);
        assert_eq!(a.realtime_factor_per_job, 3600.0 / 8.0);
        a.drop_kept(Reason::DuplicateAudio, "en", 0.25);
        assert_eq!((a.kept, a.dropped, a.hours_after["en"]), (16, 4, 0.5));
        assert_eq!(a.dropped_by_reason[&Reason::DuplicateAudio], 1);
        // A report read back from its JSON adds the same.
        let back: Summary = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(back, a);
    }
}
