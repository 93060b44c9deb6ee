"""Which native build the package loads: the RDMA build where rdma-core's
libraries load, and on a host without them the TCP-only build, which
imports, reads over TCP and says why (simulated by hiding libibverbs in a
mount namespace of the test's own)."""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import sluice

RDMA_REQUIRED = os.environ.get("SLUICE_PYTHON_REQUIRE_RDMA") == "1"


def rdma_build() -> pathlib.Path:
    spec = importlib.util.find_spec("sluice._native_rdma")
    if spec is None or spec.origin is None:
        if RDMA_REQUIRED:
            pytest.fail("sluice._native_rdma is not in the installed package (scripts/test.sh builds it)")
        pytest.skip("this package was built without its RDMA module (no rdma-core where it was built)")
    return pathlib.Path(spec.origin)


def test_the_rdma_build_is_loaded_where_rdma_core_is(node):
    rdma_build()
    assert sluice._native.__name__ == "sluice._native_rdma"
    assert sluice.RDMA_UNAVAILABLE is None
    client = sluice.connect(node.endpoint)
    # The RDMA build, but this node serves no RDMA endpoint: TCP, and why.
    assert client.transport == "tcp"
    assert "serves no RDMA endpoint" in client.transport_reason, client.transport_reason


def run_python(code: str, env: dict, wrap=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", code]
    if wrap:
        command = wrap(command)
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, timeout=120)


PROBE = """
import json, sluice
client = sluice.connect({endpoint!r})
ds = client.open("toks")
try:
    sluice.connect({endpoint!r}, transport="rdma")
    refused = None
except OSError as err:
    refused = str(err)
print(json.dumps({{"module": sluice._native.__name__, "why": sluice.RDMA_UNAVAILABLE,
                  "transport": client.transport, "reason": client.transport_reason,
                  "bytes": ds.read_batch([(10, 4096)]).tobytes().hex(), "refused": refused}}))
"""


def test_without_rdma_core_the_package_imports_and_reads_over_tcp_saying_why(node, tokens):
    library = None
    for line in subprocess.run(["ldd", str(rdma_build())], capture_output=True, text=True).stdout.splitlines():
        if "libibverbs.so" in line and "=>" in line:
            library = line.split("=>")[1].split()[0]
    assert library, "the RDMA build links libibverbs"
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("hiding libibverbs needs root and unshare(1) for a private mount namespace")

    def hidden(command):
        # /dev/null bound over the library in a mount namespace of this
        # process alone: the loader finds a file it cannot load, as on a
        # host without rdma-core.
        return ["unshare", "-m", "--propagation", "private", "sh", "-c",
                f'mount --bind /dev/null {library} && exec "$0" "$@"', *command]

    out = run_python(PROBE.format(endpoint=node.endpoint), {}, wrap=hidden)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["module"] == "sluice._native"
    assert "libibverbs" in report["why"] and "rdma-core" in report["why"], report
    assert report["transport"] == "tcp"
    assert report["reason"].startswith("the TCP-only build:") and "libibverbs" in report["reason"], report
    assert report["refused"] and "RDMA unavailable" in report["refused"] and "libibverbs" in report["refused"]
    assert bytes.fromhex(report["bytes"]) == tokens.tobytes()[10:4106]


def test_sluice_native_tcp_picks_the_tcp_only_build(node, tokens):
    out = run_python(PROBE.format(endpoint=node.endpoint), {"SLUICE_NATIVE": "tcp"})
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["module"] == "sluice._native"
    assert report["why"] == "SLUICE_NATIVE=tcp chose the TCP-only build"
    assert report["transport"] == "tcp" and report["reason"].startswith("the TCP-only build")
    assert bytes.fromhex(report["bytes"]) == tokens.tobytes()[10:4106]
