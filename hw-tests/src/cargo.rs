//! Cargo run from inside a test: the builds the rig needs, made so that they
//! find what `scripts/test.sh` (or the developer's shell) already built.

use std::process::Command;

/// Variables Cargo sets for the crate it runs (its manifest, package name and
/// version, output directory) rather than for a build. A test process
/// inherits them, and so would a `cargo build` it starts; build scripts that
/// read them say `rerun-if-env-changed` (ring's does), so the child would
/// rebuild those crates and all that depends on them, minutes of release
/// build while booted guests wait, only because it was started by a test.
fn set_for_the_running_crate(name: &str) -> bool {
    const PREFIXES: [&str; 3] = ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_"];
    const NAMES: [&str; 4] = ["CARGO_CRATE_NAME", "CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "OUT_DIR"];
    PREFIXES.iter().any(|prefix| name.starts_with(prefix)) || NAMES.contains(&name)
}

/// `cargo` (the one running this test, by `$CARGO`) with the environment a
/// shell would give it: what Cargo set for the running crate is removed,
/// what the user set (`CARGO_TARGET_DIR`, `CARGO_HOME`, `RUSTFLAGS`) stays.
pub fn cargo() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_for_the_running_crate) {
            command.env_remove(name);
        }
    }
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_what_cargo_set_for_the_test_and_keeps_what_the_user_set() {
        // This process is a test Cargo started, so it has a package name.
        assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
        let command = cargo();
        let removed: Vec<_> =
            command.get_envs().filter(|(_, value)| value.is_none()).map(|(name, _)| name.to_owned()).collect();
        assert!(removed.iter().any(|name| name == "CARGO_PKG_NAME"));
        assert!(removed.iter().any(|name| name == "CARGO_MANIFEST_DIR"));
        for kept in ["CARGO_TARGET_DIR", "CARGO_HOME", "CARGO", "RUSTFLAGS", "PATH"] {
            assert!(!set_for_the_running_crate(kept), "{kept}");
        }
    }
}
