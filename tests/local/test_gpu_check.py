"""benchmarks/gpu_check.py without a GPU: the same code paths on NVML's stand-in (the tier choice,
the readings and their states); the checks that need CUDA say they were skipped, and why."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nvml_standin

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path, **devices):
    path = tmp_path / "nvml.json"
    nvml_standin.write(path, [0.0, 35.0], used=4 * 2**30, **devices)
    (tmp_path / "cg").mkdir(exist_ok=True)
    (tmp_path / "cg" / "cgroup.controllers").write_text("memory\n")
    env = {**os.environ, nvml_standin.ENV: str(path),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "support"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--nvml-module", "nvml_standin",
                          "--cgroup", str(tmp_path / "cg" / "gpupool"), "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    return out.returncode, json.loads(out.stdout)


def test_without_a_gpu_it_runs_on_the_standin(tmp_path):
    code, r = run(tmp_path, driver="615.10")
    assert code == 0, r
    root = os.geteuid() == 0
    assert r["tier"] == {"status": "ok", "gpus": {
        g: "driver (tier 2)" if root else "watch/framework: the service does not run as root" for g in ("0", "1")}}
    assert r["readings"]["status"] == "ok" and [g["uuid"] for g in r["readings"]["gpus"]] == [
        "GPU-00000000-0000", "GPU-00000001-0000"]
    assert r["readings"]["states"] == {"0": "held", "1": "busy"}  # 4Gi held at 0 %; computing
    assert r["cap"]["status"] == r["idle-held"]["status"] == "skipped"
    assert r["cap"]["why"] == "PyTorch with CUDA is not available"


def test_an_old_driver_or_mig_is_named(tmp_path):
    _, r = run(tmp_path, driver="580.65.06")
    if os.geteuid() == 0:
        assert r["tier"]["gpus"]["0"] == "watch/framework: driver 580 is older than r615"
    _, r = run(tmp_path, driver="615.10", mig=1)
    if os.geteuid() == 0:
        assert "MIG mode" in r["tier"]["gpus"]["1"]
