"""The cycle benchmark's repeated runs: ``--repeat`` replays each shape that many times, taking
turns, and reports the median of every figure (with each run's p50), so that a session can
measure a change on a machine whose runs differ by 20%."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import cycle_speed  # noqa: E402


def test_repeated_runs_report_the_median_and_every_run(capsys):
    assert cycle_speed.main(["--shapes", "churn,pooled", "--nodes", "16", "--queues", "4", "--workloads", "120",
                             "--until", "12", "--repeat", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for shape in ("churn", "pooled"):
        r = out[shape]
        assert len(r["runs_p50"]) == 3
        assert r["cycle_cpu_ms"]["p50"] == pytest.approx(statistics.median(r["runs_p50"]), abs=0.051)
        assert r["preemptions"] >= 0 and r["cycles"] > 0


def test_the_scale_shape_prints_the_spread_of_its_runs(capsys):
    assert cycle_speed.main(["--shapes", "scale", "--nodes", "8", "--queues", "2", "--workloads", "40",
                             "--until", "8", "--scale", "2", "--repeat", "2"]) == 0
    text = capsys.readouterr().out
    assert text.count("median of 2 runs; their p50:") == 2  # the small and the large size
    assert "ratio large/small at p50" in text


def test_the_scale_shape_splits_the_cycle_into_its_parts(capsys):
    """``--split`` times the parts of the cycle at both sizes: each part's CPU ms a cycle, no more
    than the whole cycle's, the plans within reclaim, and the functions put back afterwards."""
    from gpupool.scheduler import core
    from gpupool.scheduler.actions import reclaim

    real = (core.ACTIONS["reclaim"], reclaim.plan, core.Scheduler.start)
    args = ["--shapes", "scale", "--nodes", "8", "--queues", "2", "--workloads", "60", "--until", "10",
            "--scale", "2", "--split"]
    assert cycle_speed.main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["scale"]
    for size in ("small", "large"):
        parts, cycle = out[size]["split_ms"], out[size]["cycle_cpu_ms"]
        assert set(parts) == set(cycle_speed.SPLIT)
        assert parts["allocate"] > 0 and parts["context"] > 0
        assert parts["plans"] <= parts["reclaim"] + 0.1 and parts["allocate pass"] <= parts["allocate"] + 0.1
        assert parts["allocate"] <= cycle["max"]
    assert (core.ACTIONS["reclaim"], reclaim.plan, core.Scheduler.start) == real
    assert cycle_speed.main(args) == 0
    assert "parts, CPU ms a cycle (small / large, ratio; goal <= 3): context" in capsys.readouterr().out


def test_a_repeat_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        cycle_speed.main(["--shapes", "churn", "--repeat", "0"])
    assert "--repeat must be at least 1" in capsys.readouterr().err
