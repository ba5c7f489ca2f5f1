//! NeMo `.nemo` archives: a tar (plain or gzip) holding `model_config.yaml`, the weights
//! (`model_weights.ckpt`, a PyTorch state dict) and the files the configuration names as
//! `nemo:<member>` (the tokenizer's model and vocabularies).
//!
//! [`Archive::open`] reads every member except the weights into memory (they are small); the
//! weights, which reach gigabytes, are streamed to a reader on demand ([`Archive::with_weights`]).
//! Nothing here knows what the model is: `asrt import` maps the configuration and the state dict,
//! `asrc compile --tokenizer model.nemo` only takes the tokenizer.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

pub use yaml_rust2::Yaml;

/// The member holding the model's configuration.
pub const CONFIG_MEMBER: &str = "model_config.yaml";
/// The member holding the state dict.
pub const WEIGHTS_MEMBER: &str = "model_weights.ckpt";

/// Why a `.nemo` archive could not be read. Each names the file, and the member or key.
#[derive(Debug, thiserror::Error)]
pub enum NemoError {
    /// The file could not be opened or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The archive.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The bytes are not a complete tar archive (truncated, damaged, or not a tar at all).
    #[error("{}: not a complete .nemo archive (a tar, plain or gzip): {detail}", path.display())]
    Tar {
        /// The archive.
        path: PathBuf,
        /// What the tar reader said.
        detail: String,
    },
    /// A member the archive must have is not in it.
    #[error("{}: no member {member:?} in the archive (members: {present})", path.display())]
    MissingMember {
        /// The archive.
        path: PathBuf,
        /// The member looked for.
        member: String,
        /// The members there are.
        present: String,
    },
    /// `model_config.yaml` is not YAML.
    #[error("{}: {CONFIG_MEMBER} is not valid YAML: {detail}", path.display())]
    Yaml {
        /// The archive.
        path: PathBuf,
        /// The parser's message.
        detail: String,
    },
    /// A configuration key is missing or has a value that cannot be used.
    #[error("{}: {CONFIG_MEMBER}: `{key}`: {detail}", path.display())]
    Config {
        /// The archive.
        path: PathBuf,
        /// The dotted key.
        key: String,
        /// What was expected and what was found.
        detail: String,
    },
}

/// An opened `.nemo` archive.
#[derive(Debug)]
pub struct Archive {
    path: PathBuf,
    members: BTreeMap<String, Vec<u8>>,
    weights: Option<String>,
    config: Yaml,
    config_text: String,
}

/// A member's name without a leading `./`.
fn normalise(name: &str) -> String {
    name.trim_start_matches("./").to_owned()
}

/// The tar stream of `path`, decompressed when it starts with gzip's magic bytes.
fn tar_reader(path: &Path) -> std::io::Result<Box<dyn Read>> {
    let mut f = BufReader::new(File::open(path)?);
    let mut magic = [0u8; 2];
    let n = f.read(&mut magic)?;
    let head = std::io::Cursor::new(magic[..n].to_vec()).chain(f);
    Ok(if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(head))
    } else {
        Box::new(head)
    })
}

impl Archive {
    /// Reads the archive's members (all but the weights) and parses its configuration.
    pub fn open(path: impl AsRef<Path>) -> Result<Archive, NemoError> {
        let path = path.as_ref().to_owned();
        let io = |source| NemoError::Io { path: path.clone(), source };
        let tar_err =
            |e: std::io::Error| NemoError::Tar { path: path.clone(), detail: e.to_string() };
        let mut tar = tar::Archive::new(tar_reader(&path).map_err(io)?);
        let mut members = BTreeMap::new();
        let mut weights = Vec::new();
        let mut entries = 0usize;
        for entry in tar.entries().map_err(tar_err)? {
            let mut entry = entry.map_err(tar_err)?;
            entries += 1;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let name = normalise(&entry.path().map_err(tar_err)?.to_string_lossy());
            if name.ends_with(".ckpt") {
                // The tar reader skips its bytes on the next entry; a truncated archive fails there.
                weights.push(name);
                continue;
            }
            let mut bytes = Vec::with_capacity(entry.size().min(1 << 24) as usize);
            entry.read_to_end(&mut bytes).map_err(tar_err)?;
            members.insert(name, bytes);
        }
        if entries == 0 {
            return Err(NemoError::Tar { path, detail: "no tar entries".into() });
        }
        let missing = |member: &str, members: &BTreeMap<String, Vec<u8>>, weights: &[String]| {
            let present: Vec<&str> = members
                .keys()
                .map(String::as_str)
                .chain(weights.iter().map(String::as_str))
                .collect();
            NemoError::MissingMember {
                path: path.clone(),
                member: member.to_owned(),
                present: present.join(", "),
            }
        };
        let Some(text) = members.get(CONFIG_MEMBER) else {
            return Err(missing(CONFIG_MEMBER, &members, &weights));
        };
        let config_text = String::from_utf8(text.clone()).map_err(|e| NemoError::Yaml {
            path: path.clone(),
            detail: format!("not UTF-8 ({e})"),
        })?;
        let mut docs = yaml_rust2::YamlLoader::load_from_str(&config_text)
            .map_err(|e| NemoError::Yaml { path: path.clone(), detail: e.to_string() })?;
        if docs.is_empty() {
            return Err(NemoError::Yaml { path, detail: "empty document".into() });
        }
        let config = docs.swap_remove(0);
        let weights = match weights.as_slice() {
            [] => None,
            [one] if one == WEIGHTS_MEMBER => Some(one.clone()),
            _ => {
                return Err(NemoError::Config {
                    path,
                    key: "(archive)".into(),
                    detail: format!(
                        "expected one {WEIGHTS_MEMBER}, found {} (model-parallel checkpoints are \
                         not supported)",
                        weights.join(", ")
                    ),
                })
            }
        };
        Ok(Archive { path, members, weights, config, config_text })
    }

    /// The archive's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed `model_config.yaml`.
    pub fn config(&self) -> &Yaml {
        &self.config
    }

    /// `model_config.yaml` as written.
    pub fn config_text(&self) -> &str {
        &self.config_text
    }

    /// The value at a dotted key (`encoder.d_model`), if present and not null.
    pub fn get(&self, key: &str) -> Option<&Yaml> {
        let mut v = &self.config;
        for part in key.split('.') {
            v = &v[part];
            if v.is_badvalue() {
                return None;
            }
        }
        (!v.is_null()).then_some(v)
    }

    /// An error about configuration key `key`.
    pub fn config_error(&self, key: &str, detail: impl Into<String>) -> NemoError {
        NemoError::Config { path: self.path.clone(), key: key.to_owned(), detail: detail.into() }
    }

    /// The member names (weights included).
    pub fn member_names(&self) -> Vec<&str> {
        self.members.keys().map(String::as_str).chain(self.weights.as_deref()).collect()
    }

    /// A member's bytes (not the weights: see [`Archive::with_weights`]).
    pub fn member(&self, name: &str) -> Result<&[u8], NemoError> {
        self.members.get(&normalise(name)).map(Vec::as_slice).ok_or_else(|| {
            NemoError::MissingMember {
                path: self.path.clone(),
                member: name.to_owned(),
                present: self.member_names().join(", "),
            }
        })
    }

    /// The member a configuration value names: `nemo:<member>` (or a bare member name).
    pub fn artifact(&self, key: &str) -> Result<&[u8], NemoError> {
        let value = self
            .get(key)
            .and_then(Yaml::as_str)
            .ok_or_else(|| self.config_error(key, "expected a `nemo:<member>` path"))?;
        self.member(value.strip_prefix("nemo:").unwrap_or(value))
    }

    /// The SentencePiece model of the archive's tokenizer (`tokenizer.model_path`).
    pub fn tokenizer_model(&self) -> Result<&[u8], NemoError> {
        match self.get("tokenizer.type").and_then(Yaml::as_str) {
            Some("bpe") => self.artifact("tokenizer.model_path"),
            Some(other) => Err(self.config_error(
                "tokenizer.type",
                format!("{other:?}: only SentencePiece tokenizers (`bpe`) are supported"),
            )),
            None => Err(self.config_error(
                "tokenizer",
                "no tokenizer section (a character-vocabulary model has no SentencePiece model)",
            )),
        }
    }

    /// Streams the state dict member to `f`.
    pub fn with_weights<R>(&self, f: impl FnOnce(&mut dyn Read) -> R) -> Result<R, NemoError> {
        let Some(name) = &self.weights else {
            return Err(NemoError::MissingMember {
                path: self.path.clone(),
                member: WEIGHTS_MEMBER.into(),
                present: self.member_names().join(", "),
            });
        };
        let io = |source| NemoError::Io { path: self.path.clone(), source };
        let tar_err =
            |e: std::io::Error| NemoError::Tar { path: self.path.clone(), detail: e.to_string() };
        let mut tar = tar::Archive::new(tar_reader(&self.path).map_err(io)?);
        for entry in tar.entries().map_err(tar_err)? {
            let mut entry = entry.map_err(tar_err)?;
            if normalise(&entry.path().map_err(tar_err)?.to_string_lossy()) == *name {
                return Ok(f(&mut entry));
            }
        }
        Err(NemoError::Tar { path: self.path.clone(), detail: format!("{name} vanished") })
    }
}

/// Writes a `.nemo` archive (plain tar, as NeMo 2 writes them) of `members` in order, to a
/// temporary name beside `path`, renamed into place when complete.
pub fn write_archive(path: &Path, members: &[(&str, &[u8])]) -> std::io::Result<()> {
    let tmp = path.with_extension("nemo.partial");
    let result = (|| {
        let mut tar = tar::Builder::new(std::io::BufWriter::new(File::create(&tmp)?));
        for (name, bytes) in members {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            header.set_entry_type(tar::EntryType::Regular);
            header.set_cksum();
            tar.append_data(&mut header, format!("./{name}"), *bytes)?;
        }
        let mut w = tar.into_inner()?;
        std::io::Write::flush(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "tokenizer:\n  type: bpe\n  model_path: nemo:abc_tokenizer.model\n\
                          encoder:\n  d_model: 64\n  feat_out: -1\n";

    fn archive(dir: &Path, gzip: bool) -> PathBuf {
        let plain = dir.join("m.nemo");
        write_archive(
            &plain,
            &[
                (CONFIG_MEMBER, CONFIG.as_bytes()),
                ("abc_tokenizer.model", b"spm bytes"),
                (WEIGHTS_MEMBER, &[7u8; 3000]),
            ],
        )
        .unwrap();
        if !gzip {
            return plain;
        }
        let gz = dir.join("m.tar.gz.nemo");
        let mut enc =
            flate2::write::GzEncoder::new(File::create(&gz).unwrap(), flate2::Compression::fast());
        std::io::copy(&mut File::open(&plain).unwrap(), &mut enc).unwrap();
        enc.finish().unwrap();
        gz
    }

    #[test]
    fn reads_plain_and_gzip_archives() {
        let dir = tempfile::tempdir().unwrap();
        for gzip in [false, true] {
            let a = Archive::open(archive(dir.path(), gzip)).unwrap();
            assert_eq!(a.get("encoder.d_model").and_then(Yaml::as_i64), Some(64));
            assert!(a.get("encoder.missing").is_none());
            assert_eq!(a.tokenizer_model().unwrap(), b"spm bytes");
            let mut n = 0;
            a.with_weights(|r| {
                let mut v = Vec::new();
                r.read_to_end(&mut v).unwrap();
                n = v.len();
                assert!(v.iter().all(|&b| b == 7));
            })
            .unwrap();
            assert_eq!(n, 3000);
        }
    }

    #[test]
    fn truncated_and_foreign_files_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let full = std::fs::read(archive(dir.path(), false)).unwrap();
        // Cut inside the weights (header blocks of 512 bytes precede each member's data).
        let cut = dir.path().join("cut.nemo");
        std::fs::write(&cut, &full[..full.len() - 2500]).unwrap();
        let e = Archive::open(&cut).unwrap_err().to_string();
        assert!(e.contains("cut.nemo") && e.contains("not a complete .nemo archive"), "{e}");
        let junk = dir.path().join("junk.nemo");
        std::fs::write(&junk, b"this is not a tar file at all").unwrap();
        assert!(Archive::open(&junk).is_err());
        let e = Archive::open(dir.path().join("absent.nemo")).unwrap_err().to_string();
        assert!(e.contains("absent.nemo"), "{e}");
    }

    #[test]
    fn missing_members_and_other_tokenizers_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ctc.nemo");
        write_archive(&p, &[(CONFIG_MEMBER, b"tokenizer:\n  type: wpe\n")]).unwrap();
        let a = Archive::open(&p).unwrap();
        let e = a.tokenizer_model().unwrap_err().to_string();
        assert!(e.contains("tokenizer.type") && e.contains("wpe"), "{e}");
        let e = a.with_weights(|_| ()).unwrap_err().to_string();
        assert!(e.contains(WEIGHTS_MEMBER), "{e}");
        let p = dir.path().join("noconfig.nemo");
        write_archive(&p, &[("x.txt", b"x")]).unwrap();
        let e = Archive::open(&p).unwrap_err().to_string();
        assert!(e.contains(CONFIG_MEMBER) && e.contains("x.txt"), "{e}");
    }
}
