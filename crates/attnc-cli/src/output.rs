//! Writing results: to a file, or to stdout without panicking when the reader goes away
//! (`attnc dump ... | head`).

use crate::Reported;
use std::io::Write;
use std::path::Path;

pub fn emit(text: &str, path: Option<&Path>) -> Result<(), Reported> {
    match path {
        Some(p) => std::fs::write(p, text).map_err(|e| {
            eprintln!("error: cannot write `{}`: {e}", p.display());
            Reported
        }),
        None => stdout(text),
    }
}

/// Writes to stdout; a closed pipe ends the output quietly (success), like other Unix tools.
pub fn stdout(text: &str) -> Result<(), Reported> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => {
            eprintln!("error: writing to stdout: {e}");
            Err(Reported)
        }
    }
}
