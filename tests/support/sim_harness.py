"""Helpers of the simulator's tests (tests/sim/, and the scheduler's replays in tests/scheduler/):
the real `gpupool simulate` command, scenario files written for a test, the shared scenarios of
tests/scenarios/ and their replay with the engine's invariants checked."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from gpupool.sim import parse_scenario, simulate

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "tests" / "scenarios"
GPUPOOL = [sys.executable, "-m", "gpupool"]


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*GPUPOOL, "simulate", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def write(tmp_path: Path, data, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data) if name.endswith(".json") else yaml.safe_dump(data, sort_keys=False))
    return p


def without_timing(report: dict) -> dict:
    r = dict(report)
    r.pop("timing")
    return r


def report_text(d: dict, seed: int = 0) -> str:
    """A whole simulation's report, timing left out, as text (two runs compared byte for byte)."""
    return json.dumps(without_timing(simulate(parse_scenario(d), seed=seed)), sort_keys=True, default=str)


def data(name: str) -> dict:
    return yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text())


def replay(d: dict, seed: int = 0) -> dict:
    report = simulate(parse_scenario(d), seed=seed, timeline=True)
    assert report["metrics"]["invariant_violations"] == 0, report.get("violations")
    return report
