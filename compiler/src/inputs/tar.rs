//! Members of tar archives, read in place: an archive's headers are scanned once into an index
//! (member name to data offset and size; GNU long names and PAX headers included), and a member
//! is then one positioned read, so a tarred corpus is never extracted.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::audio::decode::Reject;

/// Where a member's bytes lie in its archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// Offset of the first data byte.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

/// An archive's regular files, in archive order.
#[derive(Debug, Default)]
pub struct TarIndex {
    /// Member names (as stored, `./` stripped) and spans, in archive order.
    pub members: Vec<(String, Span)>,
    by_name: HashMap<String, usize>,
}

/// Why an archive cannot be indexed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("tar archive {path}: {message}")]
pub struct TarError {
    /// The archive.
    pub path: PathBuf,
    /// What is wrong.
    pub message: String,
}

impl TarIndex {
    /// Scans the headers of the archive at `path`.
    pub fn build(path: &Path) -> Result<TarIndex, TarError> {
        let err = |message: String| TarError { path: path.to_path_buf(), message };
        let file = File::open(path).map_err(|e| err(e.to_string()))?;
        let mut archive = tar::Archive::new(file);
        let mut index = TarIndex::default();
        let entries = archive.entries_with_seek().map_err(|e| err(e.to_string()))?;
        for (i, entry) in entries.enumerate() {
            let entry = entry.map_err(|e| err(format!("header of member {i}: {e}")))?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let name = entry
                .path()
                .map_err(|e| err(format!("name of member {i}: {e}")))?
                .to_string_lossy()
                .trim_start_matches("./")
                .to_owned();
            let span = Span { offset: entry.raw_file_position(), size: entry.size() };
            // A name stored twice: the later member wins, as `tar -x` leaves it.
            index.by_name.insert(name.clone(), index.members.len());
            index.members.push((name, span));
        }
        Ok(index)
    }

    /// The span of member `name` (`./` prefixes ignored).
    pub fn get(&self, name: &str) -> Option<Span> {
        let i = *self.by_name.get(name.trim_start_matches("./"))?;
        Some(self.members[i].1)
    }
}

/// Reads `span` of the archive at `tar`.
pub fn read_span(tar: &Path, span: Span) -> Result<Vec<u8>, Reject> {
    use std::os::unix::fs::FileExt;
    let missing = |e: std::io::Error| Reject::MissingFile(format!("{}: {e}", tar.display()));
    let file = File::open(tar).map_err(missing)?;
    let size = usize::try_from(span.size).map_err(|_| {
        Reject::MissingFile(format!("{}: a member of {} bytes", tar.display(), span.size))
    })?;
    let mut buf = vec![0u8; size];
    file.read_exact_at(&mut buf, span.offset).map_err(missing)?;
    Ok(buf)
}

/// An archive's index, or why it has none, shared between threads.
pub type Indexed = Arc<Result<TarIndex, TarError>>;

/// Indexes shared by every thread of a compile: each archive is scanned once.
#[derive(Debug, Default, Clone)]
pub struct TarCache {
    indexes: Arc<Mutex<HashMap<PathBuf, Indexed>>>,
}

impl TarCache {
    /// The index of the archive at `path`, scanned on first use.
    pub fn index(&self, path: &Path) -> Indexed {
        // A poisoned lock only means another thread panicked while scanning; the map itself
        // is still consistent (entries are inserted whole).
        let mut map = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(path.to_path_buf()).or_insert_with(|| Arc::new(TarIndex::build(path))).clone()
    }

    /// Member `member` of the archive at `tar`: its bytes, or why there are none.
    pub fn read_member(&self, tar: &Path, member: &str) -> Result<Vec<u8>, Reject> {
        let index = self.index(tar);
        let index = match index.as_ref() {
            Ok(i) => i,
            Err(e) => return Err(Reject::MissingFile(e.to_string())),
        };
        let span = index.get(member).ok_or_else(|| {
            Reject::MissingMember(format!(
                "{} has no member {member:?} ({} members)",
                tar.display(),
                index.members.len()
            ))
        })?;
        read_span(tar, span)
    }
}
