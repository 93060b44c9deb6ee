//! The policy check refuses each kind of hostile object before anything of
//! it reaches the kernel: the wrong program type, helpers that write or
//! read what a policy must not touch, maps beyond the shared ones, a map
//! pinned by name. The objects are compiled here from `tests/hostile/`
//! with clang, as `bpf/build.sh` compiles the real ones; no root needed.

use std::path::{Path, PathBuf};

#[path = "hostile/compile.rs"]
mod hostile;

use sluice_ebpf::policy_check::{check, PolicyRefusal};

/// Compiles `tests/hostile/NAME.bpf.c` into `out` and reads the object.
fn compile(name: &str, out: &Path) -> Option<Vec<u8>> {
    let object = hostile::compile_hostile(Path::new(env!("CARGO_MANIFEST_DIR")), name, out)?;
    Some(std::fs::read(object).expect("read the object"))
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
