//! What the command line prints on stdout. A reader that goes away early (`onramp jobs show 9 |
//! head -1`) ends the command quietly with status 0 instead of a panic: `print` turns the broken
//! pipe into [`StdoutClosed`], which `app::run` recognises.

use std::io::Write;

/// Stdout's reader is gone; nothing more can be shown, and nothing went wrong.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed")]
pub struct StdoutClosed;

/// Writes `text` to stdout as is and flushes it.
pub fn print(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("cannot write to stdout")),
    }
}

/// Writes `line` and a newline.
pub fn line(line: &str) -> anyhow::Result<()> {
    print(&format!("{line}\n"))
}

/// Whether `e` only says that stdout's reader went away.
pub fn is_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<StdoutClosed>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_closed_stdout_is_quiet() {
        let closed = anyhow::Error::from(StdoutClosed).context("printing job 9");
        assert!(is_closed(&closed));
        let other = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe)).context("talking to ssh");
        assert!(!is_closed(&other), "a broken pipe elsewhere is a real error");
    }
}
