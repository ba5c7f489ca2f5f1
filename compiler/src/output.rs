//! Writing to stdout without panicking when the reader goes away (`asrc ... | head`), and the
//! directories above output files.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes `text` to stdout. A closed pipe is not an error: the reader has what it wanted.
pub fn print(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// Creates the missing directories above an output file; on failure, the directory and why.
pub(crate) fn create_parent(file: &Path) -> Result<(), (PathBuf, io::Error)> {
    match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => {
            std::fs::create_dir_all(dir).map_err(|e| (dir.to_path_buf(), e))
        }
        _ => Ok(()),
    }
}
