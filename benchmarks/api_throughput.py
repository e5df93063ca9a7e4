"""Job submissions per second accepted *and persisted* by the gpupool service (goal: >= 500/s).

Starts a real JupyterHub + proxy + the gpupool service (tests/support/hub_harness.py) in a temporary
directory, then POSTs ``--jobs`` small notebook jobs from ``--clients`` concurrent keep-alive HTTP
connections (spread over ``--procs`` client processes) with a real JupyterHub token, directly to
the service (``--proxy``: through configurable-http-proxy). Each 201 means the row is committed to
SQLite (WAL) and the notebook written to the job's directory. The pool's one queue has a limit of
0 GPUs, so the jobs stay queued and every scheduling cycle during the run sees all of them (the
loop runs alongside, as in production). At the end the database is counted to check that every
accepted job is there.

``--loaded``: submission *latency* while long scheduling cycles run (goal: p95 <= 50 ms). The
service's database is seeded before it starts with the large cluster of issue 13
(benchmarks/cycle_speed.py ``build``: 1000 nodes x 8 GPUs, 200 queues, 20,000 workloads, ~90% of
the GPUs held). The workloads are command jobs run by benchmarks/idle_backend.py (``--running
jobs``: the service polls, binds, evicts and terminates them as it does real ones, but nothing
runs) or workspace admissions (``--running workspaces``: held GPUs that are not polled). Then
``--clients`` clients each submit a job every ``--interval`` seconds for ``--seconds`` (a steady,
modest pace: latency, not throughput). Every submission wakes the loop, so cycles run back to back
the whole time; each cycle snapshots every workload. The mean and largest cycle times come from
the service's own ``gpupool_cycle_seconds`` metric.

    .venv/bin/python benchmarks/api_throughput.py [--jobs 3000] [--clients 16] [--procs 2] [--proxy] [--json]
    .venv/bin/python benchmarks/api_throughput.py --loaded [--seconds 40] [--clients 4] [--interval 0.2]
                                                  [--workloads 20000] [--running jobs|workspaces]
                                                  [--gpupool '{"cycle_in_process": false}'] [--show-slow]
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))
sys.path.insert(0, str(HERE))
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


def _seed(db_url: str, nodes: int, queues: int, workloads: int, seed: int, kind: str) -> tuple[list[dict], list[dict]]:
    """Issue 13's cluster (cycle_speed.build) as ``c.GPUPool`` nodes and queues, and its workloads
    stored before the service starts (running ones with their allocation), as jobs (``kind``
    "jobs": command jobs the idle backend adopts) or as workspace admissions."""
    from cycle_speed import build
    from sqlalchemy import insert

    from gpupool.hub_ext import store as D

    node_specs, queue_specs, ws = build(nodes, queues, workloads, seed, None)
    racks: dict[str, list] = {}
    for n in node_specs:
        racks.setdefault(n.labels["rack"], []).append(n)
    names, node_entries = {}, []
    for rack, members in racks.items():
        n = members[0]
        node_entries.append({"name": f"node{rack}", "count": len(members), "gpus": n.gpus, "gpu_memory": n.gpu_memory,
                             "gpu_model": n.gpu_model, "cpu": n.cpu, "memory": n.memory, "labels": {"rack": rack}})
        names.update({m.name: f"node{rack}-{k}" for k, m in enumerate(members)})
    queue_entries = [{"name": q.name, "deserved": q.deserved, "over_quota_weight": q.over_quota_weight,
                      **({"parent": q.parent} if q.parent else {}), **({"limit": q.limit} if q.limit else {})}
                     for q in queue_specs]
    queue_entries.append({"name": "bench", "deserved": {"gpu": 0}, "limit": {"gpu": 0}})
    t0 = time.time() - 3600 - len(ws)
    rows = []
    for i, w in enumerate(ws):
        held = bool(w.placements)
        job = kind == "jobs"
        rows.append(dict(
            type=D.JOB if job else D.WORKSPACE, user=w.user, server="" if job else f"s{i}", name=w.id,
            command=["true"] if job else None, handle={"run_id": f"seeded-{i}"} if job and held else None, queue=w.queue, kind=w.kind, gpus=w.gpus,
            gpu_memory=w.gpu_memory, cpu=w.cpu, memory=w.memory, priority=w.priority, preemptible=w.preemptible,
            checkpoint_on_signal=w.checkpoint_on_signal, pods=w.pods, parameters={},
            status=D.RUNNING if held else D.QUEUED, reason="seeded by benchmarks/api_throughput.py --loaded",
            submitted_at=t0 + w.submit_time, started_at=t0 + w.started_at if held else None,
            last_checkpoint_at=t0 + w.last_checkpoint_at if w.last_checkpoint_at is not None else None,
            allocation=[{"pod": p.pod, "node": names[p.node], "gpus": list(p.gpus), "fraction": p.fraction}
                        for p in w.placements] if held else None,
            attempt=1 if held else 0, preemptions=0, restarts=0))
    engine = D.make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(insert(D.Workload.__table__), rows)
    engine.dispose()
    return node_entries, queue_entries


def _cycle_metrics(hub: Hub) -> dict[str, float]:
    """The service's cycle histogram: sums, counts and buckets of gpupool_cycle_seconds and
    gpupool_decide_seconds."""
    out: dict[str, float] = {}
    for line in hub.api("GET", "metrics").text.splitlines():
        if line.startswith(("gpupool_cycle_seconds", "gpupool_decide_seconds")):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _paced_client(url: str, token: str, start: float, interval: float, until: float,
                  out: list[tuple[float, float, int]]) -> None:
    """One client: a job every ``interval`` seconds from ``start`` (monotonic) until ``until``; a
    request is sent on time even when the previous answer was late (it then goes out at once)."""
    u = urlparse(url)
    body = json.dumps(BODY).encode()
    headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    k = 0
    while True:
        due = start + k * interval
        if due >= until:
            break
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        t = time.monotonic()
        conn.request("POST", u.path + "jobs", body, headers)
        r = conn.getresponse()
        r.read()
        out.append((t - start, time.monotonic() - t, r.status))
        k += 1
    conn.close()


def _ms(values: list[float], q: float) -> float:
    return round(1000 * values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))], 1)


def loaded(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp:
        extra = json.loads(args.gpupool)
        db_url = f"sqlite:///{Path(tmp) / 'gpupool.sqlite'}"
        nodes, queues = _seed(db_url, args.nodes, args.queues, args.workloads, args.seed, args.running)
        cfg = {"db_url": db_url, "nodes": nodes, "queues": queues, "cycle_seconds": 1.0,
               "workspace_reconcile_seconds": 0, "preemption_grace": 30.0, "default_queue": "bench", **extra}
        if args.running == "jobs":
            cfg.setdefault("backend", "idle_backend.IdleRunsBackend")  # JupyterHub hands PYTHONPATH on
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
        hub = Hub(tmp, gpupool=cfg, users=["alice"], start_timeout=300)
        with hub:
            token = hub.token("alice")
            assert hub.api("POST", "jobs", token, json=BODY).status_code == 201
            # the first cycles bind the backlog; measure once cycles are what they are from then on
            hub.wait_for(lambda: hub.api("GET", "health").json()["cycles"] >= 3, 300, 0.5,
                         "the service did not run 3 cycles")
            before = _cycle_metrics(hub)
            cycles0 = hub.api("GET", "health").json()["cycles"]
            start = time.monotonic() + 0.5
            until = start + args.seconds
            samples: list[list[tuple[float, float, int]]] = [[] for _ in range(args.clients)]
            threads = [threading.Thread(target=_paced_client, args=(hub.api_url, token, start + i * args.interval /
                                                                    args.clients, args.interval, until, samples[i]))
                       for i in range(args.clients)]
            for t in threads:
                t.start()
            spy = Path(sys.executable).with_name("py-spy")
            spy = str(spy) if spy.exists() else shutil.which("py-spy")
            if args.profile and not spy:
                print("--profile: py-spy is not installed (pip install py-spy); running without a profile")
            elif args.profile:
                subprocess.run([spy, "record", "-p", str(hub.service_pid()), "-d", str(int(args.seconds)),
                                "-o", args.profile, "-f", "speedscope", "--nonblocking"], check=False)
            for t in threads:
                t.join()
            after = _cycle_metrics(hub)
            cycles = hub.api("GET", "health").json()["cycles"] - cycles0
    lat = sorted(x[1] for s in samples for x in s)
    if args.show_slow:
        print("submissions over 50 ms (seconds into the run, ms):",
              sorted((round(x[0], 2), round(1000 * x[1])) for s in samples for x in s if x[1] > 0.05))
    errors = sum(1 for s in samples for x in s if x[2] != 201)

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    n_cycles = delta("gpupool_cycle_seconds_count")
    buckets = sorted((float(k.split('le="')[1].split('"')[0]), delta(k)) for k in after
                     if k.startswith("gpupool_cycle_seconds_bucket") and "+Inf" not in k)
    longest = next((le for le, n in buckets if n >= n_cycles), float("inf"))
    report = {
        "mode": "loaded", "running": args.running, "nodes": args.nodes, "workloads": args.workloads, "clients": args.clients,
        "interval_s": args.interval, "seconds": args.seconds, "submissions": len(lat), "errors": errors,
        "latency_ms": {"p50": _ms(lat, 0.5), "p95": _ms(lat, 0.95), "max": round(1000 * lat[-1], 1)},
        "over_50_ms": sum(1 for x in lat if x > 0.05),
        "goal_p95_ms": 50, "cycles": cycles,
        "cycle_ms": {"mean": round(1000 * delta("gpupool_cycle_seconds_sum") / max(1, n_cycles), 1),
                     "max_at_most": longest * 1000,
                     "decide_mean": round(1000 * delta("gpupool_decide_seconds_sum") / max(1, n_cycles), 1)},
        "settings": extra,
    }
    if args.json:
        print(json.dumps(report))
    else:
        lm, cm = report["latency_ms"], report["cycle_ms"]
        print(f"api_throughput --loaded: {len(lat)} submissions ({args.clients} clients, one every "
              f"{args.interval:g} s each) during {cycles} scheduling cycles of {args.workloads} {args.running} on "
              f"{args.nodes} nodes; settings {extra or 'default'}")
        print(f"  latency p50 {lm['p50']} ms, p95 {lm['p95']} ms (goal <= 50 ms), max {lm['max']} ms; "
              f"{report['over_50_ms']} over 50 ms; {errors} errors")
        print(f"  cycle mean {cm['mean']} ms (Scheduler.schedule {cm['decide_mean']} ms), longest <= "
              f"{cm['max_at_most']:g} ms")
    return 0 if not errors else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--clients", type=int, default=None, help="concurrent connections in all (default 16; "
                   "--loaded: 4 paced clients)")
    p.add_argument("--procs", type=int, default=2, help="client processes")
    p.add_argument("--proxy", action="store_true", help="through configurable-http-proxy")
    p.add_argument("--json", action="store_true")
    p.add_argument("--loaded", action="store_true", help="latency while long scheduling cycles run")
    p.add_argument("--seconds", type=float, default=40.0, help="--loaded: how long the clients submit")
    p.add_argument("--interval", type=float, default=0.2, help="--loaded: seconds between one client's jobs")
    p.add_argument("--nodes", type=int, default=1000, help="--loaded: nodes of 8 GPUs")
    p.add_argument("--queues", type=int, default=200, help="--loaded: queues")
    p.add_argument("--workloads", type=int, default=20000, help="--loaded: workloads seeded")
    p.add_argument("--seed", type=int, default=0, help="--loaded: seed of the seeded cluster")
    p.add_argument("--running", choices=["jobs", "workspaces"], default="jobs",
                   help="--loaded: what the seeded workloads are (jobs run through benchmarks/idle_backend.py)")
    p.add_argument("--gpupool", default="{}", help="--loaded: extra c.GPUPool settings (JSON)")
    p.add_argument("--show-slow", action="store_true", help="--loaded: list the submissions over 50 ms")
    p.add_argument("--profile", default="", help="--loaded: py-spy speedscope profile of the service to this file")
    args = p.parse_args(argv)
    if args.loaded:
        args.clients = args.clients or 4
        return loaded(args)
    args.clients = args.clients or 16
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
