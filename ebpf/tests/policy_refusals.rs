//! The policy check refuses each kind of hostile object before anything of
//! it reaches the kernel: the wrong program type, helpers that write or
//! read what a policy must not touch, maps beyond the shared ones, a map
//! pinned by name. The objects are compiled here from `tests/hostile/`
//! with clang, as `bpf/build.sh` compiles the real ones; no root needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_ebpf::policy_check::{check, PolicyRefusal};

/// Compiles `tests/hostile/NAME.bpf.c` into `out`, or says why it cannot
/// (a failure in CI, where `scripts/test.sh` installs clang and libbpf-dev).
fn compile(name: &str, out: &Path) -> Option<Vec<u8>> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = here.join("tests/hostile").join(format!("{name}.bpf.c"));
    let object = out.join(format!("{name}.bpf.o"));
    let status = Command::new("clang")
        .args(["-target", "bpf", "-g", "-O2"])
        .arg(format!("-I{}", here.join("include").display()))
        .arg("-I/usr/include/x86_64-linux-gnu")
        .arg("-c")
        .arg(&source)
        .arg("-o")
        .arg(&object)
        .status();
    match status {
        Ok(status) if status.success() => Some(std::fs::read(&object).expect("read the object")),
        other => {
            let why =
                format!("SKIP: clang could not compile {} ({other:?}); install clang and libbpf-dev", source.display());
            assert!(std::env::var_os("CI").is_none(), "{why}");
            eprintln!("{why}");
            None
        }
    }
}

fn temp_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Whether a refusal is of the expected kind.
type RefusalKind = fn(&PolicyRefusal) -> bool;

#[test]
fn hostile_policies_are_refused_with_the_reason() {
    let out = temp_dir();
    let cases: [(&str, RefusalKind, &str); 6] = [
        ("kprobe", |r| matches!(r, PolicyRefusal::ProgramType { .. }), "KProbe"),
        ("tracepoint", |r| matches!(r, PolicyRefusal::ProgramType { .. }), "TracePoint"),
        ("write_user", |r| matches!(r, PolicyRefusal::Helper { .. }), "bpf_probe_write_user"),
        ("read_kernel", |r| matches!(r, PolicyRefusal::Helper { .. }), "bpf_probe_read_kernel"),
        ("extra_map", |r| matches!(r, PolicyRefusal::ExtraMap(_)), "exfil"),
        ("pinned_map", |r| matches!(r, PolicyRefusal::PinnedMap(_)), "pinned by name"),
    ];
    for (name, expected, words) in cases {
        let Some(object) = compile(name, &out) else { return };
        let refusal = check(&object).expect_err(name);
        assert!(expected(&refusal), "{name}: {refusal:?}");
        assert!(refusal.to_string().contains(words), "{name}: {refusal}");
    }
    let _ = std::fs::remove_dir_all(out);
}
