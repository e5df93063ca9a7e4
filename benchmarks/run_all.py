"""Run every gpupool benchmark once, in a few minutes, and print their numbers (`make bench`).

Each benchmark is its own script with more options (see its --help); this runs the standard
configuration of each in turn and stops at the first that fails:

* cycle_speed.py: one scheduling cycle at 1000 nodes x 8 GPUs, 200 queues, 20,000 workloads
  (goal: p50 <= 100 ms);
* placement.py: trace fill on the Alibaba default trace, seeds 42..51, every policy, beside the
  FGD paper's numbers (BestFit 92.86%, FGD 95.23%);
* api_throughput.py: job submissions per second accepted and persisted (goal >= 500/s), then
  ``--loaded``: submission latency while one-second scheduling cycles of 20,000 workloads run
  (goal: p95 <= 50 ms);
* spawn_admission.py: admission overhead the GPU-aware spawner adds (goal <= 100 ms);
* usage_report.py: a month's consumption report over 20,000 ledger records and 276,480
  utilisation rows (docs/admin.md);
* api_fuzz.py: 10,000 schemathesis requests from the OpenAPI document (goal: no 5xx, every answer
  as documented).
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = [
    ("cycle_speed.py", ["--cycles", "5"]),
    ("placement.py", ["--trace", "default", "--policy", "default", "fgd", "bestfit", "random", "--seeds", "42-51"]),
    ("api_throughput.py", []),
    ("api_throughput.py", ["--loaded", "--seconds", "20"]),
    ("spawn_admission.py", []),
    ("usage_report.py", []),
    ("api_fuzz.py", []),
]


def main() -> int:
    for script, args in RUNS:
        print(f"\n=== {script} {' '.join(args)}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, str(HERE / script), *args])
        print(f"--- {script}: {time.monotonic() - t0:.0f} s, exit {rc}", flush=True)
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
