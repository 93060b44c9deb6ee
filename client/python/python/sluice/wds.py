"""WebDataset samples from the tar spans a ``wds`` dataset serves: each
sample's members as ``{"__key__": key, ext: bytes, ...}``, as the
``webdataset`` package yields them, with optional decoders. The span is
split by the same code that indexed the shard at ingest
(``sluice_proto::tar``), so a key here is always the key ingest used."""

from __future__ import annotations

import functools
import io
import json
from typing import Any, Callable, Dict, Union

from ._backend import native as _native

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


@functools.lru_cache(maxsize=None)
def webdataset_decoder(spec: str) -> Callable[[Dict[str, Any]], Dict[str, Any]]:
    """The ``webdataset`` package's own decoder for an image spec
    (``"pil"``, ``"rgb8"``, ``"torchrgb"``, ...), as
    ``WebDataset(...).decode(spec)`` builds it: the image handler, then
    webdataset's default handlers (text, JSON, class labels, ``.npy``,
    ``.pth``, ...). Built once a process; only the spec travels to workers."""
    try:
        from webdataset import autodecode
    except ImportError:
        raise ValueError(f"decode={spec!r} is one of webdataset's decoders: pip install webdataset") from None
    if spec not in autodecode.imagespecs:
        raise ValueError(f"unknown decoder {spec!r}: None, 'basic', a function (ext, bytes) -> value, "
                         f"or one of webdataset's image specs {sorted(autodecode.imagespecs)}")
    return autodecode.Decoder([autodecode.ImageHandler(spec)])


def check_decode(decode: Union[None, str, Decoder]) -> None:
    """Raises ``ValueError`` now for a ``decode`` that :func:`sample` would
    refuse, rather than in a worker at the first batch."""
    if isinstance(decode, str) and decode != "basic":
        webdataset_decoder(decode)
    elif decode is not None and not isinstance(decode, str) and not callable(decode):
        raise ValueError(f"decode is None, a string or a function, not {type(decode).__name__}")


def sample(span: bytes, decode: Union[None, str, Decoder] = None) -> Dict[str, Any]:
    """One sample's dict from its tar span: ``__key__`` and one entry per
    member extension. ``decode`` is ``None`` (bytes), ``"basic"``
    (:func:`basic_decoder`), a function ``(ext, bytes) -> value``, or one of
    webdataset's image specs (``"pil"``, ``"rgb8"``, ``"torchrgb"``, ...),
    which decodes the sample as ``WebDataset(...).decode(spec)`` does (it
    needs the ``webdataset`` package, and Pillow for the images)."""
    whole = None
    if decode == "basic":
        decode = basic_decoder
    elif isinstance(decode, str):
        whole, decode = webdataset_decoder(decode), None
    out: Dict[str, Any] = {}
    for key, ext, data in _native.wds_members(span):
        if "__key__" not in out:
            out["__key__"] = key
        elif out["__key__"] != key:
            raise ValueError(f"a sample span holds two keys: {out['__key__']!r} and {key!r}")
        out[ext] = decode(ext, data) if decode is not None else data
    if "__key__" not in out:
        raise ValueError("a sample span without a member WebDataset takes (a shard indexed before sluice passed "
                         "over metadata and names without an extension: ingest it again)")
    return whole(out) if whole is not None else out
