//! With the `linked` feature: finds SPDK through pkg-config, generates
//! bindings for the functions sluice calls, and links the shared libraries
//! the way SPDK's pkg-config documentation says (inside `--no-as-needed`,
//! or the constructors that register the PCIe transport are dropped).
//! Without it: nothing (the crate is empty).

fn main() {
    #[cfg(feature = "linked")]
    linked::build();
}

#[cfg(feature = "linked")]
mod linked {
    use std::path::PathBuf;

    /// Functions sluice calls; types they name come along.
    const FUNCTIONS: &[&str] = &[
        "spdk_env_opts_init",
        "spdk_env_init",
        "spdk_env_fini",
        "spdk_nvme_probe",
        "spdk_nvme_detach",
        "spdk_nvme_transport_id_parse",
        "spdk_nvme_ctrlr_get_data",
        "spdk_nvme_ctrlr_get_ns",
        "spdk_nvme_ctrlr_get_first_active_ns",
        "spdk_nvme_ctrlr_get_next_active_ns",
        "spdk_nvme_ctrlr_is_active_ns",
        "spdk_nvme_ctrlr_alloc_io_qpair",
        "spdk_nvme_ctrlr_free_io_qpair",
        "spdk_nvme_ctrlr_process_admin_completions",
        "spdk_nvme_ctrlr_cmd_admin_raw",
        "spdk_nvme_ctrlr_attach_ns",
        "spdk_nvme_ctrlr_detach_ns",
        "spdk_nvme_ctrlr_create_ns",
        "spdk_nvme_ctrlr_delete_ns",
        "spdk_nvme_ns_get_sector_size",
        "spdk_nvme_ns_get_num_sectors",
        "spdk_nvme_ns_get_size",
        "spdk_nvme_ns_get_id",
        "spdk_nvme_ns_cmd_read",
        "spdk_nvme_ns_cmd_readv",
        "spdk_nvme_ns_cmd_write",
        "spdk_nvme_ns_cmd_flush",
        "spdk_nvme_ns_cmd_dataset_management",
        "spdk_nvme_qpair_process_completions",
        "spdk_nvme_cpl_get_status_string",
        "spdk_zmalloc",
        "spdk_free",
        "spdk_mem_register",
        "spdk_mem_unregister",
    ];

    pub fn build() {
        let found = pkg_config::Config::new().cargo_metadata(false).probe("spdk_nvme").and_then(|nvme| {
            pkg_config::Config::new().cargo_metadata(false).probe("spdk_env_dpdk").map(|env| (nvme, env))
        });
        let (nvme, env) = found.unwrap_or_else(|err| {
            panic!(
                "--features spdk needs an SPDK install that pkg-config finds (spdk_nvme, spdk_env_dpdk): \
                 set PKG_CONFIG_PATH=<SPDK prefix>/lib/pkgconfig. pkg-config said: {err}"
            )
        });
        // Link arguments for the final binaries, in SPDK's documented
        // order: every library inside --no-as-needed (SPDK and DPDK register
        // the PCIe transport, the PCI bus and the mempool driver from
        // constructors, and libspdk_env_dpdk does not name the DPDK libraries
        // it calls), with an rpath to the install. Cargo passes link
        // arguments only to the package that emits them, so they travel as
        // `DEP_SPDK_NVME_LINK_ARGS` to the packages that build binaries
        // (see their build.rs).
        let mut args = vec!["-Wl,--no-as-needed".to_string()];
        for dir in nvme.link_paths.iter().chain(&env.link_paths) {
            args.push(format!("-L{}", dir.display()));
            args.push(format!("-Wl,-rpath,{}", dir.display()));
        }
        // The system libraries SPDK's shared libraries call without naming
        // them (OpenSSL, libaio, libuuid, ...): pkg-config lists them only
        // as spdk_syslibs' static libraries.
        let syslibs = pkg_config::Config::new()
            .cargo_metadata(false)
            .statik(true)
            .probe("spdk_syslibs")
            .map(|l| l.libs)
            .unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        for lib in nvme.libs.iter().chain(&env.libs).chain(&syslibs) {
            if seen.insert(lib.clone()) {
                args.push(format!("-l{lib}"));
            }
        }
        args.push("-Wl,--as-needed".to_string());
        println!("cargo:link_args={}", args.join(" "));
        let mut builder = bindgen::Builder::default()
            .header("wrapper.h")
            .clang_arg("-I/usr/include/x86_64-linux-gnu")
            .allowlist_var("SPDK_.*")
            .derive_default(true)
            // Packed structs holding aligned unions, which Rust refuses:
            // sluice reads and fills them as the spec's byte layout.
            .opaque_type("spdk_nvme_ctrlr_data")
            .opaque_type("spdk_nvme_ns_data")
            .layout_tests(false)
            .generate_comments(false)
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        for dir in nvme.include_paths.iter().chain(&env.include_paths) {
            builder = builder.clang_arg(format!("-I{}", dir.display()));
        }
        for function in FUNCTIONS {
            builder = builder.allowlist_function(function);
        }
        let bindings = builder.generate().expect("generating SPDK bindings");
        let text = bindings.to_string();
        // SPDK 24.09 added opts_size to spdk_env_opts; older releases lack it.
        // Told to the dependents' build scripts (DEP_SPDK_NVME_ENV_OPTS_SIZE).
        let env_opts = text.split("pub struct spdk_env_opts {").nth(1).and_then(|rest| rest.split('}').next());
        if env_opts.is_some_and(|fields| fields.contains("pub opts_size")) {
            println!("cargo:env_opts_size=1");
        }
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
        std::fs::write(out.join("bindings.rs"), text).expect("writing SPDK bindings");
    }
}
