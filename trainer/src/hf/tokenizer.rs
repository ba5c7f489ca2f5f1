//! `tokenizer.json`: the SentencePiece model as the `tokenizers` library's JSON, built as
//! transformers' `ParakeetConverter` (5.x, `convert_slow_tokenizer.py`) builds it.
//!
//! Whatever the SentencePiece model's type, the converter writes a BPE model over all pieces
//! (id = piece index) whose merges are derived from the pieces' scores (`generate_merges`:
//! every split of a piece into two pieces, ordered by score, then by the lengths of the two
//! halves, descending, stably), with the model's unknown piece, `fuse_unk` and byte fallback.
//! Control and user-defined pieces are added tokens (control ones special); the normaliser is
//! the model's precompiled character map, a right strip and runs of spaces to `▁`; pre-tokenizer
//! and decoder are `Metaspace` with a prefix always prepended. transformers' conversion then adds
//! `<blank>` (special) after the pieces, where the model's blank is, and marks the pad and
//! unknown tokens special. Decoding ids to text needs none of the merges; encoding text does.

use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::HfError;
use crate::tokenizer::{model_spec, PieceType, Pieces};

/// A built `tokenizer.json` and the tokens the configuration names.
pub struct Built {
    /// The JSON text.
    pub json: String,
    /// The padding token's id: `<pad>`'s when the model has one, else the blank's (a pad id
    /// past the joint's token logits would index past the prediction network's embedding when
    /// transformers pads a finished hypothesis in a batch).
    pub pad_id: usize,
    /// The padding token.
    pub pad_token: String,
    /// The unknown piece.
    pub unk_token: String,
}

/// transformers' `generate_merges` over `pieces` (ids are indices), with Python's `len` (code
/// points) and its stable descending sort.
pub fn merges(pieces: &Pieces) -> Vec<(String, String)> {
    // SentencePiece refuses a model with a repeated piece, so a piece's id is its index.
    let ids: std::collections::HashMap<&str, usize> =
        (0..pieces.len()).map(|i| (pieces.piece(i), i)).collect();
    let mut all: Vec<(String, String, f32)> = Vec::new();
    for i in 0..pieces.len() {
        let (piece, score) = (pieces.piece(i), pieces.score(i));
        let mut local: Vec<(usize, usize, &str, &str)> = Vec::new();
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&a), Some(&b)) = (ids.get(l), ids.get(r)) {
                local.push((a, b, l, r));
            }
        }
        local.sort_by_key(|&(a, b, _, _)| (a, b));
        all.extend(local.into_iter().map(|(_, _, l, r)| (l.to_owned(), r.to_owned(), score)));
    }
    let key = |m: &(String, String, f32)| (m.2, m.0.chars().count(), m.1.chars().count());
    // Python's sorted(reverse=True) keeps equal keys in their original order: a stable sort on
    // the reversed comparison does the same.
    all.sort_by(|x, y| {
        let (a, b) = (key(x), key(y));
        b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2))
    });
    all.into_iter().map(|(l, r, _)| (l, r)).collect()
}

fn added(id: usize, content: &str, special: bool) -> Value {
    json!({
        "id": id,
        "content": content,
        "single_word": false,
        "lstrip": false,
        "rstrip": false,
        "normalized": false,
        "special": special,
    })
}

/// Builds `tokenizer.json` for the SentencePiece `model` (whose pieces are `pieces`).
pub fn build(model: &[u8], pieces: &Pieces) -> Result<Built, HfError> {
    let spec = model_spec(model).map_err(|e| HfError::Tokenizer(e.to_string()))?;
    let n = pieces.len();
    let unk = spec.unk_piece.clone();
    let unk_id = (0..n).find(|&i| pieces.piece(i) == unk).ok_or_else(|| {
        HfError::Tokenizer(format!("the unknown piece {unk:?} is not among the model's {n} pieces"))
    })?;
    if (0..n).any(|i| pieces.piece(i) == "<blank>") {
        return Err(HfError::Tokenizer(
            "the model has a piece \"<blank>\"; transformers' Parakeet adds its blank token under \
             that name after the pieces"
                .to_owned(),
        ));
    }
    let (pad_id, pad_token) = match (0..n).find(|&i| pieces.piece(i) == "<pad>") {
        Some(i) => (i, "<pad>".to_owned()),
        None => (n, "<blank>".to_owned()),
    };

    let mut tokens: Vec<(usize, String, bool)> = (0..n)
        .filter_map(|i| match pieces.kind(i) {
            PieceType::Control => Some((i, pieces.piece(i).to_owned(), true)),
            PieceType::UserDefined => Some((i, pieces.piece(i).to_owned(), false)),
            _ => None,
        })
        .collect();
    tokens.push((n, "<blank>".to_owned(), true));
    // add_special_tokens(pad, unk): an existing token becomes special; a piece becomes an added
    // token at its id.
    for id in [pad_id, unk_id] {
        match tokens.iter_mut().find(|t| t.0 == id) {
            Some(t) => t.2 = true,
            None => tokens.push((id, pieces.piece(id).to_owned(), true)),
        }
    }
    tokens.sort_by_key(|t| t.0);
    let added_tokens: Vec<Value> = tokens.iter().map(|(i, c, s)| added(*i, c, *s)).collect();

    let mut vocab = Map::new();
    for i in 0..n {
        vocab.insert(pieces.piece(i).to_owned(), json!(i));
    }
    let merges: Vec<Value> = merges(pieces).into_iter().map(|(l, r)| json!([l, r])).collect();
    let mut normalizers = Vec::new();
    if !spec.precompiled_charsmap.is_empty() {
        normalizers.push(json!({
            "type": "Precompiled",
            "precompiled_charsmap":
                base64::engine::general_purpose::STANDARD.encode(&spec.precompiled_charsmap),
        }));
    }
    normalizers.push(json!({"type": "Strip", "strip_left": false, "strip_right": true}));
    normalizers
        .push(json!({"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": "\u{2581}"}));
    let metaspace = json!({
        "type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "always", "split": true,
    });
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": metaspace,
        // What transformers saves for this tokenizer: sequences as they are, no special tokens.
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {},
        },
        "decoder": metaspace,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": unk,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": true,
            "byte_fallback": true,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        },
    });
    let json = serde_json::to_string(&doc)
        .map_err(|e| HfError::Tokenizer(format!("serializing tokenizer.json: {e}")))?;
    Ok(Built { json, pad_id, pad_token, unk_token: spec.unk_piece })
}
