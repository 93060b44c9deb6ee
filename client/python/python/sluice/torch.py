"""PyTorch adapter: a sluice ``WindowLoader`` as an ``IterableDataset``.

Use it with ``DataLoader(ds, batch_size=None)``: batching, shuffling and
prefetch already happen in sluice, so the DataLoader must not add its own.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch
from torch.utils.data import IterableDataset

from . import WindowLoader, connect

__all__ = ["WindowDataset"]


class WindowDataset(IterableDataset):
    """Yields ``(batch_size, window)`` int64 tensors from a token dataset.

    Rank and world size default to ``torch.distributed`` when it is
    initialized. ``state_dict``/``load_state_dict`` give exact resume.
    """

    def __init__(
        self,
        endpoint: str,
        name: str,
        window: int,
        batch_size: int,
        seed: int,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        prefetch: int = 4,
    ):
        super().__init__()
        if rank is None or world_size is None:
            dist = torch.distributed
            ready = dist.is_available() and dist.is_initialized()
            rank = dist.get_rank() if ready else 0
            world_size = dist.get_world_size() if ready else 1
        self._args = (endpoint, name, window, batch_size, seed, rank, world_size, prefetch)
        self._loader: Optional[WindowLoader] = None
        self._pending_state: Optional[dict] = None

    def _ensure(self) -> WindowLoader:
        if self._loader is None:
            endpoint, name, window, batch_size, seed, rank, world_size, prefetch = self._args
            dataset = connect(endpoint).open(name)
            self._loader = WindowLoader(dataset, window, batch_size, seed, rank, world_size, prefetch)
            if self._pending_state is not None:
                self._loader.load_state_dict(self._pending_state)
        return self._loader

    def __iter__(self) -> Iterator[torch.Tensor]:
        loader = self._ensure()
        for batch in loader:
            yield torch.from_numpy(batch.astype("int64"))

    def state_dict(self) -> dict:
        return self._ensure().state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._pending_state = state
        if self._loader is not None:
            self._loader.load_state_dict(state)
