"""PyTorch datasets over sluice: token windows, records, WebDataset and
Mosaic (MDS) samples, and mixtures of them, each yielding one batch per
item.

Use them with ``DataLoader(ds, batch_size=None)`` (or torchdata's
``StatefulDataLoader``): batching, shuffling and read-ahead happen in
sluice, so the DataLoader must not add its own. Each DataLoader worker reads
its own steps and connects in its own process (fork, spawn or forkserver);
rank and world size come from ``torch.distributed`` when it is initialized.
See ``sluice.streams`` for the order, epochs and resume rules.

    >>> ds = WindowDataset("http://node:7070", "wiki", window=2048, batch_size=8, seed=0)
    >>> loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    >>> for step, tokens in enumerate(loader): ...          # (8, 2048) uint16 tensors
    >>> saved = loader.state_dict()                        # a few hundred bytes a worker
    >>> # later, with any num_workers and world size:
    >>> ds.load_state_dict(sluice.loader_position(saved))
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from . import streams
from .streams import loader_position

__all__ = ["WindowDataset", "RecordDataset", "WdsDataset", "MdsDataset", "MixtureDataset", "loader_position"]


def _rank_and_world(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """This process's rank and world size: those passed, else
    ``torch.distributed``'s once it is initialized, else the launcher's
    ``RANK`` and ``WORLD_SIZE`` (torchrun sets them before the job calls
    ``init_process_group``), else rank 0 of 1.

    Without the launcher's variables, a dataset built before
    ``init_process_group`` would read as rank 0 of 1 on every rank: each
    rank the same samples, and nothing to say so.
    """
    if rank is not None and world_size is not None:
        return rank, world_size
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        found = (dist.get_rank(), dist.get_world_size())
    else:
        env_rank, env_world = _launcher_int("RANK"), _launcher_int("WORLD_SIZE")
        # One without the other (and not passed) would leave every rank to
        # guess: rank 0, or a world of 1.
        if env_world is not None and env_rank is None and rank is None:
            raise ValueError("WORLD_SIZE is set in the environment but RANK is not; pass rank= and world_size=")
        if env_rank is not None and env_world is None and world_size is None:
            raise ValueError("RANK is set in the environment but WORLD_SIZE is not; pass rank= and world_size=")
        found = (env_rank or 0, 1 if env_world is None else env_world)
    return (found[0] if rank is None else rank, found[1] if world_size is None else world_size)


def _launcher_int(variable: str) -> Optional[int]:
    value = os.environ.get(variable)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{variable}={value!r} in the environment is not a number; "
                         "pass rank= and world_size= to the dataset instead") from None


class _Torch(IterableDataset):
    """Makes a stream a DataLoader's: its workers and ranks."""

    def _worker(self) -> Tuple[int, int]:
        info = get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)


class WindowDataset(_Torch, streams.TokenWindows):
    """``(batch_size, window)`` tensors of the dataset's token dtype
    (``as_int64=True`` for int64). ``pin_memory=True`` writes each batch
    into a pinned tensor (needs an accelerator)."""

    def __init__(self, endpoint: str, name: str, window: int, batch_size: int, seed: int,
                 rank: Optional[int] = None, world_size: Optional[int] = None, *, pin_memory: bool = False,
                 **kwargs: Any):
        rank, world_size = _rank_and_world(rank, world_size)
        IterableDataset.__init__(self)
        streams.TokenWindows.__init__(self, endpoint, name, window, batch_size, seed, rank=rank,
                                      world_size=world_size, **kwargs)
        self.pin_memory = pin_memory

    def _empty(self, rows: int, dtype: np.dtype) -> Any:
        torch_dtype = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32}[dtype.itemsize]
        return torch.empty((rows, self.window), dtype=torch_dtype, pin_memory=self.pin_memory)

    def _int64(self, out: torch.Tensor) -> torch.Tensor:
        return out.to(torch.int64)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return streams.TokenWindows.__iter__(self)


class RecordDataset(_Torch, streams.Records):
    """Lists of ``batch_size`` samples, each its bytes, from a ``records``,
    ``wds`` or ``mds`` dataset."""

    def __init__(self, endpoint: str, name: str, batch_size: int, seed: int, rank: Optional[int] = None,
                 world_size: Optional[int] = None, **kwargs: Any):
        rank, world_size = _rank_and_world(rank, world_size)
        IterableDataset.__init__(self)
        streams.Records.__init__(self, endpoint, name, batch_size, seed, rank=rank, world_size=world_size, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        return streams.Records.__iter__(self)


class WdsDataset(_Torch, streams.WdsSamples):
    """Lists of ``batch_size`` WebDataset sample dicts (``__key__`` and one
    entry per member extension) from a ``wds`` dataset; ``decode`` as in
    ``sluice.WdsSamples``."""

    def __init__(self, endpoint: str, name: str, batch_size: int, seed: int, rank: Optional[int] = None,
                 world_size: Optional[int] = None, **kwargs: Any):
        rank, world_size = _rank_and_world(rank, world_size)
        IterableDataset.__init__(self)
        streams.WdsSamples.__init__(self, endpoint, name, batch_size, seed, rank=rank, world_size=world_size,
                                    **kwargs)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return streams.WdsSamples.__iter__(self)


class MdsDataset(_Torch, streams.MdsSamples):
    """Lists of ``batch_size`` sample dicts (one entry per column, decoded
    as Mosaic Streaming's ``StreamingDataset`` decodes them) from an ``mds``
    dataset; ``decode`` and ``allow_unsafe_types`` as in
    ``sluice.MdsSamples``."""

    def __init__(self, endpoint: str, name: str, batch_size: int, seed: int, rank: Optional[int] = None,
                 world_size: Optional[int] = None, **kwargs: Any):
        rank, world_size = _rank_and_world(rank, world_size)
        IterableDataset.__init__(self)
        streams.MdsSamples.__init__(self, endpoint, name, batch_size, seed, rank=rank, world_size=world_size,
                                    **kwargs)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return streams.MdsSamples.__iter__(self)


class MixtureDataset(_Torch, streams.Mixture):
    """Batches that mix datasets of one kind in fixed shares: each step's
    batch holds each dataset's ``batch_size`` samples of that step, in the
    order given (see ``sluice.streams.Mixture``).

    >>> web = WindowDataset(url, "web", window=2048, batch_size=6, seed=0)
    >>> code = WindowDataset(url, "code", window=2048, batch_size=2, seed=1)
    >>> ds = MixtureDataset([web, code])    # (8, 2048): rows 0-5 web, 6-7 code
    """

    def __init__(self, datasets: Sequence[Any], steps_per_epoch: Optional[int] = None):
        IterableDataset.__init__(self)
        streams.Mixture.__init__(self, datasets, steps_per_epoch)

    def __iter__(self) -> Iterator[Any]:
        return streams.Mixture.__iter__(self)
