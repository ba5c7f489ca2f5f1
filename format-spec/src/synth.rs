//! Deterministic synthetic utterances, for tests, examples and benchmarks that need a corpus
//! without a compiler run: tones with a little noise, random token ids, several languages.
//!
//! The same `(seed, index)` always gives the same utterance, on every platform.

use crate::write::UtteranceIn;

/// A small, fast, portable pseudo-random generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator started at `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// One synthetic utterance, owning its data.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthUtterance {
    /// `"{prefix}-{index:08}"`.
    pub segment_id: String,
    /// A few pseudo-words.
    pub text: String,
    /// One of the configured languages.
    pub language: String,
    /// One of the configured sources.
    pub source: String,
    /// A tone with noise.
    pub pcm: Vec<i16>,
    /// Random ids below the vocabulary size.
    pub tokens: Vec<u32>,
}

impl SynthUtterance {
    /// Borrows the utterance in the writer's input form.
    pub fn as_input(&self) -> UtteranceIn<'_> {
        UtteranceIn {
            segment_id: &self.segment_id,
            text: &self.text,
            language: &self.language,
            source: &self.source,
            pcm: &self.pcm,
            tokens: &self.tokens,
        }
    }
}

/// Parameters of a synthetic corpus.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    /// Seed of every random choice.
    pub seed: u64,
    /// Language codes; utterance i's language is drawn with Zipf-like weights 1/(rank+1).
    pub languages: Vec<String>,
    /// Source names, drawn uniformly.
    pub sources: Vec<String>,
    /// Shortest utterance in samples (>= 1).
    pub min_samples: u32,
    /// Longest utterance in samples.
    pub max_samples: u32,
    /// Token ids are drawn below this.
    pub vocab_size: u32,
    /// Most tokens per utterance.
    pub max_tokens: u32,
}

impl Default for SynthSpec {
    fn default() -> SynthSpec {
        SynthSpec {
            seed: 1,
            languages: ["en", "hi", "ta", "bn"].map(String::from).to_vec(),
            sources: ["read", "conversational"].map(String::from).to_vec(),
            min_samples: 1_600,
            max_samples: 16_000,
            vocab_size: 1024,
            max_tokens: 24,
        }
    }
}

const WORDS: [&str; 12] = [
    "alpha",
    "nadi",
    "surya",
    "maram",
    "jal",
    "ghar",
    "kaal",
    "vaan",
    "boli",
    "नमस्ते",
    "வணக்கம்",
    "শব্দ",
];

impl SynthSpec {
    /// Writes utterances `0..n` as a corpus at `path`, tokenized (as the header records it) by
    /// a SentencePiece model whose bytes are `model`.
    pub fn write_corpus(
        &self,
        path: &std::path::Path,
        n: u64,
        model: &[u8],
    ) -> Result<(), crate::WriteError> {
        let opts = crate::WriterOptions::new(self.vocab_size, "sentencepiece", model.to_vec());
        let mut w = crate::CorpusWriter::create(path, opts)?;
        for i in 0..n {
            w.push(&self.utterance(i).as_input())?;
        }
        w.finish()?;
        Ok(())
    }

    /// Utterance `index` of the corpus this spec describes.
    pub fn utterance(&self, index: u64) -> SynthUtterance {
        let mut rng = SplitMix64::new(self.seed ^ index.wrapping_mul(0xA076_1D64_78BD_642F));
        let span = u64::from(self.max_samples.saturating_sub(self.min_samples)) + 1;
        let n = self.min_samples.max(1) as u64 + rng.below(span);
        let freq = 100.0 + 700.0 * rng.next_f64();
        let amp = 2000.0 + 12000.0 * rng.next_f64();
        let pcm = (0..n)
            .map(|t| {
                let tone = (2.0 * std::f64::consts::PI * freq * t as f64 / 16_000.0).sin();
                let noise = rng.next_f64() - 0.5;
                (amp * tone + 200.0 * noise).round() as i16
            })
            .collect();
        let n_tokens = rng.below(u64::from(self.max_tokens) + 1);
        let tokens = (0..n_tokens).map(|_| rng.below(u64::from(self.vocab_size)) as u32).collect();
        let n_words = 1 + rng.below(6);
        let text = (0..n_words)
            .map(|_| WORDS[rng.below(WORDS.len() as u64) as usize])
            .collect::<Vec<_>>()
            .join(" ");
        SynthUtterance {
            segment_id: format!("syn-{index:08}"),
            text,
            language: self.pick_language(&mut rng),
            // With no configured source the utterance gets the empty source name, which the
            // format allows (only language codes must be non-empty).
            source: (self.sources.get(rng.below(self.sources.len().max(1) as u64) as usize))
                .cloned()
                .unwrap_or_default(),
            pcm,
            tokens,
        }
    }

    fn pick_language(&self, rng: &mut SplitMix64) -> String {
        let total: f64 = (0..self.languages.len()).map(|r| 1.0 / (r as f64 + 1.0)).sum();
        let mut x = rng.next_f64() * total;
        for (r, code) in self.languages.iter().enumerate() {
            x -= 1.0 / (r as f64 + 1.0);
            if x < 0.0 {
                return code.clone();
            }
        }
        self.languages.last().cloned().unwrap_or_else(|| "xx".to_owned())
    }
}
