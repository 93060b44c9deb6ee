"""Which build of the native client this process uses.

The package carries two builds of one extension module where it was built
beside rdma-core: ``_native_rdma``, linked against libibverbs and
librdmacm, and ``_native``, TCP only, which loads on any host. A host with
rdma-core's libraries gets the RDMA build (and RDMA wherever the node and a
device allow it); a host without them gets the TCP build, and
``RDMA_UNAVAILABLE`` says why, as does every client's ``transport_reason``.
``SLUICE_NATIVE=tcp`` picks the TCP build outright. One process loads one
build: both define the same classes and exceptions.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType
from typing import Optional, Tuple


def _load() -> Tuple[ModuleType, Optional[str]]:
    tcp_only = "sluice._native"
    if os.environ.get("SLUICE_NATIVE", "") == "tcp":
        return importlib.import_module(tcp_only), "SLUICE_NATIVE=tcp chose the TCP-only build"
    if importlib.util.find_spec("sluice._native_rdma") is None:
        reason = "this package was built without RDMA (no rdma-core where it was built)"
        return importlib.import_module(tcp_only), reason
    try:
        return importlib.import_module("sluice._native_rdma"), None
    except ImportError as err:
        reason = f"its RDMA build does not load on this host ({err}); rdma-core's libibverbs1 and librdmacm1 provide it"
        return importlib.import_module(tcp_only), reason


native, RDMA_UNAVAILABLE = _load()
