#!/usr/bin/env bash
# The one test entry point: installs every Debian package and tool the tests
# need, then runs the whole suite. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

echo "== installing packages"
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

echo "== toolchain"
cargo --version
rustc --version
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    rustup component add rustfmt clippy
fi

echo "== format"
cargo fmt --all -- --check
cargo fmt --manifest-path client/python/Cargo.toml -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check

echo "== lint"
# Without the `rdma` feature (a build needing no rdma-core) and with it.
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets --features rdma -- -D warnings
cargo clippy --manifest-path client/python/Cargo.toml -- -D warnings
cargo clippy --manifest-path client/python/Cargo.toml --features rdma -- -D warnings

echo "== layout (the crates' dependency rules)"
bash scripts/check-layout.sh

echo "== S3-compatible server (moto, from PyPI) for the source-backed dataset tests"
rm -rf target/s3env
python3 -m venv target/s3env
target/s3env/bin/python -m pip install -q --upgrade pip
target/s3env/bin/python -m pip install -q 'moto[server]>=5,<6'
export SLUICE_MOTO_SERVER="$PWD/target/s3env/bin/moto_server"

echo "== tests"
# The cluster tests fail rather than skip when etcd is missing here, and
# the source tests when moto is.
SLUICE_ETCD_REQUIRE=1 SLUICE_S3_REQUIRE=1 cargo test --workspace --exclude hw-tests --features rdma --no-fail-fast

echo "== release builds the rig runs in its guests (sluiced, sluicectl; the Python module's RDMA build)"
# The same commands the rig would run (hw-tests/src/rig/sluice.rs), made
# here before any guest boots, so no rig test builds while its guests wait.
# The wheel below uses the Python module's build too.
cargo build -q --release -p sluice --bins --features rdma
cargo build -q --release --features rdma --manifest-path client/python/Cargo.toml --target-dir client/python/target

echo "== rig (QEMU guests: NVMe, vIOMMU + vfio, soft-RoCE)"
# Nothing may skip here: a missing prerequisite fails the run.
SLUICE_RIG_REQUIRE=1 cargo test -p hw-tests --no-fail-fast

echo "== benchmark suite (short run: proves it works; the figures come from the full run)"
cargo run -p bench --release -q -- all --short

echo "== fuzz (short run of every target)"
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "the nightly toolchain is missing; the fuzz targets need it (libFuzzer, -Zsanitizer)" >&2
    exit 1
fi
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked --quiet
bash scripts/fuzz.sh 15

echo "== python package"
# The wheel a user installs (abi3, Python >= 3.9), built by maturin in its
# own virtual environment, then installed into a fresh one with the default
# torch wheel (it runs without a GPU), torchdata and webdataset from the
# package registry: no torch test skips for want of them. The tests start
# the sluiced that cargo test built.
# The wheel carries both builds of the native module: `_native_rdma`
# (linked against rdma-core, installed above) beside the TCP-only
# `_native`; the package loads the first where rdma-core's libraries load.
rm -rf target/pybuild target/pyenv target/wheels client/python/python/sluice/_native_rdma.abi3.so
cp client/python/target/release/lib_native.so client/python/python/sluice/_native_rdma.abi3.so
python3 -m venv target/pybuild
target/pybuild/bin/python -m pip install -q --upgrade pip 'maturin>=1.5,<2'
target/pybuild/bin/maturin build -q --release --manifest-path client/python/Cargo.toml --out target/wheels
python3 -m venv target/pyenv
target/pyenv/bin/python -m pip install -q --upgrade pip
target/pyenv/bin/python -m pip install -q target/wheels/sluice-*-abi3-*.whl pytest torch torchdata webdataset
SLUICE_PYTHON_REQUIRE=1 SLUICE_PYTHON_REQUIRE_RDMA=1 SLUICE_BIN_DIR="$PWD/target/debug" \
    target/pyenv/bin/python -m pytest -q client/python/tests
