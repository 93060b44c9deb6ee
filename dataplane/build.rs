//! With the `spdk` feature, links this package's own test binaries against
//! SPDK with the arguments `spdk-sys` worked out, and says whether this
//! SPDK's env options carry `opts_size` (24.09 and later).

fn main() {
    println!("cargo:rustc-check-cfg=cfg(spdk_env_opts_size)");
    if let Ok(args) = std::env::var("DEP_SPDK_NVME_LINK_ARGS") {
        for arg in args.split_whitespace() {
            println!("cargo:rustc-link-arg={arg}");
        }
    }
    if std::env::var_os("DEP_SPDK_NVME_ENV_OPTS_SIZE").is_some() {
        println!("cargo:rustc-cfg=spdk_env_opts_size");
    }
}
