//! `sluicectl`: operate a sluice node through its control API. The whole
//! of it is the `sluicectl` crate (`ctl/`), which links nothing of the
//! node; this binary lives here so the node's tests can run it.

fn main() -> std::process::ExitCode {
    sluicectl::main()
}
