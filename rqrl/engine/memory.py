"""Freed buffers kept in the process, so the next rollout's buffers of the same size cost no page faults.

Learners and workers allocate and free buffers of the same few sizes once per rollout (entries, decompressed
payloads, frames gathered into observations, batches): megabytes each with images. glibc's malloc serves
such sizes with fresh ``mmap`` pages or trims them off its heap when freed, so every rollout pays a page
fault per 4 KB it touches again: with 84x84 frames that was 40% of the learner's CPU per env step
(``benchmarks/image_obs.py``). ``keep_freed_memory`` raises malloc's mmap and trim thresholds: the freed
buffers stay on the heap for the next rollout, and the process's memory stays at its peak (a learner's and
a worker's peak is a few batches). Set ``RQRL_KEEP_FREED_MEMORY=0`` to leave malloc as it is.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

VARIABLE = "RQRL_KEEP_FREED_MEMORY"
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 2**31 - 1
"""Allocations up to this size (mallopt's largest) come from the heap (glibc's default is 128 KB, raised up to 32 MB
as it goes). It was 256 MB, but a learner's batch of frame stacks outgrows that: 14 workers x 32 envs x 64 steps
is 809 MB, fresh pages each collect (``image_obs.py --envs 160`` on 2 workers, 578 MB batches: the learner's CPU
per step 25.2 and 26.7 us at 256 MB, 18.4 and 18.7 at this; BENCHMARKS.md). It governs the main thread's heap:
glibc's arenas for other threads still map an allocation over 64 MB afresh (the batch is made on the main thread)."""
TRIM_THRESHOLD_BYTES = 2**31 - 1
"""Freed heap memory up to this much is kept rather than given back to the system."""

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Raise glibc malloc's thresholds in this process, once (see the module's docstring); False where there is no
    glibc (macOS, musl) or ``RQRL_KEEP_FREED_MEMORY=0``."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if os.environ.get(VARIABLE, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD,
                                                                                 TRIM_THRESHOLD_BYTES) == 1
    log.debug("malloc keeps freed memory: %s", applied)
    return applied
