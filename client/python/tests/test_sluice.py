"""The Python package against a real node: reads, loader shape and content,
exact resume through state_dict, elastic resume, and the same sequence as
the Rust side (`sluicectl replay`)."""

import json
import subprocess

import numpy as np
import pytest

import sluice


def test_read_batch_returns_exact_bytes(node, tokens):
    ds = sluice.connect(node.endpoint).open("toks")
    assert ds.kind == "tokens:u16"
    assert ds.length_bytes == tokens.nbytes
    assert ds.content_hash.startswith("blake3:")
    raw = tokens.tobytes()
    got = ds.read_batch([(1, 10), (123_457, 4096), (0, 0)])
    assert got.tobytes() == raw[1:11] + raw[123_457:127_553]


def test_transport_is_chosen_and_explained(node):
    client = sluice.connect(node.endpoint)
    # The test node serves no RDMA endpoint (and this host has no device).
    assert client.transport == "tcp"
    assert "RDMA" in client.transport_reason
    assert sluice.connect(node.endpoint, transport="tcp").transport == "tcp"
    with pytest.raises(OSError, match="RDMA unavailable"):
        sluice.connect(node.endpoint, transport="rdma")
    with pytest.raises(ValueError, match="expected auto, rdma or tcp"):
        sluice.connect(node.endpoint, transport="carrier-pigeon")


def test_bad_ranges_raise_clearly(node):
    client = sluice.connect(node.endpoint)
    ds = client.open("toks")
    with pytest.raises(ValueError, match="out of bounds"):
        ds.read_batch([(0, 4), (ds.length_bytes, 1)])
    with pytest.raises(OSError, match="no dataset named"):
        client.open("missing")
    for bad in ([(-1, 4)], [(0, 1 << 32)]):
        with pytest.raises(ValueError, match=r"offset must be in \[0, 2\*\*64\) and its length in \[0, 2\*\*32\)"):
            ds.read_batch(bad)
        with pytest.raises(ValueError, match="offset must be"):
            ds.read_into(bad, bytearray(16))


def test_bad_loader_settings_raise_clearly(node):
    ds = sluice.connect(node.endpoint).open("toks")
    with pytest.raises(ValueError, match=r"seed -1 is outside \[0, 2\*\*64\)"):
        sluice.WindowLoader(ds, window=16, batch_size=2, seed=-1)
    with pytest.raises(ValueError, match="seed 18446744073709551616 is outside"):
        sluice.TokenWindows(node.endpoint, "toks", 16, 2, seed=1 << 64)
    with pytest.raises(ValueError, match="samples_per_epoch is at least 1"):
        sluice.WindowLoader(ds, window=16, batch_size=2, seed=0, samples_per_epoch=0)
    with pytest.raises(ValueError, match="samples_per_epoch is at least 1"):
        sluice.TokenWindows(node.endpoint, "toks", 16, 2, seed=0, samples_per_epoch=0)


def test_loader_yields_token_windows(node, tokens):
    ds = sluice.connect(node.endpoint).open("toks")
    loader = sluice.WindowLoader(ds, window=256, batch_size=16, seed=3, prefetch=3)
    for _ in range(5):
        batch = next(loader)
        assert batch.shape == (16, 256) and batch.dtype == np.dtype("<u2")
        for row, start in zip(batch, loader.last_starts):
            assert np.array_equal(row, tokens[start:start + 256])


def run(loader, steps):
    out = []
    for _ in range(steps):
        batch = next(loader)
        out.append((list(loader.last_starts), batch.tobytes()))
    return out


RESUME_SCRIPT = """
import hashlib, json, sys
import sluice
endpoint, state, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
loader = sluice.WindowLoader(sluice.connect(endpoint).open("toks"), 128, 8, seed=999)
loader.load_state_dict(state)
for _ in range(steps):
    batch = next(loader)
    print(json.dumps([list(loader.last_starts), hashlib.sha256(batch.tobytes()).hexdigest()]))
"""


def test_state_dict_resumes_exactly_in_a_new_process(node):
    import hashlib
    import subprocess
    import sys

    ds = sluice.connect(node.endpoint).open("toks")
    straight = run(sluice.WindowLoader(ds, 128, 8, seed=11, samples_per_epoch=400), 120)
    first = sluice.WindowLoader(ds, 128, 8, seed=11, samples_per_epoch=400)
    resumed = [(starts, hashlib.sha256(data).hexdigest()) for starts, data in run(first, 45)]
    saved = first.state_dict()
    assert saved["next_sample"] == 45 * 8 and saved["epoch"] == 0
    out = subprocess.run([sys.executable, "-c", RESUME_SCRIPT, node.endpoint, json.dumps(saved), "75"],
                         capture_output=True, text=True, check=True)
    resumed += [tuple(json.loads(line)) for line in out.stdout.splitlines()]
    assert resumed == [(starts, hashlib.sha256(data).hexdigest()) for starts, data in straight]


def test_stride_ratio_sets_the_epoch(node):
    ds = sluice.connect(node.endpoint).open("toks")
    loader = sluice.WindowLoader(ds, 64, 10, seed=1, stride_ratio=1000.0)
    next(loader)
    assert loader.state_dict()["samples_per_epoch"] == 1_000_000 // 1000


def test_elastic_resume_keeps_the_global_order(node):
    ds = sluice.connect(node.endpoint).open("toks")
    single = run(sluice.WindowLoader(ds, 64, 16, seed=5), 20)
    ranks = [sluice.WindowLoader(ds, 64, 4, seed=5, rank=r, world_size=4) for r in range(4)]
    parts = [run(r, 10) for r in ranks]
    for step in range(10):
        assert sum((p[step][0] for p in parts), []) == single[step][0]
    state = ranks[0].state_dict()
    halves = []
    for r in range(2):
        loader = sluice.WindowLoader(ds, 64, 8, seed=5, rank=r, world_size=2)
        loader.load_state_dict(state)
        halves.append(run(loader, 10))
    for step in range(10):
        assert sum((h[step][0] for h in halves), []) == single[10 + step][0]


def test_same_sequence_as_rust(node, tmp_path):
    ds = sluice.connect(node.endpoint).open("toks")
    loader = sluice.WindowLoader(ds, 100, 12, seed=77)
    steps = run(loader, 7)
    state = tmp_path / "state.bin"
    state.write_bytes(loader.state_bytes())
    rows = json.loads(node.ctl("replay", "--state", str(state), "--step", "6", "--json"))
    assert [r["index"] for r in rows] == steps[6][0]


def test_torch_adapter(node):
    from conftest import need

    torch = need("torch")
    from sluice.torch import WindowDataset

    ds = WindowDataset(node.endpoint, "toks", window=32, batch_size=4, seed=1)
    batch = next(iter(ds))
    assert isinstance(batch, torch.Tensor) and tuple(batch.shape) == (4, 32)


def test_reads_need_a_grant_on_a_secure_node(tmp_path, monkeypatch):
    from conftest import Node

    monkeypatch.delenv("SLUICE_TOKEN", raising=False)
    node = Node(tmp_path, insecure=False)
    try:
        data = tmp_path / "data.bin"
        data.write_bytes(bytes(range(256)) * 16)
        node.ctl("dataset", "create", "secret", "--kind", "bytes")
        node.ctl("dataset", "ingest", "secret", str(data))
        node.ctl("dataset", "seal", "secret")
        client = sluice.connect(node.endpoint)
        with pytest.raises(OSError, match="needs a grant"):
            client.open("secret")
        grant = json.loads(node.ctl("--json", "grant", "create", "secret", "--client", "pytest"))
        ds = client.open("secret", token=grant["token"])
        assert ds.read_batch([(250, 10)]).tobytes() == bytes([250, 251, 252, 253, 254, 255, 0, 1, 2, 3])
        # The environment variable works as well, for jobs that get it injected.
        monkeypatch.setenv("SLUICE_TOKEN", grant["token"])
        assert sluice.connect(node.endpoint).open("secret").length_bytes == 4096
    finally:
        node.stop()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _certificates(directory):
    """A CA, a node certificate for 127.0.0.1 signed by it, and a second CA
    that signed nothing: made here with openssl, never committed."""
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
             "-subj", "/CN=sluice-test-ca", "-keyout", str(ca_key), "-out", str(ca),
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    other = directory / "other.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
             "-subj", "/CN=someone-else", "-keyout", str(directory / "other.key"), "-out", str(other),
             "-addext", "basicConstraints=critical,CA:TRUE")
    key, csr, cert = directory / "node.key", directory / "node.csr", directory / "node.pem"
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=node",
             "-keyout", str(key), "-out", str(csr))
    ext = directory / "node.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-days", "2", "-extfile", str(ext), "-out", str(cert))
    return ca, other, cert, key


def test_https_node_with_a_ca_file(tmp_path, monkeypatch):
    from conftest import Node

    for name in ("SLUICE_TOKEN", "SLUICE_CA_FILE", "SLUICE_CERT_FILE", "SLUICE_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    ca, other, cert, key = _certificates(tmp_path)
    node = Node(tmp_path, insecure=False, extra=["--tls-cert", str(cert), "--tls-key", str(key), "--data-tls"],
                ca_file=str(ca))
    try:
        assert node.endpoint.startswith("https://")
        data = tmp_path / "data.bin"
        data.write_bytes(bytes(range(256)) * 64)
        node.ctl("dataset", "create", "secret", "--kind", "bytes")
        node.ctl("dataset", "ingest", "secret", str(data))
        node.ctl("dataset", "seal", "secret")
        grant = json.loads(node.ctl("--json", "grant", "create", "secret", "--client", "pytest"))
        ds = sluice.connect(node.endpoint, ca_file=str(ca)).open("secret", token=grant["token"], verify_chunks=True)
        assert ds.read_batch([(1000, 24)]).tobytes() == bytes(range(232, 256))
        # The environment variable works as well.
        monkeypatch.setenv("SLUICE_CA_FILE", str(ca))
        assert sluice.connect(node.endpoint).open("secret", token=grant["token"]).length_bytes == 16384
        monkeypatch.delenv("SLUICE_CA_FILE")
        with pytest.raises(OSError, match="not trusted"):
            sluice.connect(node.endpoint, ca_file=str(other))
    finally:
        node.stop()
