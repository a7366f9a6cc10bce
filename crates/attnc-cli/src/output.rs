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

/// Progress of a long run on stderr: a bar redrawn in place on a terminal (failures are
/// printed above it as they happen), one plain line per case otherwise (logs, CI).
pub struct ProgressBar {
    terminal: bool,
    drawn: bool,
}

impl ProgressBar {
    pub fn on_stderr() -> ProgressBar {
        use std::io::IsTerminal;
        ProgressBar { terminal: std::io::stderr().is_terminal(), drawn: false }
    }

    /// One selftest case finished.
    pub fn case(&mut self, p: &attnc::runtime::selftest::CaseProgress<'_>) {
        let mut err = std::io::stderr().lock();
        if !self.terminal {
            let _ = writeln!(err, "{}", p.line());
            return;
        }
        if !p.result.ok {
            let _ = write!(err, "\r\x1b[2K{}\n", p.line());
        }
        const WIDTH: usize = 30;
        let filled = (p.done * WIDTH).checked_div(p.total).unwrap_or(WIDTH);
        let label: String = format!("{} {}", p.result.spec, p.result.case).chars().take(60).collect();
        let _ = write!(
            err,
            "\r\x1b[2K[{}{}] {}/{} {label}",
            "#".repeat(filled),
            ".".repeat(WIDTH - filled),
            p.done,
            p.total
        );
        let _ = err.flush();
        self.drawn = true;
    }

    /// Ends the bar's line (the table follows on stdout).
    pub fn finish(&mut self) {
        if self.drawn {
            let _ = writeln!(std::io::stderr());
            self.drawn = false;
        }
    }
}
