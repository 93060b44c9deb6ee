"""The address and size of a writable, contiguous buffer (a NumPy array, a
``torch.Tensor`` on the CPU, pinned or not, or anything with the writable
buffer protocol), for the native side to fill with the GIL released."""

from __future__ import annotations

import ctypes
from typing import Any, Tuple


def writable_address(buffer: Any) -> Tuple[int, int]:
    """``(address, nbytes)`` of ``buffer``; raises ``ValueError`` if it is
    read-only, not contiguous, or not in host memory. The caller keeps
    ``buffer`` alive while the address is in use."""
    data_ptr = getattr(buffer, "data_ptr", None)
    if callable(data_ptr) and hasattr(buffer, "is_contiguous"):  # a torch.Tensor
        if buffer.device.type != "cpu":
            raise ValueError(f"a tensor on {buffer.device} is not host memory: read into a CPU (pinned) tensor")
        if not buffer.is_contiguous():
            raise ValueError("the tensor is not contiguous")
        return int(buffer.data_ptr()), int(buffer.numel() * buffer.element_size())
    flags = getattr(buffer, "flags", None)
    if flags is not None and hasattr(buffer, "ctypes"):  # a numpy.ndarray
        if not flags.writeable:
            raise ValueError("the array is read-only")
        if not flags.c_contiguous:
            raise ValueError("the array is not C-contiguous")
        return int(buffer.ctypes.data), int(buffer.nbytes)
    view = memoryview(buffer)
    if view.readonly:
        raise ValueError("the buffer is read-only")
    if not view.c_contiguous:
        raise ValueError("the buffer is not contiguous")
    view = view.cast("B")
    if view.nbytes == 0:
        return 0, 0
    return ctypes.addressof(ctypes.c_char.from_buffer(view)), view.nbytes
