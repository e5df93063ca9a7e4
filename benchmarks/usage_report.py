"""How long a consumption report takes (hub_ext/domain/usage.py) on a ledger and utilisation history of a
given size: the work behind ``GET usage`` and ``gpupool report``.

Builds a SQLite database in a temporary directory: ``--records`` allocation intervals (1 to 8
GPUs, 10 minutes to 12 hours) of 50 users in 10 queues over ``--days`` days on ``--gpus`` GPUs, and
downsampled utilisation rows (5 minutes) for every GPU over those days; then times reports over
the whole range by user, queue, department and day.

    .venv/bin/python benchmarks/usage_report.py [--records 20000] [--gpus 32] [--days 30] [--json]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.store import ledger as L
    from gpupool.hub_ext.store import samples as S
    from gpupool.hub_ext.domain.usage import report

    rnd = random.Random(1)
    t0 = 1_790_000_000.0
    span = args.days * 86400.0
    nodes = [(f"node{n}", 8) for n in range((args.gpus + 7) // 8)]
    with tempfile.TemporaryDirectory() as tmp:
        engine = D.make_engine(f"sqlite:///{Path(tmp) / 'usage.sqlite'}")
        records, samples = [], []
        for i in range(args.records):
            node, per = rnd.choice(nodes)
            n = rnd.choice((1, 1, 1, 2, 4, 8))
            start = t0 + rnd.random() * span
            q = rnd.randrange(10)
            records.append(dict(workload_id=i, workload=f"j-{i:06d}", type="job", user=f"user{rnd.randrange(50)}",
                                queue=f"team{q}", queue_path=f"dept{q % 3}/team{q}", department=f"dept{q % 3}",
                                kind="train", attempt=1, pod=0, node=node, gpu_indices=rnd.sample(range(per), n),
                                gpu_model="A100", fraction=1.0, gpus=float(n), start=start,
                                end=min(t0 + span, start + rnd.uniform(600, 43200)), end_reason="succeeded"))
        for node, per in nodes:
            for g in range(per):
                for k in range(int(span // 300)):
                    samples.append(dict(node=node, gpu=g, t=t0 + k * 300, seconds=300.0,
                                        utilization=rnd.uniform(0, 100), memory_used=1e9, resolution=300))
        t = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(L.TABLE.insert(), records)
            conn.execute(S.TABLE.insert(), samples)
        load_s = time.perf_counter() - t
        sessions = D.make_sessionmaker(engine)
        out = {"records": len(records), "samples": len(samples), "load_seconds": round(load_s, 2), "reports": {}}
        for by in ("user", "queue", "department", "day"):
            t = time.perf_counter()
            with sessions() as s:
                doc = report(s, t0, t0 + span, by, t0 + span)
            out["reports"][by] = {"seconds": round(time.perf_counter() - t, 3), "rows": len(doc["rows"]),
                                  "total_gpu_hours": round(doc["total"]["allocated_gpu_hours"], 1)}
        engine.dispose()
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['records']} ledger records, {out['samples']} utilisation rows (loaded in {out['load_seconds']} s)")
        for by, r in out["reports"].items():
            print(f"  report by {by:<10} {r['seconds']:>7.3f} s  ({r['rows']} rows, {r['total_gpu_hours']} GPU-hours)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
