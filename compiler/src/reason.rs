//! Why the compile report lists a row: every reason a row is dropped, retagged or flagged, and
//! what happens to the row. README.md's reason table lists exactly these (a test checks it).

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// What happened to a row that the report lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Not in the corpus.
    Dropped,
    /// In the corpus under another language than its label.
    Retagged,
    /// In the corpus, with something worth a look.
    Flagged,
}

/// Declares [`Reason`] with its name (the serde name, checked by a test), its kind and the list
/// of every variant, from one table.
macro_rules! reasons {
    ($($(#[doc = $doc:literal])+ $variant:ident = $name:literal, $kind:ident;)+) => {
        /// Why a row is in the report. Serialized (and counted in the summary) by its
        /// [`name`](Reason::name); ordered by name, as the report lists its counts.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Reason {
            $($(#[doc = $doc])+ $variant,)+
        }

        impl Reason {
            /// Every reason, in declaration order.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant),+];

            /// The reason's name, as the report writes it.
            pub fn name(self) -> &'static str {
                match self {
                    $(Reason::$variant => $name,)+
                }
            }

            /// What happens to a row for this reason.
            pub fn kind(self) -> Kind {
                match self {
                    $(Reason::$variant => Kind::$kind,)+
                }
            }
        }
    };
}

reasons! {
    /// Segment id null or empty.
    NullSegmentId = "null_segment_id", Dropped;
    /// Every field equals an earlier row's.
    DuplicateRow = "duplicate_row", Dropped;
    /// An earlier row used the segment id with other content.
    ReusedSegmentId = "reused_segment_id", Dropped;
    /// Claimed duration outside the duration filter (or null while one is set).
    FilteredDuration = "filtered_duration", Dropped;
    /// Quality score below the quality filter.
    FilteredQuality = "filtered_quality", Dropped;
    /// No transcript.
    NullText = "null_text", Dropped;
    /// Nothing left of the transcript after cleaning.
    EmptyText = "empty_text", Dropped;
    /// No label and no script that decides one.
    NoLanguage = "no_language", Dropped;
    /// A shard metadata row without an audio index row.
    NoAudioIndex = "no_audio_index", Dropped;
    /// No file name, or the file cannot be read.
    MissingFile = "missing_file", Dropped;
    /// An input line or entry that cannot be read (malformed JSON, a Kaldi line without its
    /// fields, a field of the wrong type).
    MalformedLine = "malformed_line", Dropped;
    /// A `cmd |` pipe entry in a Kaldi `wav.scp` (not run unless asked for).
    PipeRefused = "pipe_refused", Dropped;
    /// The tar archive has no member of that name.
    MissingMember = "missing_member", Dropped;
    /// Bytes of no codec asrc decodes (MP4/AAC, Ogg FLAC, unknown).
    UnsupportedCodec = "unsupported_codec", Dropped;
    /// A WAV, MP3, Vorbis or Opus stream is damaged.
    CorruptAudio = "corrupt_audio", Dropped;
    /// A WAV, MP3, Vorbis or Opus stream ends before its headers say it does.
    TruncatedAudio = "truncated_audio", Dropped;
    /// A segment's offset and duration reach beyond the end of its recording.
    SegmentBeyondEnd = "segment_beyond_end", Dropped;
    /// A frame fails to decode, or the headers are invalid.
    CorruptFlac = "corrupt_flac", Dropped;
    /// The stream ends before the sample count its header announces.
    TruncatedFlac = "truncated_flac", Dropped;
    /// Nothing decoded.
    NoSamples = "no_samples", Dropped;
    /// A bit depth the chosen decoder cannot read, or an unusable rate.
    UnsupportedAudio = "unsupported_audio", Dropped;
    /// The sample rate, channel count or bit depth changes between frames.
    FormatChange = "format_change", Dropped;
    /// Decoded 16 kHz samples identical to an earlier kept row's.
    DuplicateAudio = "duplicate_audio", Dropped;
    /// SentencePiece refuses the text.
    TokenizeError = "tokenize_error", Dropped;
    /// The utterance exceeds a format limit.
    Unstorable = "unstorable", Dropped;
    /// The transcript's script or language identification changed the label.
    Retagged = "retagged", Retagged;
    /// The label is not a language this compiler knows (kept, lower-cased).
    UnknownLanguage = "unknown_language", Flagged;
    /// The text's `<|xx|>` tag and the `lang` column disagree (the column wins).
    TagMismatch = "tag_mismatch", Flagged;
    /// Claimed and decoded durations differ by more than the tolerance.
    DurationMismatch = "duration_mismatch", Flagged;
    /// More tokens than the limit; cut.
    TruncatedTokens = "truncated_tokens", Flagged;
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

impl Ord for Reason {
    fn cmp(&self, other: &Reason) -> Ordering {
        self.name().cmp(other.name())
    }
}

impl PartialOrd for Reason {
    fn partial_cmp(&self, other: &Reason) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_serialized_names_and_unique() {
        let mut names = Vec::new();
        for &r in Reason::ALL {
            assert_eq!(serde_json::to_value(r).unwrap(), r.name(), "{r:?}");
            assert_eq!(r.to_string(), r.name());
            assert_eq!(format!("{r:<20}|"), format!("{:<20}|", r.name()), "padded as a str");
            names.push(r.name());
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len());
    }

    /// README.md's reason table: `(name, kind)` for every name in its first column.
    fn readme_table() -> Vec<(String, String)> {
        let path = std::path::Path::new(
            &std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
        )
        .join("../README.md");
        let readme = std::fs::read_to_string(&path).unwrap();
        let rows: Vec<&str> = readme
            .lines()
            .skip_while(|l| l.replace(' ', "") != "|reason|kind|when|")
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .collect();
        assert!(!rows.is_empty(), "no `| reason | kind | when |` table in {}", path.display());
        let mut table = Vec::new();
        for row in rows {
            let cells: Vec<&str> = row.split(" | ").map(|c| c.trim_matches(['|', ' '])).collect();
            let (names, kind) = (cells[0], cells[1]);
            for name in names.split(" / ") {
                let name = name.strip_prefix('`').and_then(|n| n.strip_suffix('`'));
                let name = name.unwrap_or_else(|| panic!("README reason cell {names:?}"));
                table.push((name.to_owned(), kind.to_owned()));
            }
        }
        table
    }

    #[test]
    fn readme_lists_every_reason_once_with_its_kind() {
        let mut readme = readme_table();
        readme.sort();
        let mut ours: Vec<(String, String)> = Reason::ALL
            .iter()
            .map(|r| {
                let kind = serde_json::to_value(r.kind()).unwrap();
                (r.name().to_owned(), kind.as_str().unwrap().to_owned())
            })
            .collect();
        ours.sort();
        assert_eq!(readme, ours, "README.md's reason table against Reason");
    }

    #[test]
    fn reasons_order_by_name() {
        let mut by_enum = Reason::ALL.to_vec();
        by_enum.sort();
        let mut by_name: Vec<&str> = Reason::ALL.iter().map(|r| r.name()).collect();
        by_name.sort_unstable();
        assert_eq!(by_enum.iter().map(|r| r.name()).collect::<Vec<_>>(), by_name);
    }
}
