#!/usr/bin/env python3
"""The cache tier against one local S3-compatible server (moto), in one run:
random 1024-token windows read cold (read-through), warm (after
``dataset warm``), from an ingested copy of the same files, and by ranged
GETs straight from the client; a cold epoch's first steps through the
window loader with and without ``prefetch_steps``; and, where they are
installed, Mosaic Streaming and LitData streaming the same tokens from the
same server into their local caches (time to the first batch).

    python3 bench/source_tier.py [--objects N] [--object-mib M] [--steps N]

Needs release binaries (``cargo build --release --bins``) and, in one
environment, the ``sluice`` wheel, numpy, boto3 and ``moto[server]``;
``mosaicml-streaming`` and ``litdata`` for their rows. Prints Markdown.
The figures are ratios within this run; moto is a Python server, slower
than a real store, which favours whatever fetches least.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import random
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release"
WINDOW = 1024
BATCH = 32
# Cold starts per system for the time to the first batch.
FIRST_TRIES = 3
FIRST_DATASETS = tuple(f"first-{i}" for i in range(FIRST_TRIES))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(port: int) -> subprocess.Popen:
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return moto
        except OSError:
            time.sleep(0.1)
    raise SystemExit("moto did not start")


def start_node(work: pathlib.Path, env: dict) -> tuple[subprocess.Popen, str]:
    node = subprocess.Popen([str(BIN / "sluiced"), "--data-dir", str(work / "node"), "--insecure",
                             "--listen", "127.0.0.1:0", "--control", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, text=True, env=env)
    for line in node.stdout:
        if line.startswith("sluiced: control API on "):
            endpoint = line.split(" on ", 1)[1].strip()
        if line.startswith("sluiced: data plane"):
            return node, endpoint
    raise SystemExit("sluiced did not start")


def ctl(endpoint: str, *args: str) -> str:
    out = subprocess.run([str(BIN / "sluicectl"), "--endpoint", endpoint, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"sluicectl {args}: {out.stderr}")
    return out.stdout


def windows_per_s(read_batch, tokens: int, batches: int, seed: int) -> float:
    rng = random.Random(seed)
    started = time.perf_counter()
    for _ in range(batches):
        read_batch([(rng.randrange(tokens - WINDOW) * 2, WINDOW * 2) for _ in range(BATCH)])
    return batches * BATCH / (time.perf_counter() - started)


def records_per_s(read_batch, records: int, batches: int, seed: int) -> float:
    rng = random.Random(seed)
    started = time.perf_counter()
    for _ in range(batches):
        read_batch([(rng.randrange(records) * 4096, 4096) for _ in range(BATCH)])
    return batches * BATCH / (time.perf_counter() - started)


def in_turn(rate, reads: dict, rounds: int) -> dict:
    """The median rate of each reader over ``rounds`` rounds taken in turn
    on the same ranges, so that none has a noisy machine's quieter moments
    to itself; a round before them warms every reader up. The order turns
    round by round (A B, B A, ...), so that neither always goes first after
    the other has left the node's cores idle."""
    for read in reads.values():
        rate(read, 0)
    got = {name: [] for name in reads}
    for round_ in range(1, rounds + 1):
        order = list(reads.items())
        if round_ % 2 == 0:
            order.reverse()
        for name, read in order:
            got[name].append(rate(read, round_))
    return {name: sorted(rates)[len(rates) // 2] for name, rates in got.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=8)
    parser.add_argument("--object-mib", type=int, default=8)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of warm against ingested, taken in turn")
    args = parser.parse_args()

    import boto3
    import sluice

    work = pathlib.Path(tempfile.mkdtemp(prefix="sluice-source-bench-"))
    port = free_port()
    moto = start_moto(port)
    env = dict(os.environ, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ALLOW_HTTP="true",
               AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1",
               S3_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    os.environ.update({k: env[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                           "AWS_REGION", "S3_ENDPOINT_URL")})
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")
    s3.create_bucket(Bucket="bench")
    rng = np.random.default_rng(1)
    files = []
    for i in range(args.objects):
        data = rng.integers(0, 50_000, args.object_mib << 19, dtype="<u2").tobytes()
        s3.put_object(Bucket="bench", Key=f"tokens/{i:03}.bin", Body=data)
        path = work / f"{i:03}.bin"
        path.write_bytes(data)
        files.append(path)
    tokens = args.objects * (args.object_mib << 19)
    node, endpoint = start_node(work, env)
    rows = []
    try:
        for name in ("cold", "warm", "loader-plain", "loader-ahead", *FIRST_DATASETS):
            ctl(endpoint, "dataset", "create", name, "--kind", "tokens:u16", "--source", "s3://bench/tokens/")
        for name in ("rec-cold", "rec-warm"):
            ctl(endpoint, "dataset", "create", name, "--kind", "records", "--record-size", "4096",
                "--source", "s3://bench/tokens/")
        ctl(endpoint, "dataset", "create", "rec-ingested", "--kind", "records", "--record-size", "4096")
        ctl(endpoint, "dataset", "ingest", "rec-ingested", *map(str, files))
        ctl(endpoint, "dataset", "seal", "rec-ingested")
        ctl(endpoint, "dataset", "create", "ingested", "--kind", "tokens:u16")
        ctl(endpoint, "dataset", "ingest", "ingested", *map(str, files))
        ctl(endpoint, "dataset", "seal", "ingested")
        client = sluice.connect(endpoint)
        read = {name: client.open(name).read_batch
                for name in ("cold", "warm", "ingested", "rec-cold", "rec-warm", "rec-ingested")}
        started = time.perf_counter()
        ctl(endpoint, "dataset", "warm", "warm", "--parallel", "8")
        warm_seconds = time.perf_counter() - started
        ctl(endpoint, "dataset", "warm", "rec-warm", "--parallel", "8")

        def ranged_get(ranges):
            def one(r):
                offset, length = r
                obj, within = divmod(offset, args.object_mib << 20)
                if within + length > args.object_mib << 20:
                    within = (args.object_mib << 20) - length
                s3.get_object(Bucket="bench", Key=f"tokens/{obj:03}.bin",
                              Range=f"bytes={within}-{within + length - 1}")["Body"].read()
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(one, ranges))

        cold = windows_per_s(read["cold"], tokens, args.batches, 7)
        paired = in_turn(lambda read, seed: windows_per_s(read, tokens, args.batches, seed),
                         {"warm": read["warm"], "ingested": read["ingested"]}, args.rounds)
        warm, ingested = paired["warm"], paired["ingested"]
        direct = windows_per_s(ranged_get, tokens, max(args.batches // 10, 5), 9)
        rows += [("sluice, cold (read-through)", cold), ("sluice, warm", warm), ("sluice, ingested", ingested),
                 ("ranged GETs from the client (8 threads)", direct)]
        records = tokens * 2 // 4096
        rec = {"rec-cold": records_per_s(read["rec-cold"], records, args.batches, 11)}
        rec.update(in_turn(lambda read, seed: records_per_s(read, records, args.batches, seed),
                           {"rec-warm": read["rec-warm"], "rec-ingested": read["rec-ingested"]}, args.rounds))
        rec["direct"] = records_per_s(ranged_get, records, max(args.batches // 10, 5), 12)

        step_times = {}
        for name, ahead in (("loader-plain", 0), ("loader-ahead", 32)):
            loader = sluice.WindowLoader(client.open(name), window=WINDOW, batch_size=BATCH, seed=3,
                                         samples_per_epoch=BATCH * (args.steps + 10), prefetch_steps=ahead)
            times = []
            it = iter(loader)
            for _ in range(args.steps):
                begun = time.perf_counter()
                next(it)
                times.append(time.perf_counter() - begun)
            step_times[name] = times
        warm_step = BATCH / warm

        peers = []
        first_sluice = median_first([lambda name=name: sluice_first_batch(client, name, args.steps)
                                     for name in FIRST_DATASETS])
        peers.append(("Mosaic Streaming", peer_mosaic(work, files, s3)))
        peers.append(("LitData", peer_litdata(work, files, s3)))
    finally:
        node.terminate()
        node.wait()
        moto.terminate()

    print(f"{args.objects} objects of {args.object_mib} MiB on moto; {BATCH} random {WINDOW}-token windows a batch\n")
    print("| reader | windows/s | vs warm |")
    print("| --- | ---: | ---: |")
    for name, rate in rows:
        print(f"| {name} | {rate:,.0f} | {rate / warm:.2f} |")
    print(f"\nwarm and ingested: medians of {args.rounds} rounds taken in turn; warm source-backed/ingested: "
          f"{warm / ingested:.3f}; `dataset warm` took {warm_seconds:.1f} s\n")
    print(f"| 4 KiB records, {BATCH} a batch | records/s | vs warm |")
    print("| --- | ---: | ---: |")
    for name, label in (("rec-cold", "sluice, cold (read-through)"), ("rec-warm", "sluice, warm"),
                        ("rec-ingested", "sluice, ingested"), ("direct", "ranged GETs from the client (8 threads)")):
        print(f"| {label} | {rec[name]:,.0f} | {rec[name] / rec['rec-warm']:.2f} |")
    print()
    print("| cold epoch, first steps | first step (s) | median step after 5 (ms) | vs a warm step |")
    print("| --- | ---: | ---: | ---: |")
    for name, times in step_times.items():
        median = sorted(times[5:])[len(times[5:]) // 2]
        print(f"| {name} | {times[0]:.3f} | {median * 1e3:.2f} | {median / warm_step:.2f} |")
    print(f"\n| time to first batch from cold (median of {FIRST_TRIES} cold starts) | seconds |")
    print("| --- | ---: |")
    print(f"| sluice (prefetch_steps = 32) | {first_sluice} |")
    for name, seconds in peers:
        print(f"| {name} | {seconds} |")


def first_batch(make) -> float:
    """Seconds from making a peer's dataset to its first BATCH samples."""
    started = time.perf_counter()
    it = iter(make())
    for _ in range(BATCH):
        next(it)
    return time.perf_counter() - started


def median_first(starts) -> str:
    """The median of several cold starts, each from nothing on the node or
    in a local cache: one start is at the mercy of one slow response."""
    seconds = sorted(start() for start in starts)
    return f"{seconds[len(seconds) // 2]:.3f} ({', '.join(f'{s:.3f}' for s in seconds)})"


def sluice_first_batch(client, name: str, steps: int) -> float:
    """Seconds from opening a cold source-backed dataset to the first batch
    of a window loader with ``prefetch_steps = 32``, as a job starts."""
    import sluice
    started = time.perf_counter()
    loader = sluice.WindowLoader(client.open(name), window=WINDOW, batch_size=BATCH, seed=3,
                                 samples_per_epoch=BATCH * (steps + 10), prefetch_steps=32)
    next(iter(loader))
    return time.perf_counter() - started


def peer_mosaic(work: pathlib.Path, files, s3) -> str:
    try:
        from streaming import MDSWriter, StreamingDataset
    except ImportError as err:
        return f"not installed ({err})"
    try:
        out = work / "mds"
        with MDSWriter(out=str(out), columns={"x": "bytes"}, size_limit=1 << 26) as writer:
            for path in files:
                data = path.read_bytes()
                for at in range(0, len(data) - WINDOW * 2, WINDOW * 2):
                    writer.write({"x": data[at:at + WINDOW * 2]})
        for item in out.iterdir():
            s3.upload_file(str(item), "bench", f"mds/{item.name}")
        return median_first([lambda i=i: first_batch(lambda: StreamingDataset(
            remote="s3://bench/mds", local=str(work / f"mds-cache-{i}"), shuffle=True, batch_size=BATCH))
            for i in range(FIRST_TRIES)])
    except Exception as err:  # a peer that cannot run here is reported, not fatal
        return f"failed: {type(err).__name__}: {err}"[:200]


def peer_litdata(work: pathlib.Path, files, s3) -> str:
    try:
        import litdata
    except ImportError as err:
        return f"not installed ({err})"
    try:
        # LitData's own S3 path (obstore) builds its client without
        # allow_http, so a plain-HTTP endpoint such as this loopback
        # server is refused ("builder error"): allowed here, as a user of
        # an on-premises S3 over HTTP would have to.
        import litdata.streaming.downloader as downloader
        if isinstance(getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None), dict):
            downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
        windows = [(str(p), at) for p in files for at in range(0, p.stat().st_size - WINDOW * 2, WINDOW * 2)]
        out = work / "lit"
        litdata.optimize(fn=_lit_window, inputs=windows, output_dir=str(out), chunk_bytes="64MB", num_workers=1)
        for item in out.iterdir():
            s3.upload_file(str(item), "bench", f"lit/{item.name}")
        return median_first([lambda i=i: first_batch(lambda: litdata.StreamingDataset(
            "s3://bench/lit", shuffle=True, seed=1, cache_dir=str(work / f"lit-cache-{i}")))
            for i in range(FIRST_TRIES)])
    except Exception as err:  # a peer that cannot run here is reported, not fatal
        return f"failed: {type(err).__name__}: {err}"[:200]


def _lit_window(item):
    path, at = item
    with open(path, "rb") as f:
        f.seek(at)
        return f.read(WINDOW * 2)


if __name__ == "__main__":
    main()
