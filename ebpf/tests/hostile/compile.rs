//! Compiles a hostile policy, `ebpf/tests/hostile/NAME.bpf.c`, with clang
//! as `ebpf/bpf/build.sh` compiles the real ones. Shared by the ebpf
//! crate's refusal tests and the node's steering test (`#[path]`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The object file in `out`, or `None` having said why clang could not
/// make it (a failure in CI, where `scripts/test.sh` installs clang and
/// libbpf-dev). `ebpf` is the ebpf crate's directory.
pub fn compile_hostile(ebpf: &Path, name: &str, out: &Path) -> Option<PathBuf> {
    let source = ebpf.join("tests/hostile").join(format!("{name}.bpf.c"));
    let object = out.join(format!("{name}.bpf.o"));
    let status = Command::new("clang")
        .args(["-target", "bpf", "-g", "-O2"])
        .arg(format!("-I{}", ebpf.join("include").display()))
        .arg("-I/usr/include/x86_64-linux-gnu")
        .arg("-c")
        .arg(&source)
        .arg("-o")
        .arg(&object)
        .status();
    match status {
        Ok(status) if status.success() => Some(object),
        other => {
            let why =
                format!("SKIP: clang could not compile {} ({other:?}); install clang and libbpf-dev", source.display());
            assert!(std::env::var_os("CI").is_none(), "{why}");
            eprintln!("{why}");
            None
        }
    }
}
