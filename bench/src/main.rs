//! The side-by-side benchmark suite against peers (fio, nbd, HTTP range
//! servers) with plots. Not built yet: `bench/fio-compare.sh` measures the
//! served random-read path against fio today.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("the peer benchmark suite is not built yet; run bench/fio-compare.sh for the fio comparison");
    ExitCode::FAILURE
}
