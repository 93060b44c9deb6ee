//! What `sluicectl` prints on stdout. `println!` panics when the reader of
//! stdout has gone (`sluicectl dataset ls | head`); these end the process
//! at once instead, with the status a shell gives a process that SIGPIPE
//! ended (141), as `ls` or `cat` end. Rust's runtime ignores SIGPIPE, and
//! it must stay ignored: the client's sockets would raise it too.

use std::io::Write;

/// 128 + SIGPIPE: what a shell reports for `yes | head`.
pub const STATUS_READER_GONE: i32 = 128 + 13;

/// Writes `args` to stdout; see the module's docs for a closed pipe.
pub fn write(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(err) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(STATUS_READER_GONE);
        }
        // Exit code 5 of `--help`'s table: a local file.
        eprintln!("writing to stdout: {err}");
        std::process::exit(5);
    }
}

/// `print!` on stdout, ending the process quietly when its reader has gone.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdout::write(format_args!($($arg)*)) };
}

/// `println!` on stdout, ending the process quietly when its reader has gone.
#[macro_export]
macro_rules! outln {
    () => { $crate::stdout::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::stdout::write(format_args!("{}\n", format_args!($($arg)*))) };
}
