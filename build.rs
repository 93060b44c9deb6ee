//! With the `spdk` feature, links the node's binaries against SPDK with the
//! arguments `spdk-sys` worked out from pkg-config (SPDK's documented
//! `--no-as-needed` wrapping and an rpath to the install).

fn main() {
    if let Ok(args) = std::env::var("DEP_SPDK_NVME_LINK_ARGS") {
        for arg in args.split_whitespace() {
            println!("cargo:rustc-link-arg={arg}");
        }
    }
}
