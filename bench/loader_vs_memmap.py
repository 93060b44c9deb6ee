#!/usr/bin/env python3
"""Windows/s of sluice's WindowLoader (client -> TCP -> node, page-cached)
next to a Megatron-style loader (materialized shuffle index + numpy memmap
gather) on the same token file, in the same run.

    python3 bench/loader_vs_memmap.py [--tokens N] [--seconds S]

Needs the `sluice` Python package (pip install ./client/python) and release
binaries (cargo build --release --bins).
"""

import argparse
import os
import pathlib
import re
import subprocess
import tempfile
import time

import numpy as np

import sluice

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release"


def memmap_loader(path, n_tokens, window, batch, seed, seconds):
    """Megatron-style: a permutation of sample starts materialized up front,
    windows gathered from a memmap."""
    tokens = np.memmap(path, dtype=np.uint16, mode="r", shape=(n_tokens,))
    samples = n_tokens // window
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    shuffle = rng.permutation(samples).astype(np.int64) * window  # the index Megatron saves to disk
    index_bytes = shuffle.nbytes
    done = 0
    deadline = started + seconds
    step = 0
    while time.perf_counter() < deadline:
        starts = shuffle[(step * batch) % (samples - batch):][:batch]
        out = np.stack([tokens[s:s + window] for s in starts])
        assert out.shape == (batch, window)
        done += batch
        step += 1
    return done / (time.perf_counter() - started), index_bytes


def sluice_loader(endpoint, window, batch, seed, seconds, prefetch):
    ds = sluice.connect(endpoint).open("bench-tokens")
    loader = sluice.WindowLoader(ds, window=window, batch_size=batch, seed=seed, prefetch=prefetch)
    started = time.perf_counter()
    deadline = started + seconds
    done = 0
    for out in loader:
        assert out.shape == (batch, window)
        done += batch
        if time.perf_counter() >= deadline:
            break
    return done / (time.perf_counter() - started), len(loader.state_bytes())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256 << 20)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as tmp:
        tmp = pathlib.Path(tmp)
        path = tmp / "tokens.bin"
        np.random.default_rng(1).integers(0, 50_257, size=args.tokens, dtype=np.uint16).tofile(path)
        node = subprocess.Popen(
            [str(BIN / "sluiced"), "--data-dir", str(tmp / "node"), "--listen", "127.0.0.1:0",
             "--control", "127.0.0.1:0", "--io-mode", "buffered", "--insecure"],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "SLUICE_LOG": "warn"})
        endpoint = None
        for line in node.stdout:
            m = re.match(r"sluiced: control API on (\S+)", line)
            endpoint = endpoint or (m and m.group(1))
            if line.startswith("sluiced: data plane"):
                break
        try:
            ctl = lambda *a: subprocess.run([str(BIN / "sluicectl"), "--endpoint", endpoint, *a], check=True,
                                            capture_output=True)
            ctl("dataset", "create", "bench-tokens", "--kind", "tokens:u16")
            ctl("dataset", "ingest", "bench-tokens", str(path))
            ctl("dataset", "seal", "bench-tokens")
            with open(path, "rb") as f:  # warm the page cache for the memmap side too
                while f.read(16 << 20):
                    pass
            mm, index_bytes = memmap_loader(path, args.tokens, args.window, args.batch, 0, args.seconds)
            sl, state_bytes = sluice_loader(endpoint, args.window, args.batch, 0, args.seconds, args.prefetch)
        finally:
            node.terminate()
            node.wait()
    print(f"tokens {args.tokens}, window {args.window}, batch {args.batch}, {args.seconds:.0f} s each")
    print("| loader | windows/s | shuffle state |")
    print("| --- | --- | --- |")
    print(f"| numpy memmap, materialized shuffle index | {mm:,.0f} | {index_bytes:,} B |")
    print(f"| sluice WindowLoader over TCP (prefetch {args.prefetch}) | {sl:,.0f} | {state_bytes} B |")
    print(f"sluice / memmap: {sl / mm:.2f}")


if __name__ == "__main__":
    main()
