#!/usr/bin/env python3
"""sluice.torch next to the loaders PyTorch users reach for, on the same
samples, in one run: Mosaic Streaming (MDS written locally), LitData
(``litdata.optimize`` locally, one item a sample, and for windows also
token chunks read by ``TokensLoader`` as LitGPT reads them) and WebDataset
(tar shards), each through a DataLoader with the same workers and batch
size; and sluice.torch again over the very MDS shards Mosaic reads (an
``mds`` dataset, decoded by its columns) and over the very token chunks
LitData reads (ingested by ``sluicectl`` from LitData's directory).

Two workloads: random token windows (fixed windows of ``--window`` uint16
tokens, one sample each for the peers; sluice reads them from one token
dataset) and variable-size records. For each system: samples/s over
``--steps`` batches after the first, time to the first batch, time to the
first batch of a loader resumed at step ``--resume-step``, and the size of
the state that resume needs.

    python3 bench/python_peers.py [--windows N] [--records N] [--steps N]

Needs release binaries (``cargo build --release --bins``) and, in one
environment, the ``sluice`` wheel, torch, mosaicml-streaming, litdata and
webdataset. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from torch.utils.data import DataLoader

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release"


def timed_run(make_loader, steps):
    """(seconds to the first batch, samples/s over `steps` batches after it)."""
    started = time.perf_counter()
    it = iter(make_loader())
    first = next(it)
    to_first = time.perf_counter() - started
    samples, begun = 0, time.perf_counter()
    for _ in range(steps):
        batch = next(it)
        samples += len(batch)
    rate = samples / (time.perf_counter() - begun)
    del it
    assert len(first) > 0
    return to_first, rate


def first_batch_seconds(make_loader):
    started = time.perf_counter()
    next(iter(make_loader()))
    return time.perf_counter() - started


class Node:
    def __init__(self, workdir):
        self.proc = subprocess.Popen(
            [str(BIN / "sluiced"), "--data-dir", str(workdir / "node"), "--listen", "127.0.0.1:0",
             "--control", "127.0.0.1:0", "--io-mode", "buffered", "--insecure"],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "SLUICE_LOG": "warn"})
        self.endpoint = None
        for line in self.proc.stdout:
            m = re.match(r"sluiced: control API on (\S+)", line)
            self.endpoint = self.endpoint or (m and m.group(1))
            if line.startswith("sluiced: data plane"):
                break

    @classmethod
    def attach(cls, work):
        """The node `prepare` started, from another process."""
        node = cls.__new__(cls)
        node.proc, node.endpoint = None, (work / "endpoint").read_text()
        return node

    def ctl(self, *args):
        subprocess.run([str(BIN / "sluicectl"), "--endpoint", self.endpoint, *args], check=True, capture_output=True)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def sluice_rows(node, kind, name, args, mds=False):
    """sluice.torch over its own token or records dataset, or (``mds``)
    over an ``mds`` dataset of the very shards Mosaic Streaming reads,
    decoded as it decodes them."""
    import sluice
    from sluice.torch import MdsDataset, RecordDataset, WindowDataset

    def dataset():
        if mds:
            return MdsDataset(node.endpoint, name, batch_size=args.batch, seed=1)
        if kind == "windows":
            return WindowDataset(node.endpoint, name, window=args.window, batch_size=args.batch, seed=1,
                                 samples_per_epoch=args.windows)
        return RecordDataset(node.endpoint, name, batch_size=args.batch, seed=1)

    def loader(ds=None):
        return DataLoader(ds or dataset(), batch_size=None, num_workers=args.workers)

    to_first, rate = timed_run(loader, args.steps)
    probe = dataset()
    state = probe.state_dict()
    state["sampler"]["next_sample"] = args.resume_step * args.batch
    state["sampler"]["epoch"] = 0
    position = sluice.loader_position({"w": state})

    def resumed():
        ds = dataset()
        ds.load_state_dict(position)
        return loader(ds)

    return to_first, rate, first_batch_seconds(resumed), len(json.dumps(position))


def _collate(kind):
    """Windows stack into one tensor; records stay a list of samples."""
    return None if kind == "windows" else list


def _resumable_rows(loader, args, probe_steps, at_resume_step):
    """A peer with a resumable loader: time to the first batch and rate, then a
    state saved after `probe_steps` batches, moved to the resume step by
    `at_resume_step`, timed to its first batch; and the state's size."""
    to_first, rate = timed_run(loader, args.steps)
    probe = loader()
    it = iter(probe)
    for _ in range(probe_steps):
        next(it)
    state = probe.state_dict()
    del it
    at_resume_step(state)
    return to_first, rate, first_batch_seconds(lambda: loader(state)), len(json.dumps(state))


def mosaic_rows(kind, directory, args):
    from streaming import StreamingDataLoader, StreamingDataset

    def loader(state=None):
        ds = StreamingDataset(local=str(directory), shuffle=True, shuffle_seed=1, batch_size=args.batch)
        dl = StreamingDataLoader(ds, batch_size=args.batch, num_workers=args.workers, collate_fn=_collate(kind))
        if state is not None:
            dl.load_state_dict(state)
        return dl

    def at_resume_step(state):
        state["sample_in_epoch"] = args.resume_step * args.batch

    return _resumable_rows(loader, args, 1, at_resume_step)


def litdata_rows(kind, directory, args, tokens=False):
    """LitData over its own chunks: one item a sample, or (``tokens``)
    blocks of ``--window`` tokens cut by ``TokensLoader`` from token
    chunks, as LitGPT reads its pretraining data."""
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import TokensLoader

    def loader(state=None):
        item_loader = TokensLoader(block_size=args.window) if tokens else None
        ds = StreamingDataset(str(directory), item_loader=item_loader, shuffle=True, seed=1)
        collate = _collate(kind) if kind == "windows" else _lit_records
        dl = StreamingDataLoader(ds, batch_size=args.batch, num_workers=args.workers, collate_fn=collate)
        if state is not None:
            dl.load_state_dict(state)
        return dl

    def at_resume_step(state):
        samples = args.resume_step * args.batch
        state["num_samples_yielded"] = samples
        state["dataset"]["num_samples_yielded"] = samples

    return _resumable_rows(loader, args, 3, at_resume_step)


def wds_rows(shards, args, decode):
    import webdataset as wds

    def loader():
        collate = _stack if decode is _wds_window else list
        pipeline = (wds.WebDataset([str(s) for s in shards], shardshuffle=len(shards), seed=1, empty_check=False)
                    .shuffle(1000).map(decode).batched(args.batch, collation_fn=collate))
        return DataLoader(pipeline, batch_size=None, num_workers=args.workers)

    to_first, rate = timed_run(loader, args.steps)
    return to_first, rate, None, None


SYSTEMS = ("sluice.torch", "sluice.torch (Mosaic's MDS shards)", "sluice.torch (LitData's token chunks)",
           "Mosaic Streaming (MDS)", "LitData", "LitData (TokensLoader)", "WebDataset")
# Token chunks hold windows alone.
WINDOWS_ONLY = ("sluice.torch (LitData's token chunks)", "LitData (TokensLoader)")


def measure(system, kind, work, args):
    """One system on one workload, in this process: a row's figures."""
    if system == "sluice.torch":
        node = Node.attach(work)
        return sluice_rows(node, kind, "toks" if kind == "windows" else "recs", args)
    if system == "sluice.torch (Mosaic's MDS shards)":
        return sluice_rows(Node.attach(work), kind, f"mds-{kind}", args, mds=True)
    if system == "sluice.torch (LitData's token chunks)":
        return sluice_rows(Node.attach(work), kind, "lit-toks", args)
    if system == "LitData (TokensLoader)":
        return litdata_rows(kind, work / "lit-tokens", args, tokens=True)
    if system == "Mosaic Streaming (MDS)":
        return mosaic_rows(kind, work / f"mds-{kind}", args)
    if system == "LitData":
        return litdata_rows(kind, work / f"lit-{kind}", args)
    decode = _wds_window if kind == "windows" else _wds_record
    return wds_rows(sorted(work.glob(f"wds-{kind}-*.tar")), args, decode)


def prepare(work, args):
    """The same samples in each system's format, and a node serving them."""
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 50_257, size=args.windows * args.window, dtype=np.uint16)
    windows = tokens.reshape(args.windows, args.window)
    sizes = rng.integers(64, 2048, size=args.records)
    blob = rng.integers(0, 256, size=int(sizes.sum()), dtype=np.uint8).tobytes()
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype("<u8")
    records = [blob[offsets[i]:offsets[i + 1]] for i in range(args.records)]
    node = Node(work)
    np.save(work / "tokens.npy", tokens)
    node.ctl("dataset", "create", "toks", "--kind", "tokens:u16")
    node.ctl("dataset", "ingest", "toks", str(work / "tokens.npy"))
    node.ctl("dataset", "seal", "toks")
    (work / "recs.bin").write_bytes(blob)
    (work / "recs.idx").write_bytes(offsets.tobytes())
    node.ctl("dataset", "create", "recs", "--kind", "records")
    node.ctl("dataset", "ingest", "recs", str(work / "recs.bin"), "--index", str(work / "recs.idx"))
    node.ctl("dataset", "seal", "recs")
    (work / "endpoint").write_text(node.endpoint)

    from streaming import MDSWriter

    for kind, samples, column in (("windows", windows, f"ndarray:uint16:{args.window}"),
                                  ("records", records, "bytes")):
        with MDSWriter(out=str(work / f"mds-{kind}"), columns={"x": column}, size_limit=1 << 26) as writer:
            for sample in samples:
                writer.write({"x": sample})
        node.ctl("dataset", "create", f"mds-{kind}", "--kind", "mds")
        node.ctl("dataset", "ingest", f"mds-{kind}", *map(str, sorted((work / f"mds-{kind}").glob("shard.*.mds"))))
        node.ctl("dataset", "seal", f"mds-{kind}")

    import contextlib

    import litdata

    # optimize's chatter would land in the table on stdout.
    with contextlib.redirect_stdout(sys.stderr):
        items = (("windows", [w.copy() for w in windows], _identity), ("records", records, _as_item))
        for kind, samples, fn in items:
            litdata.optimize(fn=fn, inputs=samples, output_dir=str(work / f"lit-{kind}"), chunk_bytes="64MB",
                             num_workers=1, mode="overwrite")

        # The same tokens as LitData token chunks (64 runs, about 8 Mi tokens
        # a chunk), and those very chunks ingested by sluicectl.
        from litdata.streaming.item_loader import TokensLoader

        litdata.optimize(fn=_identity, inputs=list(np.array_split(tokens, 64)), output_dir=str(work / "lit-tokens"),
                         chunk_size=args.window * 8192, item_loader=TokensLoader(), num_workers=1, mode="overwrite")
        node.ctl("dataset", "create", "lit-toks", "--kind", "tokens:u16")
        node.ctl("dataset", "ingest", "lit-toks", str(work / "lit-tokens"))
        node.ctl("dataset", "seal", "lit-toks")

    import webdataset as wds

    for kind, samples in (("windows", windows), ("records", records)):
        per_shard = -(-len(samples) // 8)
        for shard in range(8):
            with wds.TarWriter(str(work / f"wds-{kind}-{shard}.tar")) as sink:
                for i in range(shard * per_shard, min(len(samples), (shard + 1) * per_shard)):
                    data = samples[i].tobytes() if kind == "windows" else samples[i]
                    sink.write({"__key__": f"{i:08}", "bin": data})
    return node


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--windows", type=int, default=96_000, help="token windows (samples)")
    parser.add_argument("--records", type=int, default=96_000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--resume-step", type=int, default=10_000)
    parser.add_argument("--timeout", type=float, default=600, help="seconds one system may take on one workload")
    parser.add_argument("--one", nargs=3, metavar=("SYSTEM", "KIND", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        system, kind, work = args.one
        print(json.dumps(measure(system, kind, pathlib.Path(work), args)))
        return
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/var/tmp")) as tmp:
        work = pathlib.Path(tmp)
        node = prepare(work, args)
        try:
            for kind in ("windows", "records"):
                for system in (s for s in SYSTEMS if kind == "windows" or s not in WINDOWS_ONLY):
                    # Each in a process of its own: no system inherits
                    # another's workers, shared memory or page-cache warmth
                    # beyond the files themselves.
                    command = [sys.executable, __file__, *sys.argv[1:], "--one", system, kind, str(work)]
                    try:
                        out = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
                        figures = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
                        note = None if figures else (out.stderr.strip().splitlines() or ["failed"])[-1]
                    except subprocess.TimeoutExpired:
                        figures, note = None, f"no result within {args.timeout:.0f} s"
                    rows.append((kind, system, figures, note))
                    print(kind, system, figures or note, file=sys.stderr, flush=True)
        finally:
            node.stop()

    print(f"{args.windows} windows of {args.window} uint16 tokens, {args.records} records of 64-2047 B; "
          f"batch {args.batch}, {args.workers} DataLoader workers, {args.steps} batches timed; "
          f"resume at step {args.resume_step}; torch {torch.__version__}")
    print()
    print("| workload | system | samples/s | first batch s | resume: first batch s | resume state bytes |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for kind, system, figures, note in rows:
        if figures is None:
            print(f"| {kind} | {system} | {note} | | | |")
            continue
        to_first, rate, resume, state = figures
        resume_s = f"{resume:.2f}" if resume is not None else "no resume (replays from the start)"
        state_s = f"{state}" if state is not None else "-"
        print(f"| {kind} | {system} | {rate:,.0f} | {to_first:.2f} | {resume_s} | {state_s} |")
    for kind in ("windows", "records"):
        ours = [r[2][1] for r in rows if r[0] == kind and r[1] == "sluice.torch" and r[2]]
        peers = [r[2][1] for r in rows if r[0] == kind and not r[1].startswith("sluice") and r[2]]
        if ours and peers:
            print(f"\n{kind}: sluice / best peer samples/s = {ours[0] / max(peers):.2f}")


def _stack(windows):
    return torch.from_numpy(np.stack(windows))


def _identity(sample):
    return sample


def _lit_records(items):
    """LitData hands out each record as a memoryview; bytes cross processes."""
    return [bytes(item["x"]) for item in items]


def _as_item(record):
    """A LitData item holding one record's bytes."""
    return {"x": record}


def _wds_window(sample):
    return np.frombuffer(sample["bin"], dtype="<u2")


def _wds_record(sample):
    return sample["bin"]


if __name__ == "__main__":
    main()
