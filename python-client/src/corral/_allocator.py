"""glibc's malloc, set once for a worker that takes large items.

A raw body of 10 MB becomes a 10 MB ``bytes`` in the worker, and so does every copy of a large
frame. glibc serves such blocks from fresh pages (``mmap``) until its threshold has risen past
them, and gives the top of its heap back to the system once more than twice that threshold lies
free there: with two or more large items in flight (a batch of two 10 MB bodies, and one sent
ahead) each batch's items were faulted in page by page again — 2,400 page faults and 5 ms of the
worker's system time a request, measured at 10 MB and 8 clients, p50 57 ms against 28 ms with
the settings below (BENCHMARKS.md, "Large payload targets"). The proxy's allocator keeps freed
bodies for the next ones the same way (proxy/src/allocator.rs).

The settings: blocks up to 32 MiB (glibc's most) come from the heap, and up to 128 MiB of free
heap stays with the process. Applied once, as a worker that declares ``shm`` (a plain worker
where descriptors can be passed: large bodies may come to it) starts serving (``Worker.run``),
whether or not the proxy then shares memory; not by streaming workers, nor in a process that
only drives a worker through ``corral.testing.FakeProxy``. Set ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_TRIM_THRESHOLD_`` in the environment (or ``glibc.malloc.mmap_threshold`` or
``glibc.malloc.trim_threshold`` in ``GLIBC_TUNABLES``; its other tunables, such as
``arena_max``, are no reason to leave these) to keep glibc's own choices, or others; nothing is
done where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 * 1024 * 1024
_TRIM_THRESHOLD = 128 * 1024 * 1024


def tune() -> None:
    """Applies the settings above, unless the environment sets glibc's own."""
    if not sys.platform.startswith("linux"):
        return
    if any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if any(f"glibc.malloc.{name}=" in tunables for name in ("mmap_threshold", "trim_threshold")):
        return
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        glibc = None
    if not glibc:  # musl and others: not glibc's knobs
        return
    mallopt = ctypes.CDLL(None).mallopt
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
