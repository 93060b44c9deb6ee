"""Mosaic Data Shard samples from the spans an ``mds`` dataset serves: each
sample a dict of its columns, decoded as Mosaic Streaming's
``StreamingDataset`` decodes them.

A sample holds a little-endian ``u32`` size for each column of no fixed
size, then each column's bytes in order. The columns are those of the
dataset's first shard (the node refused any later shard with others), read
from the dataset itself, so no ``index.json`` is needed.

sluice decodes the encodings training data mostly uses (bytes, text,
numbers, JSON, NumPy arrays) itself, value for value as Mosaic's decoders
do (tested against ``StreamingDataset``), and leaves images and lists to
Mosaic's own decoders where ``mosaicml-streaming`` is installed (naming the
package where it is not): importing it takes seconds in every DataLoader
worker. ``pkl`` columns run code from the data when decoded, so they decode
only when asked for (``allow_unsafe_types=True``), as in
``StreamingDataset``.
"""

from __future__ import annotations

import json
import pickle
import struct
from decimal import Decimal
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ._backend import native as _native

_UNSAFE = {"pkl"}

_NUMBERS = {
    "uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
    "int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
    "float16": "<f2", "float32": "<f4", "float64": "<f8",
}

_OWN: Dict[str, Callable[[bytes], Any]] = {
    "bytes": bytes,
    "str": lambda data: data.decode("utf-8"),
    "int": lambda data: int(np.frombuffer(data, "<i8")[0]),
    "str_int": lambda data: int(data.decode("utf-8")),
    "str_float": lambda data: float(data.decode("utf-8")),
    "str_decimal": lambda data: Decimal(data.decode("utf-8")),
    "json": lambda data: json.loads(data.decode("utf-8")),
    "pkl": pickle.loads,
    **{name: (lambda dtype: lambda data: np.frombuffer(data, dtype)[0])(dtype) for name, dtype in _NUMBERS.items()},
}

# Mosaic's codes for an array's value dtype, and for its shape's.
_ARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
                 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}
_SHAPE_DTYPES = ("<u1", "<u2", "<u4", "<u8")


def _array_decoder(encoding: str) -> Callable[[bytes], Any]:
    """Mosaic's ``ndarray[:DTYPE[:SHAPE]]``: the dtype and the shape are
    the encoding's, or else each sample gives them before its values (a
    dtype byte; then one byte of rank and shape width, and the shape)."""
    parts = encoding.split(":")[1:]
    fixed_dtype = _NUMBERS[parts[0]] if parts and parts[0] else None
    fixed_shape = tuple(int(d) for d in parts[1].split(",")) if len(parts) > 1 else None

    def decode(data: bytes) -> Any:
        at, dtype, shape = 0, fixed_dtype, fixed_shape
        if dtype is None:
            dtype = _NUMBERS[_ARRAY_DTYPES[data[at]]]
            at += 1
        if shape is None:
            rank, width = data[at] >> 2, data[at] & 3
            at += 1
            shape = tuple(int(d) for d in np.frombuffer(data, _SHAPE_DTYPES[width], count=rank, offset=at))
            at += rank << width
        return np.frombuffer(data, dtype, offset=at).reshape(shape)

    return decode


def _own_decoder(encoding: str) -> Optional[Callable[[bytes], Any]]:
    if encoding in _OWN:
        return _OWN[encoding]
    if encoding == "ndarray" or encoding.startswith("ndarray:"):
        try:
            return _array_decoder(encoding)
        except (KeyError, ValueError):
            return None  # not an encoding sluice reads: Mosaic's decoder says what is wrong
    return None


def _mosaic_decoder() -> Optional[Callable[[str, bytes], Any]]:
    """``mds_decode`` of the installed ``mosaicml-streaming``, if any."""
    for module in ("streaming.base.format.mds.encodings", "streaming.format.mds.encodings"):
        try:
            return __import__(module, fromlist=["mds_decode"]).mds_decode
        except ImportError:
            continue
    return None


class Columns:
    """An ``mds`` dataset's columns: names, encodings, and sizes (``None``
    for a column whose size each sample gives)."""

    def __init__(self, names: List[str], encodings: List[str], sizes: List[Optional[int]]):
        if not names or not len(names) == len(encodings) == len(sizes):
            raise _native.WrongKind(f"{len(names)} MDS column names, {len(encodings)} encodings, {len(sizes)} sizes")
        self.names, self.encodings, self.sizes = names, encodings, sizes
        self._decoders: Optional[List[Callable[[bytes], Any]]] = None

    def check(self, decode: bool, allow_unsafe_types: bool) -> None:
        """Chooses each column's decoder, refusing, before any read,
        columns that cannot or may not be decoded."""
        if not decode:
            return
        unsafe = [name for name, encoding in zip(self.names, self.encodings) if encoding in _UNSAFE]
        if unsafe and not allow_unsafe_types:
            raise ValueError(f"MDS columns {unsafe} are pickled (pkl), which runs code from the data when decoded: "
                             "pass allow_unsafe_types=True if the data is trusted, or decode=False for bytes")
        decoders = [_own_decoder(encoding) for encoding in self.encodings]
        if None in decoders:
            mosaic = _mosaic_decoder()
            if mosaic is None:
                missing = [f"{name} ({encoding})" for name, encoding, decoder in
                           zip(self.names, self.encodings, decoders) if decoder is None]
                raise ValueError(f"decoding MDS columns {', '.join(missing)} needs mosaicml-streaming "
                                 "(pip install mosaicml-streaming), or decode=False for their bytes")
            decoders = [decoder or (lambda encoding: lambda data: mosaic(encoding, data))(encoding)
                        for decoder, encoding in zip(decoders, self.encodings)]
        self._decoders = decoders

    def sample(self, span: bytes, decode: bool) -> Dict[str, Any]:
        """One sample's columns: decoded values, or bytes with ``decode``
        false."""
        sizes, at = [], 0
        for size in self.sizes:
            if size is None:
                if at + 4 > len(span):
                    raise _native.ReadFailed(f"an MDS sample of {len(span)} bytes, too short for its column sizes")
                (size,) = struct.unpack_from("<I", span, at)
                at += 4
            sizes.append(size)
        if at + sum(sizes) != len(span):
            raise _native.ReadFailed(f"an MDS sample of {len(span)} bytes whose columns take {at + sum(sizes)}")
        decoders = self._decoders
        assert not decode or decoders is not None, "check() chooses the decoders first"
        out: Dict[str, Any] = {}
        for column, (name, size) in enumerate(zip(self.names, sizes)):
            data = span[at:at + size]
            at += size
            out[name] = decoders[column](data) if decode and decoders is not None else data
        return out


def columns_of(dataset: Any) -> Columns:
    """The columns of an ``mds`` dataset (a native ``Dataset``), from its
    first shard's header: three small reads."""
    (count,) = struct.unpack("<I", dataset.read_batch([(0, 4)]))
    offsets_end = 4 + 4 * (count + 1)
    (first,) = struct.unpack("<I", dataset.read_batch([(4, 4)]))
    config = json.loads(bytes(dataset.read_batch([(offsets_end, first - offsets_end)])))
    sizes = [None if size is None else int(size) for size in config["column_sizes"]]
    return Columns(list(config["column_names"]), list(config["column_encodings"]), sizes)
