//! The bytes a [`crate::Corpus`] reads: a read-only memory map of a file, or an 8-byte-aligned
//! buffer in memory. This module holds the crate's only `unsafe` code.

use std::fs::File;
use std::path::Path;

use crate::error::FormatError;

/// A heap buffer whose start is 8-byte aligned, so `u64` arrays can be viewed in place.
///
/// `Vec<u8>` gives no alignment guarantee; this is the in-memory stand-in for a memory map.
#[derive(Clone, Default)]
pub struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBuf {
    /// Copies `bytes` into a new aligned buffer.
    pub fn from_bytes(bytes: &[u8]) -> AlignedBuf {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        AlignedBuf { words, len: bytes.len() }
    }

    /// The buffer's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Where a corpus's bytes live.
pub(crate) enum Storage {
    /// A read-only map of a corpus file.
    Mapped(memmap2::Mmap),
    /// An empty file (cannot be mapped on every platform).
    Empty,
    /// An aligned in-memory copy.
    Owned(AlignedBuf),
}

impl Storage {
    /// Maps `path` read-only.
    pub(crate) fn map(path: &Path) -> Result<Storage, FormatError> {
        let io = |source| FormatError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            return Ok(Storage::Empty);
        }
        // SAFETY: memmap2 requires that the file is not modified or truncated while mapped, or
        // reads through the map are undefined behaviour. Corpora are write-once: the writer
        // creates a temporary file and renames it into place when complete, and no tool in this
        // workspace opens a finished corpus for writing. A user who edits a corpus while a
        // trainer maps it breaks this contract; README.md says so.
        let map = unsafe { memmap2::MmapOptions::new().map(&file) }.map_err(io)?;
        Ok(Storage::Mapped(map))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(m) => m,
            Storage::Empty => &[],
            Storage::Owned(b) => b.as_bytes(),
        }
    }

    /// Advises the kernel that `range` of the mapping will be read soon. A no-op for memory
    /// buffers; errors are ignored because advice never changes what is read.
    pub(crate) fn will_need(&self, range: std::ops::Range<usize>) {
        #[cfg(unix)]
        if let Storage::Mapped(m) = self {
            let page = 4096;
            let start = range.start / page * page;
            let len = range.end.saturating_sub(start);
            if len > 0 && range.end <= m.len() {
                let _ = m.advise_range(memmap2::Advice::WillNeed, start, len);
            }
        }
        #[cfg(not(unix))]
        let _ = range;
    }
}
