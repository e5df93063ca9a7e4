"""Job submissions per second accepted *and persisted* by the gpupool service (goal: >= 500/s).

Starts a real JupyterHub + proxy + the gpupool service (tests/hub_harness.py) in a temporary
directory, then POSTs ``--jobs`` small notebook jobs from ``--clients`` concurrent keep-alive HTTP
connections (spread over ``--procs`` client processes) with a real JupyterHub token, directly to
the service (``--proxy``: through configurable-http-proxy). Each 201 means the row is committed to
SQLite (WAL) and the notebook written to the job's directory. The pool's one queue has a limit of
0 GPUs, so the jobs stay queued and every scheduling cycle during the run sees all of them (the
loop runs alongside, as in production). At the end the database is counted to check that every
accepted job is there.

    .venv/bin/python benchmarks/api_throughput.py [--jobs 3000] [--clients 16] [--procs 2] [--proxy] [--json]
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hub_harness import Hub, notebook  # noqa: E402

BODY = {"notebook_content": notebook("print('hello')"), "gpus": 1, "parameters": {"lr": 0.1}}


def _client(url: str, token: str, n: int, threads: int, out: mp.Queue) -> None:
    u = urlparse(url)
    body = json.dumps(BODY).encode()
    headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(n))

    def worker() -> None:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        mine: list[float] = []
        while True:
            with lock:
                if next(counter, None) is None:
                    break
            t = time.perf_counter()
            conn.request("POST", u.path + "jobs", body, headers)
            r = conn.getresponse()
            data = r.read()
            mine.append(time.perf_counter() - t)
            if r.status != 201:
                errors.append(f"{r.status} {data[:200]!r}")
        conn.close()
        with lock:
            lat.extend(mine)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put((lat, errors))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--clients", type=int, default=16, help="concurrent connections in all")
    p.add_argument("--procs", type=int, default=2, help="client processes")
    p.add_argument("--proxy", action="store_true", help="through configurable-http-proxy")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp:
        cfg = {"nodes": [{"name": "box", "gpus": 1}], "cycle_seconds": 2.0,
               "queues": [{"name": "bench", "deserved": {"gpu": 0}, "limit": {"gpu": 0}}]}
        with Hub(tmp, gpupool=cfg, users=["alice"]) as hub:
            token = hub.token("alice")
            url = hub.proxy_api_url if args.proxy else hub.api_url
            # warm the service's token cache and the connection path
            assert hub.api("POST", "jobs", token, json=BODY).status_code == 201
            q: mp.Queue = mp.Queue()
            per_proc = [args.jobs // args.procs + (1 if i < args.jobs % args.procs else 0) for i in range(args.procs)]
            threads = max(1, args.clients // args.procs)
            procs = [mp.Process(target=_client, args=(url, token, n, threads, q)) for n in per_proc]
            t0 = time.perf_counter()
            for pr in procs:
                pr.start()
            results = [q.get() for _ in procs]
            wall = time.perf_counter() - t0
            for pr in procs:
                pr.join()
            lat = sorted(x for r in results for x in r[0])
            errors = [e for r in results for e in r[1]]
            db = sqlite3.connect(hub.settings["db_url"].removeprefix("sqlite:///"))
            persisted = db.execute("SELECT COUNT(*) FROM workloads WHERE type='job'").fetchone()[0] - 1
            db.close()
            cycles = hub.api("GET", "health").json()["cycles"]
    ok = len(lat) - len(errors)
    report = {
        "jobs": args.jobs, "clients": args.clients, "procs": args.procs, "via": "proxy" if args.proxy else "direct",
        "accepted": ok, "errors": len(errors), "persisted": persisted, "wall_seconds": round(wall, 3),
        "submissions_per_second": round(ok / wall, 1),
        "latency_ms": {"p50": round(1000 * statistics.median(lat), 2),
                       "p95": round(1000 * lat[int(0.95 * (len(lat) - 1))], 2),
                       "max": round(1000 * lat[-1], 2)},
        "scheduling_cycles_during_run": cycles, "goal_per_second": 500,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(f"api_throughput: {report['submissions_per_second']} submissions/s accepted and persisted "
              f"({ok} in {wall:.2f} s, {args.clients} connections {report['via']}; goal >= 500/s)")
        print(f"  latency p50 {report['latency_ms']['p50']} ms, p95 {report['latency_ms']['p95']} ms, "
              f"max {report['latency_ms']['max']} ms; {persisted} rows in the database; "
              f"{cycles} scheduling cycles ran meanwhile")
        if errors:
            print(f"  {len(errors)} errors, e.g. {errors[0]}")
    return 0 if not errors and persisted == ok else 1


if __name__ == "__main__":
    sys.exit(main())
