"""Fixtures: a real sluiced on loopback ports with a sealed token dataset."""

import importlib
import os
import pathlib
import re
import subprocess
import tempfile

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
BIN = pathlib.Path(os.environ.get("SLUICE_BIN_DIR", ROOT / "target" / "debug"))


def need(module: str):
    """``module``, imported; a skip naming the install step where it is
    missing, and a failure when ``SLUICE_PYTHON_REQUIRE=1`` (as in
    ``.ci/run``), so a broken install cannot pass as skipped tests."""
    if os.environ.get("SLUICE_PYTHON_REQUIRE") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed (scripts/test.sh installs it)")


def _binary(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: build it with `cargo build --bin {name}` or set SLUICE_BIN_DIR")
    return str(path)


class Node:
    def __init__(self, workdir: pathlib.Path, insecure: bool = True, extra: "list[str] | None" = None,
                 ca_file: "str | None" = None):
        self.workdir = workdir
        self.ca_file = ca_file
        self.proc = subprocess.Popen(
            [_binary("sluiced"), "--data-dir", str(workdir / "node"), "--listen", "127.0.0.1:0",
             "--control", "127.0.0.1:0", "--cores", "2"] + (["--insecure"] if insecure else []) + (extra or []),
            stdout=subprocess.PIPE, text=True, env={**os.environ, "SLUICE_LOG": "warn"},
        )
        self.endpoint = None
        for line in self.proc.stdout:
            match = re.match(r"sluiced: control API on (\S+)", line)
            if match:
                self.endpoint = match.group(1)
            if line.startswith("sluiced: data plane"):
                break
        assert self.endpoint, "sluiced did not announce its control API"

    def ctl(self, *args: str, fails: bool = False) -> str:
        """sluicectl as the operator (the node's own token, when it made one):
        its output, or with ``fails`` its error, once it failed."""
        env = {k: v for k, v in os.environ.items() if k not in ("SLUICE_TOKEN", "SLUICE_ADMIN_TOKEN")}
        token = self.workdir / "node" / "admin.token"
        if token.exists():
            env["SLUICE_ADMIN_TOKEN"] = token.read_text().strip()
        trust = ["--ca-file", self.ca_file] if self.ca_file else []
        out = subprocess.run([_binary("sluicectl"), "--endpoint", self.endpoint, *trust, *args],
                             capture_output=True, text=True, env=env)
        if fails:
            assert out.returncode != 0, f"sluicectl {' '.join(args)} succeeded: {out.stdout}"
            return out.stderr
        assert out.returncode == 0, out.stderr
        return out.stdout

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)


@pytest.fixture(scope="session")
def tokens():
    rng = np.random.default_rng(5)
    return rng.integers(0, 50_257, size=1_000_000, dtype=np.uint16)


@pytest.fixture(scope="session")
def node(tokens):
    with tempfile.TemporaryDirectory() as tmp:
        workdir = pathlib.Path(tmp)
        # file:// sources under the temporary directory (tests' tmp_path):
        # a node fetches only what its source_allow lists.
        node = Node(workdir, extra=["--source-allow", f"file://{tempfile.gettempdir()}/"])
        path = workdir / "tokens.npy"
        np.save(path, tokens)
        node.ctl("dataset", "create", "toks", "--kind", "tokens:u16")
        node.ctl("dataset", "ingest", "toks", str(path))
        node.ctl("dataset", "seal", "toks")
        yield node
        node.stop()
