//! The tokenizer of a corpus, for turning token ids back into text: the pieces of its
//! SentencePiece model, read from the model's bytes with a small protobuf reader (the trainer
//! links no SentencePiece library; `sentencepiece_model.proto` defines the fields read here).

/// Why a tokenizer model could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizerError {
    /// The bytes are not a serialized SentencePiece `ModelProto` with at least one piece.
    #[error("the tokenizer is not a readable SentencePiece model")]
    NotSentencePiece,
}

/// A SentencePiece piece's type (sentencepiece_model.proto).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceType {
    /// Ordinary text.
    Normal,
    /// `<unk>`.
    Unknown,
    /// `<s>`, `</s>`: no text.
    Control,
    /// User-defined symbols such as `<|hi|>`.
    UserDefined,
    /// Unused.
    Unused,
    /// `<0xAB>`: one byte.
    Byte,
}

/// The pieces of a SentencePiece model, for detokenization.
#[derive(Debug, Clone)]
pub struct Pieces {
    pieces: Vec<(String, PieceType)>,
    scores: Vec<f32>,
}

fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// One protobuf field: number, wire type, length-delimited payload, varint value.
type Field<'a> = (u64, u8, &'a [u8], u64);

/// Walks the fields of one protobuf message.
fn fields(b: &[u8]) -> Option<Vec<Field<'_>>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let key = varint(b, &mut at)?;
        let (field, wire) = (key >> 3, (key & 7) as u8);
        match wire {
            0 => {
                let v = varint(b, &mut at)?;
                out.push((field, wire, &b[0..0], v));
            }
            1 => {
                at = at.checked_add(8).filter(|&e| e <= b.len())?;
            }
            2 => {
                let len = usize::try_from(varint(b, &mut at)?).ok()?;
                let end = at.checked_add(len).filter(|&e| e <= b.len())?;
                out.push((field, wire, &b[at..end], 0));
                at = end;
            }
            5 => {
                let end = at.checked_add(4).filter(|&e| e <= b.len())?;
                out.push((field, wire, &b[at..end], 0));
                at = end;
            }
            _ => return None,
        }
    }
    Some(out)
}

impl Pieces {
    /// Reads the pieces of a serialized `ModelProto`.
    pub fn parse(model: &[u8]) -> Result<Pieces, TokenizerError> {
        let bad = || TokenizerError::NotSentencePiece;
        let mut pieces = Vec::new();
        let mut scores = Vec::new();
        for (field, wire, body, _) in fields(model).ok_or_else(bad)? {
            if field != 1 || wire != 2 {
                continue;
            }
            let mut text = String::new();
            let mut kind = PieceType::Normal;
            let mut score = 0f32;
            for (f, w, b, v) in fields(body).ok_or_else(bad)? {
                match (f, w) {
                    (1, 2) => text = String::from_utf8_lossy(b).into_owned(),
                    (2, 5) => score = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                    (3, 0) => {
                        kind = match v {
                            2 => PieceType::Unknown,
                            3 => PieceType::Control,
                            4 => PieceType::UserDefined,
                            5 => PieceType::Unused,
                            6 => PieceType::Byte,
                            _ => PieceType::Normal,
                        }
                    }
                    _ => {}
                }
            }
            pieces.push((text, kind));
            scores.push(score);
        }
        if pieces.is_empty() {
            return Err(bad());
        }
        Ok(Pieces { pieces, scores })
    }

    /// Number of pieces.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// The score of piece `id` (0 past the end).
    pub fn score(&self, id: usize) -> f32 {
        self.scores.get(id).copied().unwrap_or(0.0)
    }

    /// The text of piece `id` (empty past the end).
    pub fn piece(&self, id: usize) -> &str {
        self.pieces.get(id).map_or("", |(p, _)| p.as_str())
    }

    /// The type of piece `id` (`Normal` past the end).
    pub fn kind(&self, id: usize) -> PieceType {
        self.pieces.get(id).map_or(PieceType::Normal, |(_, k)| *k)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// Text of token ids: pieces joined, `▁` as a space, control pieces and `<|xx|>` language
    /// tags dropped, byte pieces decoded, whitespace collapsed.
    pub fn decode(&self, ids: &[usize]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            let Some((p, kind)) = self.pieces.get(id) else { continue };
            match kind {
                PieceType::Control | PieceType::Unused => {}
                PieceType::UserDefined if p.starts_with("<|") && p.ends_with("|>") => {}
                PieceType::Byte => {
                    if let Some(b) = p.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
                        if let Ok(v) = u8::from_str_radix(b, 16) {
                            bytes.push(v);
                        }
                    }
                }
                PieceType::Unknown => bytes.extend_from_slice(" \u{2047} ".as_bytes()),
                _ => bytes.extend_from_slice(p.replace('\u{2581}', " ").as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

/// What a SentencePiece model says besides its pieces, for writing it in another library's
/// format (`hf::tokenizer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// `TrainerSpec.unk_piece` (SentencePiece's default `<unk>` when absent).
    pub unk_piece: String,
    /// `NormalizerSpec.precompiled_charsmap`: the compiled normalisation rules (empty: none).
    pub precompiled_charsmap: Vec<u8>,
}

/// Reads the trainer and normaliser settings of a serialized `ModelProto` (fields 2 and 3).
pub fn model_spec(model: &[u8]) -> Result<ModelSpec, TokenizerError> {
    let bad = || TokenizerError::NotSentencePiece;
    let mut spec = ModelSpec { unk_piece: "<unk>".to_owned(), precompiled_charsmap: Vec::new() };
    for (field, wire, body, _) in fields(model).ok_or_else(bad)? {
        match (field, wire) {
            (2, 2) => {
                for (f, w, b, _) in fields(body).ok_or_else(bad)? {
                    if (f, w) == (45, 2) {
                        spec.unk_piece = String::from_utf8_lossy(b).into_owned();
                    }
                }
            }
            (3, 2) => {
                for (f, w, b, _) in fields(body).ok_or_else(bad)? {
                    if (f, w) == (2, 2) {
                        spec.precompiled_charsmap = b.to_vec();
                    }
                }
            }
            _ => {}
        }
    }
    Ok(spec)
}
