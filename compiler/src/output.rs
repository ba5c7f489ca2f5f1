//! Writing to stdout without panicking when the reader goes away (`asrc ... | head`).

use std::io::{self, Write};

/// Writes `text` to stdout. A closed pipe is not an error: the reader has what it wanted.
pub fn print(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}
