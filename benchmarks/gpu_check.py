"""GPU truth on a machine with an NVIDIA GPU: are fractions enforced, and are the readings real?

    python benchmarks/gpu_check.py [--json]          # on a GPU machine (driver, nvidia-ml-py, CUDA PyTorch)
    python benchmarks/gpu_check.py --nvml-module nvml_standin   # no GPU: the same code on NVML's stand-in

Checks, each reported as ok / FAILED / skipped (with why):

* **tier**: which tier of fraction enforcement each GPU allows (gpupool/backends/gpu_limits.py:
  root, cgroup v2, driver r615+, no MIG) and why not;
* **readings**: NVML's GPUs (UUIDs, memory) as gpupool reads them, against ``nvidia-smi``;
* **cap**: two jobs share GPU 0 at 0.5 each, started as gpupool starts them (the job protocol's
  environment, the start-up hook on PYTHONPATH): the first allocates past its cap and must fail
  with out-of-memory in the job itself, the second allocates within its cap and must keep
  running to the end (PyTorch with CUDA);
* **idle-held**: a job holds 2 GiB and computes nothing; NVML must read 0 % with the memory held,
  which gpupool calls ``held`` (``contract.gpu_state``), then ``busy`` while it computes.

Where there is no GPU, ``cap`` and ``idle-held`` are skipped and ``tier`` and ``readings`` run
against the module given (tests/local/test_gpu_check.py runs it so). Exit status 1 when a check failed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import gpupool  # noqa: E402

if importlib.util.find_spec("gpupool.scheduler") is None:
    # a checkout that is not installed (a bare GPU machine): the layout keeps gpupool's subpackages
    # scheduler/, hub_ext/, spawner/ and widgets/ at the top (pyproject's package-dir); find them there
    gpupool.__path__.append(os.path.dirname(HERE))

from gpupool import protocol as P  # noqa: E402
from gpupool.backends import gpu_limits, nvml  # noqa: E402
from gpupool.contract import gpu_state  # noqa: E402

GiB = 2**30

GREEDY = r"""
import sys, time, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")  # past the cap: must raise here
print("allocated past the cap", flush=True)
"""
MODEST = r"""
import sys, time, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
for _ in range(int(sys.argv[2])):
    x.add_(1)
    time.sleep(0.5)
print("neighbour done", flush=True)
"""
HOLDER = r"""
import sys, time, torch
x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(float(sys.argv[1]))
end = time.time() + float(sys.argv[2])
while time.time() < end:
    x.add_(1)
torch.cuda.synchronize()
"""


def check_tier(mod: Any, cgroup: str) -> dict:
    found = nvml.gpus(mod)
    if not found:
        return {"status": "skipped", "why": "NVML lists no GPU"}
    out = {}
    mod.nvmlInit()
    try:
        for g in found:
            ok, why = gpu_limits.driver_tier(mod, g["index"], cgroup)
            out[str(g["index"])] = "driver (tier 2)" if ok else f"watch/framework: {why}"
    finally:
        mod.nvmlShutdown()
    return {"status": "ok", "gpus": out}


def check_readings(mod: Any) -> dict:
    found = nvml.gpus(mod)
    util = nvml.utilization(mod)
    if not found:
        return {"status": "skipped", "why": "NVML lists no GPU"}
    problems = [f"GPU {i}: utilisation {r['utilization']}" for i, r in util.items()
                if r["utilization"] is not None and not 0 <= r["utilization"] <= 100]
    smi = shutil.which("nvidia-smi")
    if smi and mod is None:
        text = subprocess.run([smi, "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True).stdout
        listed = [line.strip() for line in text.splitlines() if line.strip()]
        if listed != [g["uuid"] for g in found]:
            problems.append(f"UUIDs differ: NVML {[g['uuid'] for g in found]}, nvidia-smi {listed}")
    states = {str(i): gpu_state(r["utilization"], r["memory_used"]) for i, r in util.items()}
    return {"status": "FAILED" if problems else "ok", "problems": problems, "gpus": found, "states": states}


def _torch_cuda() -> str:
    code = "import torch; print(torch.cuda.is_available())"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return "" if out.stdout.strip() == "True" else "PyTorch with CUDA is not available"


def _job(program: str, args: list[str], env: dict, work: str) -> subprocess.Popen:
    path = os.path.join(work, f"prog-{len(os.listdir(work))}.py")
    with open(path, "w") as f:
        f.write(program)
    full = P.with_startup_hook({**os.environ, **env})
    return subprocess.Popen([sys.executable, path, *args], env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def check_cap(mod: Any) -> dict:
    found = nvml.gpus(mod)
    why = "NVML lists no GPU" if not found else _torch_cuda()
    if why:
        return {"status": "skipped", "why": why}
    total = found[0]["memory_total"]
    cap = P.memory_limit(0.5, total, 0, 0.03, 256 * 2**20)
    env = P.gpu_env({"node": "here", "gpus": [0], "fraction": 0.5}, uuids=[found[0]["uuid"]], memory=cap, total=total)
    with tempfile.TemporaryDirectory() as work:
        neighbour = _job(MODEST, [str(cap // 2), "20"], env, work)
        time.sleep(5)
        greedy = _job(GREEDY, [str(int(cap * 1.2))], env, work)
        g_out, _ = greedy.communicate(timeout=300)
        n_out, _ = neighbour.communicate(timeout=300)
    oom = greedy.returncode != 0 and ("OutOfMemoryError" in g_out or "out of memory" in g_out.lower())
    ok = oom and neighbour.returncode == 0 and "neighbour done" in n_out
    return {"status": "ok" if ok else "FAILED", "cap_bytes": cap, "greedy_exit": greedy.returncode,
            "greedy_out": g_out[-500:], "neighbour_exit": neighbour.returncode, "neighbour_out": n_out[-500:]}


def check_idle_held(mod: Any) -> dict:
    found = nvml.gpus(mod)
    why = "NVML lists no GPU" if not found else _torch_cuda()
    if why:
        return {"status": "skipped", "why": why}
    env = P.gpu_env({"node": "here", "gpus": [0], "fraction": 1.0}, uuids=[found[0]["uuid"]])
    with tempfile.TemporaryDirectory() as work:
        job = _job(HOLDER, ["15", "15"], env, work)
        time.sleep(10)
        idle = nvml.utilization(mod)[0]
        time.sleep(10)
        busy = nvml.utilization(mod)[0]
        job.communicate(timeout=120)
    states = (gpu_state(idle["utilization"], idle["memory_used"]), gpu_state(busy["utilization"], busy["memory_used"]))
    return {"status": "ok" if states == ("held", "busy") else "FAILED", "states": states, "idle": idle, "busy": busy}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvml-module", default="", help="a pynvml-compatible module (default: pynvml)")
    ap.add_argument("--cgroup", default="/sys/fs/cgroup/gpupool", help="c.GPUPool.gpu_memory_cgroup")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    mod = nvml.load_module(args.nvml_module)
    real = nvml._module(mod)
    results = {"tier": check_tier(real, args.cgroup) if real is not None else {"status": "skipped", "why": "no NVML"},
               "readings": check_readings(mod), "cap": check_cap(mod), "idle-held": check_idle_held(mod)}
    if args.json:
        print(json.dumps(results, indent=1, default=str))
    else:
        for name, r in results.items():
            print(f"{name:10} {r['status']}  {r.get('why') or json.dumps({k: v for k, v in r.items() if k != 'status'}, default=str)[:300]}")
    return 1 if any(r["status"] == "FAILED" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
