//! Where `koala` prints: its standard output, which may close under it (the lines of a running
//! job are `crate::progress_lines`).
//!
//! Every `println!`/`print!` of this crate is [`crate::println`]/[`crate::print`], which write
//! through [`write_stdout`]: when the reader of the output went away (`koala run job.toml | head
//! -3`: EPIPE) nothing more is printed, a job this process runs stops as at a first Ctrl-C
//! ([`crate::interrupt::stdout_closed`]), and the process exits 141 once it ended, the status of
//! a process killed by SIGPIPE. `std`'s `println!` would panic there instead ("failed printing
//! to stdout") and leave the job's processes to fend for themselves.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// The exit status of a command whose standard output closed before it was done (128 + SIGPIPE).
pub const CLOSED_OUTPUT_EXIT: i32 = 141;

/// Writes to the standard output; once a write failed (the reader went away), writes nothing
/// more and stops the job under way.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    if STDOUT_CLOSED.load(Ordering::SeqCst) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if out.write_fmt(args).and_then(|()| out.flush()).is_err() {
        STDOUT_CLOSED.store(true, Ordering::SeqCst);
        crate::interrupt::stdout_closed();
    }
}

/// Writes `lines` to the standard output if anyone still reads it, and nothing else: for the
/// summary of `koala coordinator`, whose scripts may close the pipe after its first line (the
/// job is over by then, and that is no reason to exit 141).
pub fn print_if_read(lines: &[String]) {
    let mut out = std::io::stdout().lock();
    for line in lines {
        if writeln!(out, "{line}").is_err() {
            return;
        }
    }
    let _ = out.flush();
}

/// Whether the standard output closed under this process.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::SeqCst)
}

/// A message for the user on the standard error (interrupts, warnings), never a panic if that
/// closed too.
pub fn note(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
}
