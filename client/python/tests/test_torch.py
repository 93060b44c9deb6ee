"""The PyTorch datasets against a real sluiced: worker and rank split, exact
resume through torchdata's StatefulDataLoader, fork and spawn, mixtures,
WebDataset and Mosaic (MDS) interop, zero-copy reads, and the errors a job
sees."""

import io
import json
import random
import subprocess
import sys
import tarfile
import textwrap
import time

import numpy as np
import pytest

import sluice

from conftest import need

torch = need("torch")
from torch.utils.data import DataLoader  # noqa: E402

from sluice.torch import (  # noqa: E402
    MdsDataset, MixtureDataset, RecordDataset, WdsDataset, WindowDataset, loader_position,
)

RECORDS = 240


def records_dataset(node, work, name, samples):
    """A sealed records dataset ``name`` of ``samples``, ingested with
    their offsets."""
    data, offsets = bytearray(), [0]
    for sample in samples:
        data += sample
        offsets.append(len(data))
    (work / f"{name}.bin").write_bytes(bytes(data))
    (work / f"{name}.idx").write_bytes(np.array(offsets, dtype="<u8").tobytes())
    node.ctl("dataset", "create", name, "--kind", "records")
    node.ctl("dataset", "ingest", name, str(work / f"{name}.bin"), "--index", str(work / f"{name}.idx"))
    node.ctl("dataset", "seal", name)
    return name


@pytest.fixture(scope="module")
def records(node, tmp_path_factory):
    """A records dataset whose record ``i`` starts with ``i`` (8 bytes LE)
    and runs to ``i % 50`` bytes more."""
    samples = (i.to_bytes(8, "little") + bytes([i % 251]) * (i % 50) for i in range(RECORDS))
    return records_dataset(node, tmp_path_factory.mktemp("records"), "recs", samples)


def numbers(batch):
    return [int.from_bytes(sample[:8], "little") for sample in batch]


def run(ds, num_workers, context=None, steps=None):
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers,
                        multiprocessing_context=context if num_workers else None)
    out = []
    for batch in loader:
        out.append(batch)
        if steps is not None and len(out) == steps:
            break
    return out


def saved_after(make, k, uninterrupted):
    """The state of a StatefulDataLoader over ``make()`` with two forked
    workers after ``k`` batches, which must be ``uninterrupted``'s first;
    a new loader given that state (the DataLoader's own protocol, the same
    worker count) must read the rest."""
    need("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader

    first = StatefulDataLoader(make(), batch_size=None, num_workers=2, multiprocessing_context="fork")
    taken = []
    for batch in first:
        taken.append(numbers(batch))
        if len(taken) == k:
            saved = first.state_dict()
            break
    assert taken == uninterrupted[:k]
    del first
    again = StatefulDataLoader(make(), batch_size=None, num_workers=2, multiprocessing_context="fork")
    again.load_state_dict(saved)
    assert [numbers(b) for b in again] == uninterrupted[k:]
    return saved


@pytest.mark.parametrize(("num_workers", "context"), [(0, None), (2, "fork"), (3, "fork"), (2, "spawn"), (3, "spawn")])
def test_an_epoch_splits_over_workers_and_ranks_exactly(node, records, num_workers, context):
    seen = []
    per_rank = []
    for rank in range(2):
        ds = RecordDataset(node.endpoint, records, batch_size=6, seed=3, rank=rank, world_size=2)
        batches = run(ds, num_workers, context)
        assert all(len(b) == 6 for b in batches)
        per_rank.append([numbers(b) for b in batches])
        seen += [n for b in batches for n in numbers(b)]
    assert sorted(seen) == list(range(RECORDS)), "every record of the epoch once, across workers and ranks"
    # The order does not depend on the worker count.
    alone = [numbers(b) for b in run(RecordDataset(node.endpoint, records, 6, 3, rank=0, world_size=2), 0)]
    assert per_rank[0] == alone


def test_a_dataset_built_before_init_process_group_takes_the_launchers_rank(node, records, monkeypatch):
    # torchrun sets RANK and WORLD_SIZE before the job initializes
    # torch.distributed; a dataset built then must not read as rank 0 of 1.
    assert not torch.distributed.is_initialized()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    launched = RecordDataset(node.endpoint, records, batch_size=6, seed=3)
    assert (launched.rank, launched.world_size) == (1, 2)
    explicit = RecordDataset(node.endpoint, records, batch_size=6, seed=3, rank=1, world_size=2)
    assert [numbers(b) for b in run(launched, 0)] == [numbers(b) for b in run(explicit, 0)]
    # What is passed wins over the environment.
    assert RecordDataset(node.endpoint, records, 6, 3, rank=0).rank == 0

    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ValueError, match="RANK='one'"):
        RecordDataset(node.endpoint, records, batch_size=6, seed=3)
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="WORLD_SIZE is set in the environment but RANK is not"):
        RecordDataset(node.endpoint, records, batch_size=6, seed=3)
    assert RecordDataset(node.endpoint, records, 6, 3, rank=1).world_size == 2, "unless the missing one is passed"
    monkeypatch.delenv("WORLD_SIZE")
    alone = RecordDataset(node.endpoint, records, batch_size=6, seed=3)
    assert (alone.rank, alone.world_size) == (0, 1)


def test_persistent_workers_read_each_epoch_as_fresh_workers_do(node, records):
    # A persistent worker keeps its copy of the dataset between epochs, so
    # the main process's set_epoch never reaches it: it advances its own.
    def fresh(epoch):
        ds = RecordDataset(node.endpoint, records, batch_size=6, seed=3)
        ds.set_epoch(epoch)
        return [numbers(b) for b in run(ds, 2, "fork")]

    ds = RecordDataset(node.endpoint, records, batch_size=6, seed=3)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context="fork")
    epochs = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        epochs.append([numbers(b) for b in loader])
    assert epochs[0] != epochs[1], "a new epoch, a new order"
    assert epochs == [fresh(0), fresh(1), fresh(2)]
    assert len(loader) == len(epochs[0]) == RECORDS // 6, "len() is the epoch's batches"


def test_token_windows_come_out_in_the_same_order_at_any_worker_count(node, tokens):
    def windows(num_workers):
        ds = WindowDataset(node.endpoint, "toks", window=16, batch_size=4, seed=9, samples_per_epoch=64)
        return run(ds, num_workers, "fork")

    straight = windows(0)
    assert len(straight) == 16
    assert straight[0].dtype == torch.uint16, "the dataset's dtype, not int64"
    for num_workers in (2, 3):
        assert all(torch.equal(a, b) for a, b in zip(straight, windows(num_workers), strict=True))
    # Every window is the dataset's tokens at its start.
    ds = WindowDataset(node.endpoint, "toks", window=16, batch_size=4, seed=9, samples_per_epoch=64, as_int64=True)
    batch = next(iter(ds))
    assert batch.dtype == torch.int64
    for row, start in zip(batch.numpy(), ds.last_starts):
        assert (row == tokens[start:start + 16]).all()


def test_state_survives_a_resume_with_other_workers_and_world_size(node, records):
    def dataset(rank=0, world=1):
        return RecordDataset(node.endpoint, records, batch_size=8, seed=5, rank=rank, world_size=world)

    uninterrupted = [numbers(b) for b in run(dataset(), 0)]
    assert len(uninterrupted) == RECORDS // 8
    k = 7
    saved = saved_after(dataset, k, uninterrupted)

    # Another worker count and world size: the merged position.
    position = loader_position(saved)
    assert len(json.dumps(position)) < 1024, "a state of a few hundred bytes"
    ranks = []
    for rank in range(2):
        ds = dataset(rank, 2)
        ds.load_state_dict(position)
        ranks.append([numbers(b) for b in run(ds, 3, "spawn")])
    joined = [a + b for a, b in zip(*ranks, strict=True)]
    assert joined == uninterrupted[k:], "each step's samples, split over the new ranks"

    # Without workers the dataset's own state resumes too.
    ds = dataset()
    it = iter(ds)
    for _ in range(k):
        next(it)
    state = ds.state_dict()
    fresh = dataset()
    fresh.load_state_dict(state)
    assert [numbers(b) for b in fresh] == uninterrupted[k:]


SMALL = 60
SMALL_FIRST = 10_000


@pytest.fixture(scope="module")
def small_records(node, tmp_path_factory):
    """A second records dataset, a quarter the size: record ``i`` starts
    with ``SMALL_FIRST + i``."""
    samples = ((SMALL_FIRST + i).to_bytes(8, "little") + b"s" * (i % 7) for i in range(SMALL))
    return records_dataset(node, tmp_path_factory.mktemp("small"), "small", samples)


def test_a_mixture_holds_each_share_in_every_batch_and_resumes_anywhere(node, records, small_records):
    def mixture(rank=0, world=1):
        big = RecordDataset(node.endpoint, records, batch_size=6, seed=3, rank=rank, world_size=world)
        small = RecordDataset(node.endpoint, small_records, batch_size=2, seed=4, rank=rank, world_size=world)
        return MixtureDataset([big, small])

    def stream(name, batch_size, seed, epoch):
        ds = RecordDataset(node.endpoint, name, batch_size=batch_size, seed=seed)
        ds.set_epoch(epoch)
        return [numbers(b) for b in run(ds, 0)]

    # An epoch reads as many samples as the two hold: (240 + 60) / 8 steps.
    steps = -(-(RECORDS + SMALL) // 8)
    uninterrupted = [numbers(b) for b in run(mixture(), 0)]
    assert len(uninterrupted) == steps == len(mixture())
    # Every batch: six of the first dataset, then two of the second, each
    # its own sequence, step for step; the small one (30 steps an epoch)
    # runs into its next epoch's order.
    assert [b[:6] for b in uninterrupted] == stream(records, 6, 3, 0)[:steps]
    assert [b[6:] for b in uninterrupted] == (stream(small_records, 2, 4, 0) + stream(small_records, 2, 4, 1))[:steps]
    for num_workers, context in ((3, "fork"), (2, "spawn")):
        assert [numbers(b) for b in run(mixture(), num_workers, context)] == uninterrupted, num_workers

    # Saved after 7 steps by two workers, resumed by the same DataLoader,
    # then by three workers on each of two ranks from the merged position.
    k = 7
    saved = saved_after(mixture, k, uninterrupted)
    position = loader_position(saved)
    assert len(json.dumps(position)) < 2048 and json.loads(json.dumps(position)) == position
    ranks = []
    for rank in range(2):
        ds = mixture(rank, 2)
        ds.load_state_dict(position)
        ranks.append([numbers(b) for b in run(ds, 3, "fork")])
    # Each rank takes its half of each dataset's share of a step.
    joined = [a[:3] + b[:3] + a[3:] + b[3:] for a, b in zip(*ranks, strict=True)]
    assert joined == uninterrupted[k:]

    # The next epoch goes on where each sequence stood.
    ds = mixture()
    ds.set_epoch(1)
    second = [numbers(b) for b in run(ds, 0)]
    assert [b[:6] for b in second] == (stream(records, 6, 3, 0) + stream(records, 6, 3, 1))[steps:2 * steps]
    assert [b[6:] for b in second] == (stream(small_records, 2, 4, 1) + stream(small_records, 2, 4, 2))[steps - 30:2 * steps - 30]


def test_a_token_mixture_is_one_array_written_in_place(node, tokens):
    def mixture(steps_per_epoch=None):
        wide = WindowDataset(node.endpoint, "toks", window=16, batch_size=3, seed=9)
        narrow = WindowDataset(node.endpoint, "toks", window=16, batch_size=1, seed=11)
        return MixtureDataset([wide, narrow], steps_per_epoch=steps_per_epoch)

    ds = mixture(steps_per_epoch=5)
    batches = run(ds, 2, "fork")
    assert len(batches) == 5 and all(b.shape == (4, 16) and b.dtype == torch.uint16 for b in batches)
    alone = WindowDataset(node.endpoint, "toks", window=16, batch_size=3, seed=9)
    assert torch.equal(batches[0][:3], next(iter(alone)))
    it = iter(ds)
    batch = next(it)
    assert len(ds.last_starts) == 4
    for row, start in zip(batch.numpy(), ds.last_starts):
        assert (row == tokens[start:start + 16]).all()
    # A state names the next step; the saved epoch length wins.
    state = ds.state_dict()
    assert state["next_step"] == 1 and state["steps_per_epoch"] == 5
    resumed = mixture()
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert len(resumed) == 5
    assert all(torch.equal(a, b) for a, b in zip(run(resumed, 0), batches[1:], strict=True))


def test_a_mixture_refuses_what_it_cannot_mix(node, records, small_records):
    def recs(name=records, batch_size=2):
        return RecordDataset(node.endpoint, name, batch_size=batch_size, seed=1)

    windows = WindowDataset(node.endpoint, "toks", window=16, batch_size=2, seed=1)
    with pytest.raises(ValueError, match="one kind"):
        MixtureDataset([windows, recs()])
    with pytest.raises(ValueError, match="one window length"):
        MixtureDataset([windows, WindowDataset(node.endpoint, "toks", window=8, batch_size=2, seed=1)])
    with pytest.raises(ValueError, match="one rank"):
        MixtureDataset([recs(), RecordDataset(node.endpoint, records, 2, 1, rank=1, world_size=2)])
    same = recs()
    with pytest.raises(ValueError, match="appears twice"):
        MixtureDataset([same, same])
    with pytest.raises(ValueError, match="at least one"):
        MixtureDataset([])

    state = MixtureDataset([recs(), recs(small_records)]).state_dict()
    with pytest.raises(sluice.StateMismatch, match="mixture of 2 streams cannot resume one of 3"):
        MixtureDataset([recs(), recs(small_records), recs()]).load_state_dict(state)
    with pytest.raises(sluice.StateMismatch, match="cannot resume"):
        recs().load_state_dict(state)
    swapped = MixtureDataset([recs(small_records), recs()])
    with pytest.raises(sluice.StateMismatch, match="dataset"):
        swapped.load_state_dict(state)
        next(iter(swapped))
    plain = {"worker": recs().state_dict()}
    with pytest.raises(sluice.StateMismatch, match="states of 2 datasets"):
        loader_position({"a": state, **plain})


def test_a_parent_that_used_the_client_does_not_hang(node, records):
    """The parent connects (state_dict) before the DataLoader forks its
    workers: each worker connects again instead of using the parent's
    runtime, whose threads did not survive the fork."""
    script = textwrap.dedent(f"""
        import sluice
        from torch.utils.data import DataLoader
        from sluice.torch import RecordDataset
        ds = RecordDataset({node.endpoint!r}, {records!r}, batch_size=8, seed=1)
        ds.state_dict()
        client = sluice.connect({node.endpoint!r})
        client.open({records!r}).read_batch([(0, 8)])
        import os
        pid = os.fork()
        if pid == 0:
            try:
                client.open({records!r})
            except sluice.Forked as err:
                os._exit(0 if "fork" in str(err) else 3)
            os._exit(4)
        assert os.waitpid(pid, 0)[1] == 0, "a forked child is refused its parent's client"
        batches = list(DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork"))
        assert sorted(int.from_bytes(s[:8], "little") for b in batches for s in b) == list(range({RECORDS}))
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_webdataset_shards_read_back_as_webdataset_reads_them(node, tmp_path):
    webdataset = need("webdataset")
    rng = random.Random(4)
    shards = []
    for shard in range(3):
        path = tmp_path / f"shard-{shard:03}.tar"
        with webdataset.TarWriter(str(path)) as sink:
            for _ in range(21):
                key = f"s{shard}/{rng.getrandbits(40):010x}"
                sample = {"__key__": key, "txt": "é" * rng.randrange(0, 50), "cls": str(rng.randrange(10)),
                          "json": json.dumps({"n": rng.random()})}
                if rng.random() < 0.3:
                    sample["bin"] = b""
                if rng.random() < 0.2:
                    sample["big.bin"] = rng.randbytes(300_000)
                sink.write(sample)
            # Keys only a pax header holds whole (tarfile's default format):
            # past the ustar name's 100 bytes, and beyond ASCII.
            sink.write({"__key__": f"s{shard}/" + "deep-directory/" * 8 + "000001", "txt": "long", "cls": "1"})
            sink.write({"__key__": f"s{shard}/données-{shard}", "txt": "accents", "cls": "2"})
            sink.write({"__key__": f"s{shard}/donn?es-{shard}", "txt": "ascii", "cls": "3"})
        shards.append(path)
    # Members WebDataset passes over (metadata, names without an extension)
    # and extensions it lowercases, in a shard written by tarfile itself.
    path = tmp_path / "shard-003.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in [("__meta__/info.json", b"{}"), ("x/0001.JPG", b"jpeg"), ("README", b"stray"),
                           ("x/0001.Cls", b"1"), ("x/0002.txt", b"two"), ("x/.hidden", b"dot"),
                           ("x/0003.TXT", b"three")]:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    shards.append(path)
    node.ctl("dataset", "create", "wds", "--kind", "wds")
    for path in shards:
        node.ctl("dataset", "ingest", "wds", str(path))
    node.ctl("dataset", "seal", "wds")

    expected = {}
    for sample in webdataset.WebDataset([str(p) for p in shards], shardshuffle=False):
        expected[sample["__key__"]] = {k: v for k, v in sample.items() if not k.startswith("__")}
    assert len(expected) == 3 * 24 + 4
    got = {}
    for batch in run(WdsDataset(node.endpoint, "wds", batch_size=4, seed=2), 2, "fork"):
        for sample in batch:
            got[sample.pop("__key__")] = sample
    assert got == expected

    decoded = next(iter(WdsDataset(node.endpoint, "wds", batch_size=2, seed=2, decode="basic")))[0]
    assert isinstance(decoded["txt"], str) and isinstance(decoded["cls"], int) and "n" in decoded["json"]


def test_webdataset_image_decoders_decode_as_webdataset_does(node, tmp_path):
    webdataset = need("webdataset")
    image = need("PIL.Image")
    rng = np.random.default_rng(6)
    path = tmp_path / "images-000.tar"
    with webdataset.TarWriter(str(path)) as sink:
        for i in range(8):
            png = io.BytesIO()
            image.fromarray(rng.integers(0, 256, (5 + i, 7, 3), dtype=np.uint8)).save(png, "PNG")
            sink.write({"__key__": f"img/{i:04}", "png": png.getvalue(), "cls": str(i), "json": json.dumps([i])})
    node.ctl("dataset", "create", "images", "--kind", "wds")
    node.ctl("dataset", "ingest", "images", str(path))
    node.ctl("dataset", "seal", "images")

    def plain(value):
        # The DataLoader turns arrays into tensors; the pixels must agree.
        if isinstance(value, torch.Tensor):
            value = value.numpy()
        if isinstance(value, image.Image):
            return ("image", value.mode, value.size, np.asarray(value).tolist())
        if isinstance(value, np.ndarray):
            return ("array", str(value.dtype), value.tolist())
        return value

    for spec in ("rgb8", "l8", "torchrgb", "pil"):
        expected = {}
        for sample in webdataset.WebDataset(str(path), shardshuffle=False).decode(spec):
            expected[sample["__key__"]] = {k: plain(v) for k, v in sample.items() if not k.startswith("__")}
        got = {}
        for batch in run(WdsDataset(node.endpoint, "images", batch_size=4, seed=1, decode=spec), 2, "spawn"):
            for sample in batch:
                key = sample.pop("__key__")
                got[key] = {k: plain(v) for k, v in sample.items()}
        assert got == expected, spec
        assert isinstance(next(iter(got.values()))["cls"], int), "webdataset's default handlers run after the image's"

    with pytest.raises(ValueError, match="unknown decoder 'jpeg2000'"):
        WdsDataset(node.endpoint, "images", batch_size=4, seed=1, decode="jpeg2000")


# Every encoding sluice decodes itself, arrays in three of their four forms
# (dtype and shape fixed, dtype fixed, neither).
MDS_COLUMNS = {"id": "int", "text": "str", "tokens": "ndarray:uint16", "grid": "ndarray",
               "static": "ndarray:float32:2,3", "score": "float32", "small": "uint8", "wide": "float64",
               "half": "float16", "meta": "json", "blob": "bytes", "label": "str_int", "ratio": "str_float"}


def write_mds(out, count, columns=MDS_COLUMNS, **options):
    """``count`` samples written by Mosaic Streaming's own MDSWriter, in
    shards of at most 4 KiB; their directory."""
    streaming = need("streaming")
    with streaming.MDSWriter(out=str(out), columns=columns, size_limit=4096, **options) as writer:
        for i in range(count):
            sample = {"id": i, "text": "é" * (i % 13), "tokens": np.arange(1 + i % 17 * 37, dtype=np.uint16),
                      "grid": np.arange(2 * (1 + i % 4), dtype=np.int32).reshape(2, -1),
                      "static": np.full((2, 3), i / 7, dtype=np.float32), "score": np.float32(i / 3),
                      "wide": i / 9, "half": i / 5, "meta": {"i": i, "odd": i % 2 == 1},
                      "blob": bytes([i % 256]) * (i % 5), "label": i * 7, "ratio": i / 11}
            if "picture" in columns:
                image = need("PIL.Image")
                sample["picture"] = image.fromarray(np.full((3 + i % 3, 5, 3), i % 256, dtype=np.uint8))
            writer.write({key: sample.get(key, i) for key in columns})
    return out


def mosaic_dataset(node, name, written):
    node.ctl("dataset", "create", name, "--kind", "mds")
    node.ctl("dataset", "ingest", name, *map(str, sorted(written.glob("shard.*.mds"))))
    node.ctl("dataset", "seal", name)


def assert_read_as_streaming_reads(node, name, written, count):
    """Every sample of ``name`` once, each column's value and type as
    Mosaic Streaming's StreamingDataset gives it from the shards it wrote."""
    streaming = need("streaming")
    reference = streaming.StreamingDataset(local=str(written), shuffle=False, batch_size=1)
    expected = {reference[i]["id"]: reference[i] for i in range(len(reference))}
    got = {sample["id"]: sample for batch in sluice.MdsSamples(node.endpoint, name, 8, seed=1) for sample in batch}
    assert sorted(got) == sorted(expected) == list(range(count)), "every sample once"
    for i, want in expected.items():
        have = got[i]
        assert sorted(have) == sorted(want)
        for key, value in want.items():
            assert type(have[key]) is type(value), (i, key)
            if isinstance(value, np.ndarray):
                assert have[key].dtype == value.dtype and np.array_equal(have[key], value), (i, key)
            else:
                assert have[key] == value, (i, key)


def test_mosaic_shards_read_back_as_streaming_reads_them(node, tmp_path, monkeypatch):
    written = write_mds(tmp_path / "mds", 200)
    assert len(list(written.glob("shard.*.mds"))) >= 3
    mosaic_dataset(node, "mosaic", written)
    assert_read_as_streaming_reads(node, "mosaic", written, 200)

    # Through a DataLoader's workers, and undecoded.
    loaded = [s for b in run(MdsDataset(node.endpoint, "mosaic", batch_size=8, seed=1), 2, "fork") for s in b]
    assert sorted(int(sample["id"]) for sample in loaded) == list(range(200))
    raw = next(iter(MdsDataset(node.endpoint, "mosaic", batch_size=2, seed=1, decode=False)))
    assert all(isinstance(value, bytes) for sample in raw for value in sample.values())
    assert int.from_bytes(raw[0]["id"], "little") < 200

    # Shards Mosaic compressed (shard.NNNNN.mds.zstd) are decompressed as
    # sluicectl sends them.
    packed = write_mds(tmp_path / "packed", 100, compression="zstd")
    node.ctl("dataset", "create", "mosaic-zstd", "--kind", "mds")
    node.ctl("dataset", "ingest", "mosaic-zstd", *map(str, sorted(packed.glob("shard.*.mds.zstd"))))
    node.ctl("dataset", "seal", "mosaic-zstd")
    assert_read_as_streaming_reads(node, "mosaic-zstd", packed, 100)

    # The same directory as a source (file:// here, S3 alike): the shards'
    # headers are read at create, Mosaic's index.json beside them passed
    # over, and samples fill from the source as they are read.
    assert (written / "index.json").exists()
    node.ctl("dataset", "create", "mosaic-source", "--kind", "mds", "--source", f"file://{written}/")
    assert_read_as_streaming_reads(node, "mosaic-source", written, 200)

    # sluice decodes every column above itself: without mosaicml-streaming
    # the values are the same. Images are Mosaic's to decode: with it,
    # values as StreamingDataset's; without, an error that names it.
    monkeypatch.setattr(sluice.mds, "_mosaic_decoder", lambda: None)
    assert_read_as_streaming_reads(node, "mosaic", written, 200)
    pictures = write_mds(tmp_path / "pictures", 20, columns={"id": "int", "picture": "png"})
    mosaic_dataset(node, "mosaic-pictures", pictures)
    with pytest.raises(ValueError, match=r"picture \(png\) needs mosaicml-streaming"):
        next(iter(sluice.MdsSamples(node.endpoint, "mosaic-pictures", 8, seed=1)))
    monkeypatch.undo()
    assert_read_as_streaming_reads(node, "mosaic-pictures", pictures, 20)


def test_bad_mosaic_shards_are_refused_and_lose_nothing(node, records, tmp_path):
    need("streaming")
    good = sorted(write_mds(tmp_path / "good", 60).glob("shard.*.mds"))
    node.ctl("dataset", "create", "mosaic-bad", "--kind", "mds")
    node.ctl("dataset", "ingest", "mosaic-bad", str(good[0]))
    before = json.loads(node.ctl("--json", "dataset", "stat", "mosaic-bad"))["record_count"]
    assert before > 0

    other = dict(MDS_COLUMNS, score="float64")
    changed = sorted(write_mds(tmp_path / "other", 10, columns=other).glob("shard.*.mds"))[0]
    err = node.ctl("dataset", "ingest", "mosaic-bad", str(changed), fails=True)
    assert "differ from the dataset's first shard" in err and "score: float64" in err, err
    cut = tmp_path / "cut.mds"
    cut.write_bytes(good[1].read_bytes()[:-3])
    err = node.ctl("dataset", "ingest", "mosaic-bad", str(cut), fails=True)
    assert "offsets end at byte" in err, err
    zstd = sorted(write_mds(tmp_path / "zstd", 10, compression="zstd").glob("shard.*.mds.zstd"))[0]
    disguised = tmp_path / "compressed.mds"
    disguised.write_bytes(zstd.read_bytes())
    err = node.ctl("dataset", "ingest", "mosaic-bad", str(disguised), fails=True)
    assert "zstd-compressed" in err and "decompress it first" in err, err
    err = node.ctl("dataset", "create", "mosaic-packed", "--kind", "mds", "--source", f"file://{zstd.parent}/",
                   fails=True)
    assert "not an MDS shard" in err and "decompress" in err, err
    assert json.loads(node.ctl("--json", "dataset", "stat", "mosaic-bad"))["record_count"] == before, "nothing lost"

    node.ctl("dataset", "ingest", "mosaic-bad", str(good[1]))
    node.ctl("dataset", "seal", "mosaic-bad")
    with pytest.raises(sluice.WrongKind, match="not mds"):
        next(iter(MdsDataset(node.endpoint, records, batch_size=2, seed=0)))
    with pytest.raises(sluice.WrongKind, match="mds"):
        next(iter(WindowDataset(node.endpoint, "mosaic-bad", window=4, batch_size=2, seed=0)))

    # A shard whose offsets hold but whose samples do not: one too short
    # for its column sizes, one whose text size runs past its end. Ingest
    # indexes samples, not their columns; reading them is a clear error.
    config = json.dumps({"version": 2, "format": "mds", "compression": None, "hashes": [], "size_limit": 4096,
                         "column_names": ["id", "text"], "column_encodings": ["int", "str"],
                         "column_sizes": [8, None]}).encode()
    samples = [b"\x01\x00", (100).to_bytes(4, "little") + (7).to_bytes(8, "little") + b"abc"]
    offset = 4 + 4 * (len(samples) + 1) + len(config)
    offsets = [offset] + [offset := offset + len(sample) for sample in samples]
    hostile = tmp_path / "hostile.mds"
    hostile.write_bytes(len(samples).to_bytes(4, "little") + b"".join(o.to_bytes(4, "little") for o in offsets)
                        + config + b"".join(samples))
    node.ctl("dataset", "create", "mosaic-hostile", "--kind", "mds")
    node.ctl("dataset", "ingest", "mosaic-hostile", str(hostile))
    node.ctl("dataset", "seal", "mosaic-hostile")
    seen = set()
    for seed in range(8):  # the sampler is deterministic: these seeds start on each of the two
        with pytest.raises(sluice.ReadFailed, match="an MDS sample of (2 bytes, too short|15 bytes whose columns)") \
                as refused:
            next(iter(sluice.MdsSamples(node.endpoint, "mosaic-hostile", 1, seed=seed)))
        seen.add(str(refused.value).split(" bytes")[0])
    assert len(seen) == 2, seen

    pickled = dict(MDS_COLUMNS, obj="pkl")
    node.ctl("dataset", "create", "mosaic-pkl", "--kind", "mds")
    node.ctl("dataset", "ingest", "mosaic-pkl", *map(str, sorted(write_mds(tmp_path / "pkl", 5, pickled).glob("*.mds"))))
    node.ctl("dataset", "seal", "mosaic-pkl")
    with pytest.raises(ValueError, match="allow_unsafe_types"):
        next(iter(MdsDataset(node.endpoint, "mosaic-pkl", batch_size=1, seed=0)))
    trusted = next(iter(MdsDataset(node.endpoint, "mosaic-pkl", batch_size=5, seed=0, allow_unsafe_types=True)))
    assert sorted(sample["obj"] for sample in trusted) == list(range(5))


def _lit_sequence(i):
    """Sequence ``i`` of a LitData token dataset: 20 to 90 distinct ids."""
    return torch.arange(i * 1000, i * 1000 + 20 + i * 37 % 71, dtype=torch.int32)


def _lit_record(i):
    return {"id": i, "text": "x" * i}


def test_a_litdata_token_dataset_is_served_as_litdata_reads_it(node, tmp_path):
    litdata = need("litdata")
    from litdata.streaming.item_loader import TokensLoader

    # Written by LitData's own optimize (two workers, chunks of 700 tokens:
    # several chunks, each a run of whole sequences), as LitGPT writes its
    # pretraining data; ingested by naming the directory.
    out = tmp_path / "lit"
    litdata.optimize(fn=_lit_sequence, inputs=list(range(60)), output_dir=str(out), chunk_size=700,
                     item_loader=TokensLoader(), num_workers=2)
    index = json.loads((out / "index.json").read_text())
    assert len(index["chunks"]) >= 3, index["chunks"]
    node.ctl("dataset", "create", "lit", "--kind", "tokens:u32")
    node.ctl("dataset", "ingest", "lit", str(out))
    node.ctl("dataset", "seal", "lit")
    ds = sluice.connect(node.endpoint).open("lit")
    stream = ds.read_batch([(0, ds.length_bytes)]).view("<u4")
    assert len(stream) == sum(chunk["dim"] for chunk in index["chunks"])
    written = np.concatenate([_lit_sequence(i).numpy() for i in range(60)])
    assert sorted(stream.tolist()) == sorted(written.tolist()), "every token once"

    # LitData's own reader, unshuffled: block b of chunk c is tokens
    # [b * B, (b + 1) * B) of that chunk, which sluice holds at the chunk's
    # place in the index's order.
    block = 13
    theirs = iter(litdata.StreamingDataset(str(out), item_loader=TokensLoader(block_size=block), shuffle=False))
    start, blocks = 0, 0
    for chunk in index["chunks"]:
        for b in range(chunk["dim"] // block):
            at = start + b * block
            np.testing.assert_array_equal(next(theirs).numpy(), stream[at:at + block].astype(np.int32))
            blocks += 1
        start += chunk["dim"]
    assert next(theirs, None) is None and blocks > 20

    # Another layout is refused by name, and nothing is sent.
    node.ctl("dataset", "create", "lit-records", "--kind", "tokens:u32")
    pytree = tmp_path / "pytree"
    litdata.optimize(fn=_lit_record, inputs=list(range(10)), output_dir=str(pytree), chunk_bytes="1MB", num_workers=1)
    err = node.ctl("dataset", "ingest", "lit-records", str(pytree), fails=True)
    assert "item_loader=TokensLoader) only" in err, err
    err = node.ctl("dataset", "ingest", "lit-records", str(out / "index.json"), "--format", "raw", fails=True)
    assert "drop --format" in err, err
    assert json.loads(node.ctl("--json", "dataset", "stat", "lit-records"))["length_bytes"] == 0


def test_read_into_fills_caller_buffers_byte_exact(node, tokens):
    ds = sluice.connect(node.endpoint).open("toks")
    raw = tokens.tobytes()
    ranges = [(10, 100), (5000, 4096), (123_457, 3)]
    want = b"".join(raw[o:o + n] for o, n in ranges)
    array = np.zeros(len(want) + 5, dtype=np.uint8)
    assert ds.read_into(ranges, array) == len(want)
    assert array[:len(want)].tobytes() == want
    tensor = torch.zeros(len(want), dtype=torch.uint8)
    ds.read_into(ranges, tensor)
    assert tensor.numpy().tobytes() == want
    buffer = bytearray(len(want))
    ds.read_into(ranges, buffer)
    assert bytes(buffer) == want
    with pytest.raises(ValueError, match="buffer has"):
        ds.read_into(ranges, np.zeros(len(want) - 1, dtype=np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        ds.read_into(ranges, np.frombuffer(bytes(len(want)), dtype=np.uint8))


def test_read_into_a_pinned_tensor(node, tokens):
    if not torch.cuda.is_available():
        pytest.skip("pinned host memory needs a CUDA device and driver; torch.cuda.is_available() is False here")
    ds = sluice.connect(node.endpoint).open("toks")
    ranges = [(64, 4096), (1 << 20, 512)]
    raw = tokens.tobytes()
    want = b"".join(raw[o:o + n] for o, n in ranges)
    pinned = torch.zeros(len(want), dtype=torch.uint8).pin_memory()
    ds.read_into(ranges, pinned)
    assert pinned.is_pinned() and pinned.numpy().tobytes() == want
    windows = WindowDataset(node.endpoint, "toks", window=16, batch_size=4, seed=1, pin_memory=True)
    batch = next(iter(windows))
    assert batch.is_pinned() and batch.dtype == torch.uint16


def test_errors_name_their_cause(node, records, tmp_path):
    with pytest.raises(sluice.UnknownDataset, match="missing"):
        sluice.connect(node.endpoint).open("missing")
    with pytest.raises(sluice.NodeUnavailable):
        sluice.connect("http://127.0.0.1:9")
    with pytest.raises(sluice.WrongKind, match="records"):
        next(iter(WindowDataset(node.endpoint, records, window=4, batch_size=2, seed=0)))
    with pytest.raises(sluice.WrongKind, match="tokens"):
        next(iter(RecordDataset(node.endpoint, "toks", batch_size=2, seed=0)))
    windows = WindowDataset(node.endpoint, "toks", window=8, batch_size=2, seed=0)
    other = WindowDataset(node.endpoint, "toks", window=8, batch_size=2, seed=0)
    state = windows.state_dict()
    state["sampler"]["content_hash"] = "blake3:" + "0" * 64
    with pytest.raises(sluice.StateMismatch, match="dataset"):
        other.load_state_dict(state)
        next(iter(other))
    with pytest.raises(sluice.StateMismatch):
        windows.load_state_dict(RecordDataset(node.endpoint, records, 2, 0).state_dict())
    with pytest.raises(ValueError, match="out of bounds"):
        ds = sluice.connect(node.endpoint).open("toks")
        ds.read_batch([(ds.length_bytes, 1)])


def test_a_state_is_small_and_plain(node):
    ds = WindowDataset(node.endpoint, "toks", window=8, batch_size=2, seed=0)
    state = ds.state_dict()
    assert len(json.dumps(state)) < 1024
    # Plain JSON: it goes into any checkpoint and comes back equal.
    assert json.loads(json.dumps(state)) == state
    fresh = WindowDataset(node.endpoint, "toks", window=8, batch_size=2, seed=0)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert torch.equal(next(iter(fresh)), next(iter(ds)))


def test_prefetch_steps_fill_a_source_backed_dataset_ahead_of_the_reads(node, tmp_path):
    """A dataset from a source (file:// here; S3 is the same path, tested in
    the Rust suite against a real server): windows read byte-exact, and
    with ``prefetch_steps`` the node fills the steps ahead before the job
    asks for them."""
    tokens = np.random.default_rng(4).integers(0, 60000, 4_000_000, dtype="<u2")
    (tmp_path / "toks.bin").write_bytes(tokens.tobytes())
    node.ctl("dataset", "create", "from-source", "--kind", "tokens:u16", "--source", f"file://{tmp_path}/toks.bin")
    ds = WindowDataset(node.endpoint, "from-source", window=64, batch_size=4, seed=2, samples_per_epoch=400,
                       prefetch_steps=50, as_int64=True)
    batches = iter(ds)
    first = next(batches)
    for row, start in zip(first.numpy(), ds.last_starts):
        assert (row == tokens[start:start + 64]).all()
    # The hint covers the next 50 steps: 200 windows over 123 chunks; step 0
    # alone reads at most 8.
    cache = {}
    for _ in range(100):
        cache = json.loads(node.ctl("--json", "dataset", "stat", "from-source"))["cache"]
        if cache["chunks_present"] >= 40:
            break
        time.sleep(0.05)
    assert cache["chunks_present"] >= 40, cache
    for batch in batches:
        for row, start in zip(batch.numpy(), ds.last_starts):
            assert (row == tokens[start:start + 64]).all()
