"""WebDataset samples from the tar spans a ``wds`` dataset serves: each
sample's members as ``{"__key__": key, ext: bytes, ...}``, as the
``webdataset`` package yields them, with optional decoders."""

from __future__ import annotations

import io
import json
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

_BLOCK = 512


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _octal(field: bytes) -> int:
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax_path(data: bytes) -> Optional[str]:
    """The ``path`` record of a pax extended header, if it has one."""
    at = 0
    while at < len(data):
        space = data.index(b" ", at)
        length = int(data[at:space])
        record = data[space + 1 : at + length - 1]
        key, _, value = record.partition(b"=")
        if key == b"path":
            return value.decode("utf-8", "surrogateescape")
        at += length
    return None


def members(span: bytes) -> Iterator[Tuple[str, bytes]]:
    """The ``(path, data)`` of each regular file in a tar span (ustar, GNU
    long names and pax paths); raises ``ValueError`` on a truncated span."""
    view = memoryview(span)
    at = 0
    long_name: Optional[str] = None
    while at + _BLOCK <= len(view):
        block = bytes(view[at : at + _BLOCK])
        if block == bytes(_BLOCK):
            return
        size = _octal(block[124:136])
        start = at + _BLOCK
        if start + size > len(view):
            raise ValueError(f"tar member at {at} runs past the sample's {len(view)} bytes")
        data = bytes(view[start : start + size])
        flag = block[156:157]
        if flag == b"L":
            long_name = _text(data)
        elif flag == b"x":
            long_name = _pax_path(data) or long_name
        elif flag in (b"0", b"\0", b"7"):
            name = _text(block[:100])
            if block[257:262] == b"ustar":
                prefix = _text(block[345:500])
                name = f"{prefix}/{name}" if prefix else name
            yield (long_name or name), data
            long_name = None
        at = start + (size + _BLOCK - 1) // _BLOCK * _BLOCK


def split_key(path: str) -> Tuple[str, str]:
    """WebDataset's split of a member path: the directory and file name up
    to the first dot of the file name, and the rest (the extension)."""
    slash = path.rfind("/") + 1
    dot = path.find(".", slash)
    if dot < 0:
        return path, ""
    return path[:dot], path[dot + 1 :]


Decoder = Callable[[str, bytes], Any]


def basic_decoder(ext: str, data: bytes) -> Any:
    """Text, JSON, class labels and ``.npy`` arrays; anything else stays bytes."""
    last = ext.rsplit(".", 1)[-1].lower()
    if last in ("txt", "text"):
        return data.decode("utf-8")
    if last == "json":
        return json.loads(data)
    if last in ("cls", "cls2", "index", "inx", "id"):
        return int(data)
    if last == "npy":
        import numpy as np

        return np.load(io.BytesIO(data), allow_pickle=False)
    return data


def sample(span: bytes, decode: Union[None, str, Decoder] = None) -> Dict[str, Any]:
    """One sample's dict from its tar span: ``__key__`` and one entry per
    member extension. ``decode`` is ``None`` (bytes), ``"basic"``
    (:func:`basic_decoder`) or a function ``(ext, bytes) -> value``."""
    if decode == "basic":
        decode = basic_decoder
    elif isinstance(decode, str):
        raise ValueError(f"unknown decoder {decode!r} (None, 'basic' or a function)")
    out: Dict[str, Any] = {}
    for path, data in members(span):
        key, ext = split_key(path)
        if "__key__" not in out:
            out["__key__"] = key
        elif out["__key__"] != key:
            raise ValueError(f"a sample span holds two keys: {out['__key__']!r} and {key!r}")
        out[ext] = decode(ext, data) if decode is not None else data
    if "__key__" not in out:
        raise ValueError("a sample span without a member")
    return out
