"""gpupool.sim: replay scenarios (../shared/spec/scenario.md) through the real scheduler.

    from gpupool.sim import load_scenario, simulate
    report = simulate(load_scenario("examples/scenarios/reclaim.yaml"), seed=0)

``gpupool simulate SCENARIO.yaml`` is the command-line front end (gpupool/sim/cli.py).
"""
from __future__ import annotations

import time

from .scenario import Scenario, load_scenario, parse_scenario

__all__ = ["Scenario", "load_scenario", "parse_scenario", "simulate"]


def simulate(scenario: Scenario, seed: int = 0, *, timeline: bool = False, on_cycle=None,
             max_cycles: int = 1_000_000) -> dict:
    """Replay ``scenario`` with ``seed`` and return the JSON report (a dict)."""
    from .engine import Engine
    from .report import build_report

    t0 = time.perf_counter()
    engine = Engine(scenario, seed, on_cycle=on_cycle, max_cycles=max_cycles).run()
    return build_report(engine, timeline=timeline, wall_seconds=time.perf_counter() - t0)
