"""One rank's batches of a dataset, split over worker processes, with a
state of a few hundred bytes that resumes exactly.

The global sample sequence is a keyed shuffle fixed by the seed: step ``s``
holds samples ``[s * G, (s + 1) * G)`` for a global batch of ``G`` (the
per-rank ``batch_size`` times the world size), and rank ``r`` of ``R`` takes
its ``G / R`` of each step. Worker ``w`` of ``W`` on a rank reads steps
``w, w + W, w + 2W, ...``: a PyTorch DataLoader takes its workers' batches in
worker order, so the batches come out as steps ``0, 1, 2, ...``, the same
whatever ``W`` is, and no sample of an epoch is read twice or skipped.

An iteration covers one epoch: the steps whose first sample falls in it
(when ``samples_per_epoch`` is a multiple of ``G``, exactly the epoch's
samples). The copy that read an epoch to its end then reads the next: the
dataset itself with ``num_workers=0``, and each persistent worker's copy.
Other DataLoader workers start each epoch from a fresh copy of the main
process's dataset, so with workers call ``set_epoch`` before each epoch, as
with ``DistributedSampler``; it is harmless with persistent workers, whose
copies it does not reach.

``state_dict()`` names the next step. Inside a worker it is that worker's
own next step; ``loader_position`` merges the workers' states of a
DataLoader state into one position (their smallest next step), which
resumes at any worker count and world size. A changed world size keeps the
saved global batch, so each rank's batch becomes ``G / R``; a changed
worker count changes nothing in the order.

A ``Mixture`` reads step ``s`` of each of its streams as its own step
``s``, so all of the above holds for it unchanged.

Connections are made lazily, in the process that reads: after a fork (the
DataLoader default on Linux) a worker connects again and never touches its
parent's client, and the objects pickle for ``spawn`` without one.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import mds, wds
from ._backend import native as _native
from ._buffers import writable_address

STATE_VERSION = 1

_DTYPES = {1: np.dtype(np.uint8), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def _check_seed(seed: int) -> None:
    """The shuffle's key is 64 bits: a seed outside them is refused here,
    rather than as an ``OverflowError`` from the native side."""
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed {seed} is outside [0, 2**64)")


class _Epochs:
    """What a dataset and a mixture share: the epoch the next iteration
    reads, a loaded state to resume, the next step of this process, and
    the worker it runs in."""

    def __init__(self) -> None:
        self.epoch = 0
        self._resume: Optional[Dict[str, Any]] = None
        self._next_step: Optional[int] = None

    def _worker(self) -> Tuple[int, int]:
        """``(worker, workers)`` of this process; ``(0, 1)`` outside one."""
        return 0, 1

    def steps_per_epoch(self) -> int:
        raise NotImplementedError

    def __len__(self) -> int:
        """The current epoch's steps: the batches an iteration yields, so
        ``len(DataLoader(ds, batch_size=None))`` works (progress bars,
        learning-rate schedules). Asks the node, connecting if need be."""
        return self.steps_per_epoch()

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration reads (from its start, unless a
        loaded state is inside it)."""
        self.epoch = int(epoch)
        if self._resume is not None and self._resume["epoch"] != self.epoch:
            self._resume = None

    def _run_epoch(self, step: int, end: int, workers: int, read: Callable[[], Any]) -> Iterator[Any]:
        """One worker's steps of an epoch, ``step, step + workers, ...``
        below ``end``, each ``read()``; ``_next_step`` (what ``state_dict``
        names) is kept current. At the end the loaded state is spent and the
        epoch advanced: the copy that read the epoch reads the next one next
        (the object itself without workers, and a persistent worker's copy,
        which the main process's ``set_epoch`` never reaches; other
        workers' copies end with their epoch)."""
        self._next_step = step
        while step < end:
            batch = read()
            step += workers
            self._next_step = step
            yield batch
        self._resume = None
        self._next_step = None
        self.epoch += 1


class _Stream(_Epochs):
    """What the three datasets share: connection, schedule, epoch, state.

    Besides the dataset's ``endpoint`` and ``name``, the per-rank
    ``batch_size`` and the shuffle ``seed``, each takes ``rank`` and
    ``world_size``; ``prefetch`` (steps read ahead in each process);
    ``prefetch_steps`` (steps ahead whose samples the node is told of, so
    that a source-backed dataset fills them from its source before they
    are read; 0, the default, tells nothing);
    ``samples_per_epoch`` (default: every sample once); and what
    ``sluice.connect`` and ``Client.open`` take: ``token`` (else
    ``SLUICE_TOKEN``), ``transport``, ``verify_chunks``, ``ca_file``,
    ``cert_file``, ``key_file``."""

    _kind = ""

    def __init__(
        self,
        endpoint: str,
        name: str,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 4,
        samples_per_epoch: Optional[int] = None,
        prefetch_steps: int = 0,
        token: Optional[str] = None,
        transport: Optional[str] = None,
        verify_chunks: bool = False,
        ca_file: Optional[str] = None,
        cert_file: Optional[str] = None,
        key_file: Optional[str] = None,
    ):
        if batch_size < 1:
            raise ValueError("batch_size is at least 1")
        _check_seed(seed)
        if samples_per_epoch is not None and samples_per_epoch < 1:
            raise ValueError("samples_per_epoch is at least 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a world of {world_size}")
        self.endpoint, self.name = endpoint, name
        self.batch_size, self.seed = batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.prefetch, self.prefetch_steps = prefetch, prefetch_steps
        self.samples_per_epoch = samples_per_epoch
        self._token, self._transport, self._verify = token, transport, verify_chunks
        self._tls = (ca_file, cert_file, key_file)
        _Epochs.__init__(self)
        self._native: Any = None
        self._pid: Optional[int] = None
        self._sampler: Dict[str, Any] = {}

    # -- processes -----------------------------------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        state["_native"], state["_pid"] = None, None
        return state

    def _loader(self) -> Any:
        """The native loader of this process, connecting on first use here."""
        if self._native is None or self._pid != os.getpid():
            # A parent's loader, inherited through fork, is left alone: the
            # native side refuses and leaks it rather than touch its runtime.
            self._native = None
            client = _native.Client(self.endpoint, self._transport, *self._tls)
            dataset = client.open(self.name, self._verify, self._token)
            self._native = self._make(dataset)
            self._native.set_prefetch_steps(self.prefetch_steps)
            self._pid = os.getpid()
            if self._resume is not None:
                self._native.load_state_json(json.dumps(self._resume["sampler"]))
            base = json.loads(self._native.state_json())
            base["next_sample"], base["epoch"] = 0, 0
            self._sampler = base
        return self._native

    def _make(self, dataset: Any) -> Any:
        raise NotImplementedError

    # -- steps and epochs ----------------------------------------------------

    def _global_batch(self) -> int:
        return int(self._sampler["global_batch"])

    def _epoch_steps(self, epoch: int) -> Tuple[int, int]:
        """The steps ``[first, end)`` whose first sample lies in ``epoch``."""
        per_epoch, batch = int(self._sampler["samples_per_epoch"]), self._global_batch()
        return -(-epoch * per_epoch // batch), -(-(epoch + 1) * per_epoch // batch)

    def steps_per_epoch(self) -> int:
        """Steps (batches per rank) in the current epoch."""
        self._loader()
        first, end = self._epoch_steps(self.epoch)
        return end - first

    def _first_step(self, worker: int, workers: int) -> int:
        first, _ = self._epoch_steps(self.epoch)
        state = self._resume
        if state is None:
            return first + worker
        return _resumed_step(state, int(state["sampler"]["next_sample"]) // self._global_batch(), worker, workers)

    def __iter__(self) -> Iterator[Any]:
        loader = self._loader()
        worker, workers = self._worker()
        step = self._first_step(worker, workers)
        _, end = self._epoch_steps(self.epoch)
        if step < end:
            loader.set_schedule(step, workers, end)
        yield from self._run_epoch(step, end, workers, lambda: self._next(loader))

    def _next(self, loader: Any) -> Any:
        raise NotImplementedError

    # -- state ---------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The position: the next step of this process (a worker's own), the
        epoch and the sampler (seed, global batch, dataset hash)."""
        self._loader()
        worker, workers = self._worker()
        step = self._next_step if self._next_step is not None else self._first_step(worker, workers)
        return {"sluice": STATE_VERSION, "kind": self._kind, "epoch": self.epoch, "worker": worker,
                "workers": workers, "sampler": self._sampler_at(step)}

    def _sampler_at(self, step: int) -> Dict[str, Any]:
        """The sampler's state (seed, global batch, dataset hash) at the
        start of ``step``. Connects if need be."""
        self._loader()
        sampler = dict(self._sampler)
        sampler["next_sample"] = step * self._global_batch()
        sampler["epoch"] = sampler["next_sample"] // int(sampler["samples_per_epoch"])
        return sampler

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at ``state`` (this class's, or ``loader_position``'s)."""
        _check_state(state, self._kind)
        self._resume = state
        self.epoch = int(state["epoch"])
        self._next_step = None
        if self._native is not None and self._pid == os.getpid():
            # Checked now (the right dataset, a sampler of this kind) when
            # connected; otherwise where the reading happens.
            self._native.load_state_json(json.dumps(state["sampler"]))
            self._sampler = dict(state["sampler"], next_sample=0, epoch=0)


def _check_state(state: Any, kind: str) -> None:
    """Refuses what is not a sluice state of ``kind``."""
    if not isinstance(state, dict) or state.get("sluice") != STATE_VERSION:
        raise _native.StateMismatch("not a sluice dataset state (see sluice.loader_position for DataLoader states)")
    if state.get("kind") != kind:
        raise _native.StateMismatch(f"a {state.get('kind')} state cannot resume a {kind} dataset")


def _resumed_step(state: Dict[str, Any], step: int, worker: int, workers: int) -> int:
    """The first step of ``worker`` of ``workers`` resuming ``state``, whose
    own next step is ``step``: a worker's state resumes that worker, and a
    merged one (``loader_position``'s, one worker) any worker count."""
    if state["workers"] == workers and state["worker"] == worker:
        return step
    if state["workers"] == 1:
        return step + worker
    raise _native.StateMismatch(
        f"a state of worker {state['worker']} of {state['workers']} cannot resume worker {worker} of "
        f"{workers}: merge the DataLoader's state with sluice.loader_position() first"
    )


def loader_position(loader_state: Dict[str, Any]) -> Dict[str, Any]:
    """The one position in a DataLoader's (``StatefulDataLoader``) state:
    the sluice states of its workers (of one dataset or one ``Mixture``)
    merged into the smallest next step, which any worker count and world
    size resumes from with ``dataset.load_state_dict``."""
    found: List[Dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("sluice") == STATE_VERSION and ("sampler" in node or "streams" in node):
                found.append(node)
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(loader_state)
    if not found:
        raise _native.StateMismatch("the DataLoader state holds no sluice dataset state")
    identities = {_identity(state) for state in found}
    if len(identities) != 1:
        raise _native.StateMismatch(f"the DataLoader state holds states of {len(identities)} datasets")
    first = min(found, key=_next_step)
    return dict(first, worker=0, workers=1)


def _identity(state: Dict[str, Any]) -> Tuple[str, ...]:
    """What a state is of: its dataset, or a mixture's datasets in order."""
    if "streams" in state:
        return ("mixture",) + tuple(sampler["content_hash"] for sampler in state["streams"])
    return (state["sampler"]["content_hash"],)


def _next_step(state: Dict[str, Any]) -> int:
    """A state's next step (its workers' states share the global batch, so
    the next sample orders a dataset's states as well)."""
    if "streams" in state:
        return int(state["next_step"])
    return int(state["sampler"]["next_sample"])


class TokenWindows(_Stream):
    """Random windows of ``window`` tokens, ``batch_size`` per step for this
    rank: each batch a ``(batch_size, window)`` array of the dataset's token
    dtype, written by the native side into a fresh array (``as_int64``
    converts). ``stride_ratio`` sets ``n / stride_ratio`` samples per epoch
    over ``n`` tokens, as ``WindowLoader``."""

    _kind = "windows"

    def __init__(self, endpoint: str, name: str, window: int, batch_size: int, seed: int, *,
                 stride_ratio: Optional[float] = None, as_int64: bool = False, **kwargs: Any):
        super().__init__(endpoint, name, batch_size, seed, **kwargs)
        self.window, self.stride_ratio, self.as_int64 = window, stride_ratio, as_int64
        self.last_starts: List[int] = []

    def _make(self, dataset: Any) -> Any:
        return _native.WindowLoader(dataset, self.window, self.batch_size, self.seed, self.rank, self.world_size,
                                    self.prefetch, self.samples_per_epoch, self.stride_ratio)

    def _empty(self, rows: int, dtype: np.dtype) -> Any:
        return np.empty((rows, self.window), dtype=dtype)

    def _rows(self) -> int:
        """Windows per batch on this rank."""
        return self._global_batch() // self.world_size

    def _next(self, loader: Any) -> Any:
        out = self._empty(self._rows(), _DTYPES[loader.token_bytes])
        self._read_into(loader, out)
        return self._int64(out) if self.as_int64 else out

    def _read_into(self, loader: Any, out: Any) -> None:
        """Reads the next step's windows into ``out`` (contiguous, this
        rank's rows), with no copy on this side."""
        address, nbytes = writable_address(out)
        _, got = loader.next_into(address, nbytes)
        assert got == len(out), f"{got} windows for {len(out)}"
        self.last_starts = loader.last_starts

    def _int64(self, out: Any) -> Any:
        return out.astype(np.int64)


class Records(_Stream):
    """Shuffled records of a ``records`` or ``wds`` dataset: each batch a
    list of ``batch_size`` samples, each its bytes."""

    _kind = "records"

    def _make(self, dataset: Any) -> Any:
        return _native.RecordLoader(dataset, self.batch_size, self.seed, self.rank, self.world_size, self.prefetch,
                                    self.samples_per_epoch)

    def _next(self, loader: Any) -> List[bytes]:
        _, data, offsets, _records = loader.next_batch()
        view = memoryview(data)
        return [bytes(view[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1)]


class WdsSamples(Records):
    """WebDataset samples of a ``wds`` dataset: each batch a list of dicts,
    ``{"__key__": key, ext: value, ...}`` as the ``webdataset`` package
    yields them; ``decode`` is ``None`` (bytes), ``"basic"`` (text, JSON,
    class labels, ``.npy``), a function ``(ext, bytes) -> value``, or one of
    webdataset's image specs (``"pil"``, ``"rgb8"``, ``"torchrgb"``, ...),
    decoding as ``WebDataset(...).decode(spec)`` does."""

    _kind = "wds"

    def __init__(self, endpoint: str, name: str, batch_size: int, seed: int, *,
                 decode: Union[None, str, Any] = None, **kwargs: Any):
        super().__init__(endpoint, name, batch_size, seed, **kwargs)
        wds.check_decode(decode)
        self.decode = decode

    def _make(self, dataset: Any) -> Any:
        if dataset.kind != "wds":
            raise _native.WrongKind(f"dataset {dataset.name} is {dataset.kind}, not wds")
        return super()._make(dataset)

    def _next(self, loader: Any) -> List[Dict[str, Any]]:
        return [wds.sample(span, self.decode) for span in super()._next(loader)]


class MdsSamples(Records):
    """Samples of an ``mds`` dataset (Mosaic Data Shards, as Mosaic
    Streaming's ``MDSWriter`` writes them): each batch a list of dicts, one
    entry per column, decoded as ``StreamingDataset`` decodes them (see
    ``sluice.mds``); ``decode=False`` leaves each column's bytes, and
    ``pkl`` columns decode only with ``allow_unsafe_types=True``."""

    _kind = "mds"

    def __init__(self, endpoint: str, name: str, batch_size: int, seed: int, *, decode: bool = True,
                 allow_unsafe_types: bool = False, **kwargs: Any):
        super().__init__(endpoint, name, batch_size, seed, **kwargs)
        self.decode, self.allow_unsafe_types = bool(decode), bool(allow_unsafe_types)
        self._columns: Optional[mds.Columns] = None

    def _make(self, dataset: Any) -> Any:
        if dataset.kind != "mds":
            raise _native.WrongKind(f"dataset {dataset.name} is {dataset.kind}, not mds")
        columns = mds.columns_of(dataset)
        columns.check(self.decode, self.allow_unsafe_types)
        self._columns = columns
        return super()._make(dataset)

    def _next(self, loader: Any) -> List[Dict[str, Any]]:
        spans = super()._next(loader)
        assert self._columns is not None, "the columns are read where the loader is made"
        return [self._columns.sample(span, self.decode) for span in spans]


class Mixture(_Epochs):
    """Batches that mix datasets in fixed shares: each step's batch holds
    each stream's batch of that step, in the order the streams are given,
    so the streams' ``batch_size``s are the mixture's proportions (6 and 2:
    three quarters of every batch from the first). As Mosaic Streaming's
    ``batching_method="stratified"``: the share holds in every batch, not
    only on average.

    ``streams`` are datasets of one kind (``TokenWindows`` of one window
    length and ``as_int64``, or ``Records``, or ``WdsSamples``), each with
    its own name, seed and batch size, and one rank and world size; a token
    batch is one ``(rows, window)`` array, each stream's rows written into
    their place (the first stream's ``pin_memory`` applies), and
    ``last_starts`` are the rows' starts; a record batch is one list.

    Step ``s`` of the mixture is step ``s`` of every stream's own sequence
    (see this module's first lines), which runs on past the stream's epoch:
    a stream its share reads faster than the others is read again in its
    next epoch's order, one it reads slower is read on where the last
    epoch left it. An epoch of the mixture is ``steps_per_epoch`` steps;
    by default as many as read the streams' samples per epoch together
    once (Mosaic's default epoch size with proportions). Workers, ranks,
    ``set_epoch`` and ``state_dict`` are as for one stream; a state names
    the next step and each stream's sampler, ``loader_position`` merges a
    DataLoader's, and the saved epoch length wins over the one passed, as
    the saved global batch does."""

    _kind = "mixture"

    def __init__(self, streams: Sequence[_Stream], steps_per_epoch: Optional[int] = None):
        streams = list(streams)
        if not streams:
            raise ValueError("a mixture has at least one stream")
        kinds = sorted({stream._kind for stream in streams})
        if len(kinds) != 1:
            raise ValueError(f"a mixture's streams are of one kind, not {kinds}")
        if len({id(stream) for stream in streams}) != len(streams):
            raise ValueError("a stream appears twice in the mixture: give it the larger batch_size instead")
        if len({(stream.rank, stream.world_size) for stream in streams}) != 1:
            raise ValueError("a mixture's streams have one rank and world size")
        if isinstance(streams[0], TokenWindows):
            shapes = {(stream.window, stream.as_int64) for stream in streams}  # type: ignore[attr-defined]
            if len(shapes) != 1:
                raise ValueError("a mixture's token windows have one window length and one as_int64")
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ValueError("steps_per_epoch is at least 1")
        _Epochs.__init__(self)
        self.streams = streams
        self._steps_per_epoch = steps_per_epoch
        self.last_starts: List[int] = []

    @property
    def rank(self) -> int:
        return self.streams[0].rank

    @property
    def world_size(self) -> int:
        return self.streams[0].world_size

    def steps_per_epoch(self) -> int:
        """Steps (batches per rank) in an epoch. The default asks the
        nodes, connecting if need be."""
        if self._steps_per_epoch is not None:
            return self._steps_per_epoch
        for stream in self.streams:
            stream._loader()
        samples = sum(int(stream._sampler["samples_per_epoch"]) for stream in self.streams)
        return -(-samples // sum(stream._global_batch() for stream in self.streams))

    def _first_step(self, worker: int, workers: int) -> int:
        if self._resume is None:
            return self.epoch * self.steps_per_epoch() + worker
        return _resumed_step(self._resume, int(self._resume["next_step"]), worker, workers)

    def __iter__(self) -> Iterator[Any]:
        loaders = [stream._loader() for stream in self.streams]
        if len({loader.token_bytes for loader in loaders if hasattr(loader, "token_bytes")}) > 1:
            names = ", ".join(stream.name for stream in self.streams)
            raise _native.WrongKind(f"the token datasets of a mixture ({names}) have one token width")
        worker, workers = self._worker()
        step = self._first_step(worker, workers)
        end = (self.epoch + 1) * self.steps_per_epoch()
        if step < end:
            for loader in loaders:
                loader.set_schedule(step, workers, end)
        yield from self._run_epoch(step, end, workers, lambda: self._next(loaders))

    def _next(self, loaders: List[Any]) -> Any:
        first = self.streams[0]
        if not isinstance(first, TokenWindows):
            return [sample for stream, loader in zip(self.streams, loaders) for sample in stream._next(loader)]
        rows = [stream._rows() for stream in self.streams]  # type: ignore[attr-defined]
        out = first._empty(sum(rows), _DTYPES[loaders[0].token_bytes])
        at, starts = 0, []
        for stream, loader, count in zip(self.streams, loaders, rows):
            stream._read_into(loader, out[at:at + count])  # type: ignore[attr-defined]
            starts += stream.last_starts  # type: ignore[attr-defined]
            at += count
        self.last_starts = starts
        return first._int64(out) if first.as_int64 else out

    def state_dict(self) -> Dict[str, Any]:
        """The position: the next step of this process (a worker's own), the
        epoch, the epoch's length and each stream's sampler."""
        worker, workers = self._worker()
        step = self._next_step if self._next_step is not None else self._first_step(worker, workers)
        return {"sluice": STATE_VERSION, "kind": self._kind, "epoch": self.epoch, "worker": worker,
                "workers": workers, "next_step": step, "steps_per_epoch": self.steps_per_epoch(),
                "streams": [stream._sampler_at(step) for stream in self.streams]}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resumes at ``state`` (this class's, or ``loader_position``'s);
        each stream checks its sampler (its dataset, seed and kind) where it
        connects."""
        _check_state(state, self._kind)
        samplers = state.get("streams")
        if not isinstance(samplers, list) or len(samplers) != len(self.streams):
            count = len(samplers) if isinstance(samplers, list) else "no"
            raise _native.StateMismatch(f"a state of a mixture of {count} streams cannot resume one of "
                                        f"{len(self.streams)}")
        for stream, sampler in zip(self.streams, samplers):
            stream.load_state_dict({"sluice": STATE_VERSION, "kind": stream._kind, "epoch": int(sampler["epoch"]),
                                    "worker": 0, "workers": 1, "sampler": sampler})
        self._resume = state
        self.epoch = int(state["epoch"])
        self._steps_per_epoch = int(state["steps_per_epoch"])
        self._next_step = None
