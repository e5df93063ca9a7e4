"""Admission overhead the GPU-aware spawner adds to a server start.

Starts a real JupyterHub + proxy + gpupool service (tests/support/hub_harness.py; 2 nodes x 4 GPUs, one
queue) and measures, with a free GPU each time:

* ``service``: POST workspaces/{user} -> GET until ``running``, polled every 2 ms (the service's
  own latency: request handling, the scheduler's wake-up and cycle, the database write);
* ``spawner``: the spawner's own code path, ``GPUPoolSpawnerMixin.admit()`` (its HTTP client,
  its polling schedule) from the request to the granted allocation, then ``release()``;
* ``release``: the DELETE that frees the GPUs.

Goal: spawner admission p50 <= 100 ms. Prints one JSON object (``--json``) or a table.

    .venv/bin/python benchmarks/spawn_admission.py [--n 30] [--json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from hub_harness import Hub  # noqa: E402
from traitlets.config import Config  # noqa: E402

from gpupool.spawner import LocalGPUSpawner  # noqa: E402
from gpupool.spawner.form import GPURequest  # noqa: E402


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = min(len(values) - 1, max(0, int(round(q / 100 * (len(values) - 1)))))
    return values[k]


def summary(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": round(pct(values, 50), 2), "p95_ms": round(pct(values, 95), 2),
            "mean_ms": round(statistics.fmean(values), 2) if values else None,
            "max_ms": round(max(values), 2) if values else None}


def bench_service(hub: Hub, n: int) -> tuple[list[float], list[float]]:
    admit, release = [], []
    tok = hub.service_token
    for i in range(n):
        user = f"u{i % 4}"
        t0 = time.perf_counter()
        r = hub.api("POST", f"workspaces/{user}", tok, json={"server": "", "gpus": 1, "queue": "lab"})
        assert r.status_code in (200, 201), r.text
        ws = r.json()
        while ws["status"] != "running":
            time.sleep(0.002)
            ws = hub.api("GET", f"workspaces/{user}", tok).json()
        admit.append((time.perf_counter() - t0) * 1000)
        t1 = time.perf_counter()
        assert hub.api("DELETE", f"workspaces/{user}", tok).status_code == 200
        release.append((time.perf_counter() - t1) * 1000)
    return admit, release


async def bench_spawner(hub: Hub, n: int) -> list[float]:
    cfg = Config()
    cfg.LocalGPUSpawner.gpupool_url = hub.service_url
    cfg.LocalGPUSpawner.gpupool_token = hub.service_token
    out = []
    for i in range(n):
        # the spawner needs only the user's name (and admin/groups for the form) from JupyterHub's User
        user = types.SimpleNamespace(name=f"s{i % 4}", admin=False, groups=[], url=f"/user/s{i % 4}/")
        sp = LocalGPUSpawner(user=user, config=cfg)
        sp._progress_reset()
        t0 = time.perf_counter()
        ws = await sp.admit(GPURequest(gpus=1, queue="lab"))
        out.append((time.perf_counter() - t0) * 1000)
        assert ws["status"] == "running" and ws["allocation"], ws
        sp.apply_allocation(ws)
        assert sp.gpu_env.get("CUDA_VISIBLE_DEVICES"), sp.gpu_env
        await sp.release()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30, help="admissions per measurement (default 30)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    users = [f"u{i}" for i in range(4)] + [f"s{i}" for i in range(4)]
    gp = {"nodes": [{"name": "node", "count": 2, "gpus": 4, "gpu_memory": "24Gi"}],
          "queues": [{"name": "lab", "deserved": {"gpu": 8}}], "cycle_seconds": 2.0}
    with tempfile.TemporaryDirectory() as tmp, Hub(tmp, gpupool=gp, users=users) as hub:
        # warm-up (first requests pay for imports and connection set-up)
        bench_service(hub, 3)
        service, release = bench_service(hub, args.n)
        spawner = asyncio.run(bench_spawner(hub, args.n))
    result = {"benchmark": "spawn_admission", "goal_p50_ms": 100,
              "service_admission": summary(service), "spawner_admission": summary(spawner),
              "release": summary(release)}
    result["meets_goal"] = result["spawner_admission"]["p50_ms"] <= 100
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"admission overhead with a free GPU (n={args.n}; goal: spawner p50 <= 100 ms)")
        for key in ("service_admission", "spawner_admission", "release"):
            s = result[key]
            print(f"  {key:18} p50 {s['p50_ms']:7.1f} ms   p95 {s['p95_ms']:7.1f} ms   max {s['max_ms']:7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
