"""sluice: read training data from sluice storage nodes.

    >>> import sluice
    >>> client = sluice.connect("http://127.0.0.1:7070")
    >>> ds = client.open("wiki-tokens")
    >>> loader = sluice.WindowLoader(ds, window=1024, batch_size=8, seed=0)
    >>> batch = next(iter(loader))          # numpy array of shape (8, 1024)
    >>> saved = loader.state_dict()         # resume exactly with load_state_dict

Without torch, ``TokenWindows``, ``Records``, ``WdsSamples`` and
``MdsSamples`` are the iterators behind ``sluice.torch``'s datasets (worker
split, epochs, resume: see ``sluice.streams``), and ``Mixture`` mixes them
in fixed shares. Failures raise ``SluiceError`` (an ``OSError``) or one of
its kinds: ``AccessDenied``, ``UnknownDataset``, ``NodeUnavailable``,
``WrongKind``, ``StateMismatch``, ``Forked``; a bad range ``ReadFailed``
(a ``ValueError``).

Where rdma-core's libraries are installed the package uses its RDMA
build and reads over RDMA when the node serves it and a device reaches it;
elsewhere its TCP-only build, and ``RDMA_UNAVAILABLE`` says why (see
``sluice._backend``).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Iterable, Iterator, Optional, Sequence, Tuple

import numpy as np

from ._backend import RDMA_UNAVAILABLE
from ._backend import native as _native
from ._buffers import writable_address

AccessDenied = _native.AccessDenied
Forked = _native.Forked
NodeUnavailable = _native.NodeUnavailable
ReadFailed = _native.ReadFailed
SluiceError = _native.SluiceError
StateMismatch = _native.StateMismatch
UnknownDataset = _native.UnknownDataset
WrongKind = _native.WrongKind
from .streams import MdsSamples, Mixture, Records, TokenWindows, WdsSamples, _check_seed, loader_position

__all__ = [
    "connect", "Client", "Dataset", "WindowLoader", "TokenWindows", "Records", "WdsSamples", "MdsSamples", "Mixture",
    "loader_position",
    "SluiceError", "AccessDenied", "UnknownDataset", "NodeUnavailable", "WrongKind", "StateMismatch",
    "ReadFailed", "Forked", "RDMA_UNAVAILABLE",
]

_DTYPES = {1: np.uint8, 2: np.dtype("<u2"), 4: np.dtype("<u4")}


@contextlib.contextmanager
def _range_values() -> Iterator[None]:
    """A range whose offset or length no unsigned integer of the wire holds
    (negative, or a length of 4 GiB or more) is a ``ValueError`` that says
    so, not the native side's bare ``OverflowError``."""
    try:
        yield
    except OverflowError as err:
        raise ValueError(f"a range's offset must be in [0, 2**64) and its length in [0, 2**32): {err}") from None


class Dataset:
    """An open, sealed dataset."""

    def __init__(self, native: "_native.Dataset"):
        self._native = native

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def kind(self) -> str:
        return self._native.kind

    @property
    def length_bytes(self) -> int:
        return self._native.length_bytes

    @property
    def content_hash(self) -> str:
        return self._native.content_hash

    def read_batch(self, ranges: Iterable[Tuple[int, int]]) -> np.ndarray:
        """Reads ``(offset, len)`` byte ranges in one batch and returns their
        bytes concatenated, as a 1-D ``uint8`` array."""
        with _range_values():
            data = self._native.read_batch([(int(o), int(n)) for o, n in ranges])
        return np.frombuffer(data, dtype=np.uint8)

    def read_into(self, ranges: Iterable[Tuple[int, int]], buffer) -> int:
        """Reads ``(offset, len)`` byte ranges in one batch into ``buffer``,
        laid end to end from its start, and returns the bytes written.
        ``buffer`` is any writable, contiguous host buffer: a NumPy array, a
        CPU ``torch.Tensor`` (pinned or not), a ``bytearray``. The GIL is
        released while the bytes arrive. Raises ``ValueError`` if the
        buffer is too small (nothing is read then)."""
        address, nbytes = writable_address(buffer)
        with _range_values():
            return self._native.read_into_address([(int(o), int(n)) for o, n in ranges], address, nbytes)

    def record_index(self) -> "list[tuple[int, int]]":
        """The ``(offset, len)`` of every sample of a records, wds or mds
        dataset."""
        return self._native.record_index()


class Client:
    """A connection to one node; ``endpoint`` is its control API URL
    (``http://`` or ``https://``). ``transport`` is "auto" (RDMA when this
    host and the node have it), "rdma" or "tcp"; when omitted,
    ``SLUICE_TRANSPORT`` or "auto". ``ca_file`` is the CA (PEM) an https
    node's certificate chains to, ``cert_file``/``key_file`` this client's
    certificate for mTLS; when omitted, ``SLUICE_CA_FILE``,
    ``SLUICE_CERT_FILE`` and ``SLUICE_KEY_FILE``."""

    def __init__(
        self,
        endpoint: str,
        transport: "str | None" = None,
        ca_file: "str | None" = None,
        cert_file: "str | None" = None,
        key_file: "str | None" = None,
    ):
        asked = transport or os.environ.get("SLUICE_TRANSPORT", "auto")
        if asked == "rdma" and RDMA_UNAVAILABLE:
            raise SluiceError(f"RDMA unavailable: {RDMA_UNAVAILABLE}")
        self._native = _native.Client(endpoint, transport, ca_file, cert_file, key_file)

    @property
    def transport(self) -> str:
        return self._native.transport

    @property
    def transport_reason(self) -> str:
        """Why that transport: the RDMA device used, or why not RDMA
        (with the TCP-only build, why that build: ``RDMA_UNAVAILABLE``)."""
        if RDMA_UNAVAILABLE and self.transport == "tcp":
            return f"the TCP-only build: {RDMA_UNAVAILABLE}"
        return self._native.transport_reason

    def open(self, name: str, verify_chunks: bool = False, token: "str | None" = None) -> Dataset:
        """Opens a sealed dataset. ``token`` is the grant's token
        (``sluicectl grant create``); without it, ``SLUICE_TOKEN`` if set."""
        return Dataset(self._native.open(name, verify_chunks, token))


def connect(
    endpoint: str,
    transport: "str | None" = None,
    ca_file: "str | None" = None,
    cert_file: "str | None" = None,
    key_file: "str | None" = None,
) -> Client:
    """Connects to the node whose control API is at ``endpoint``
    (``http://HOST:PORT`` or ``https://HOST:PORT``, as ``sluicectl
    --endpoint``). ``ca_file`` is the CA (PEM) an https node's certificate
    chains to (default ``SLUICE_CA_FILE``); ``cert_file``/``key_file`` a
    client certificate for mTLS (``SLUICE_CERT_FILE``/``SLUICE_KEY_FILE``)."""
    return Client(endpoint, transport, ca_file, cert_file, key_file)


class WindowLoader:
    """Random windows of ``window`` consecutive tokens, ``batch_size`` per
    step for this rank, in a deterministic order fixed by ``seed`` that does
    not depend on ``world_size``: rank ``r`` of ``world_size`` takes its
    slice of each global batch of ``batch_size * world_size`` windows.
    ``prefetch`` steps are read ahead. Yields ``(batch_size, window)``
    arrays of the dataset's token dtype.

    ``state_dict()`` / ``load_state_dict()`` save and restore the position
    exactly, also at another world size (the saved global batch is kept).
    An epoch is ``samples_per_epoch`` windows, or ``n / stride_ratio`` for n
    tokens, or by default ``n / window``. With ``prefetch_steps`` the node
    is told the windows of that many steps ahead, and a source-backed
    dataset fills them from its source before they are read.
    """

    def __init__(
        self,
        dataset: Dataset,
        window: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 4,
        samples_per_epoch: Optional[int] = None,
        stride_ratio: Optional[float] = None,
        prefetch_steps: int = 0,
    ):
        self.dataset = dataset
        _check_seed(seed)
        self._native = _native.WindowLoader(
            dataset._native, window, batch_size, seed, rank, world_size, prefetch, samples_per_epoch, stride_ratio
        )
        self._native.set_prefetch_steps(prefetch_steps)
        self._dtype = _DTYPES[self._native.token_bytes]
        self.step: Optional[int] = None

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        step, data, rows = self._native.next_batch()
        self.step = step
        return np.frombuffer(data, dtype=self._dtype).reshape(rows, self._native.window)

    @property
    def last_starts(self) -> Sequence[int]:
        """Token offsets of the windows of the last batch, in row order."""
        return self._native.last_starts

    def state_dict(self) -> dict:
        return json.loads(self._native.state_json())

    def load_state_dict(self, state: dict) -> None:
        self._native.load_state_json(json.dumps(state))

    def state_bytes(self) -> bytes:
        """The state in its 92-byte binary form (``sluicectl replay --state``)."""
        return self._native.state_bytes()
