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


def test_a_repeat_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        cycle_speed.main(["--shapes", "churn", "--repeat", "0"])
    assert "--repeat must be at least 1" in capsys.readouterr().err
