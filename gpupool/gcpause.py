"""Run a scheduling cycle without Python's cyclic garbage collector.

A cycle allocates hundreds of thousands of short-lived, acyclic objects (tuples, candidates,
reasons) while the process holds a large, long-lived object graph (every workload of the
snapshot, the simulator's or the service's state). Each object allocation counts towards the
collector's thresholds, so a busy cycle triggers full collections that walk the whole graph and
find nothing to free (measured on the churning cluster of benchmarks/cycle_speed.py: 27 full
collections in 61 cycles, none collecting an object; about a quarter of the cycle's CPU time).
Reference counting frees the cycle's garbage either way; pausing the collector for the length of
the cycle means one deferred collection afterwards instead of several during it.

The scheduler core stays free of this (it is pure); the adapters that run cycles (the simulator
and the service's loop) wrap ``Scheduler.schedule`` in ``paused_gc()``.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector for the block (if it was enabled), re-enable it after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
