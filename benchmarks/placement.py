"""Placement quality on the Alibaba GPU trace (trace fill mode), beside the FGD paper's numbers.

    python benchmarks/placement.py [--trace default|all|NAME ...] [--policy default fgd ...]
                                   [--seeds 42-51] [--fill 1.3] [--jobs 1] [--write docs/placement.md]

For every trace and policy: the mean GPU allocation % at 100% and 130% arrived demand over the
seeds, the paper's number for the matching policy (its simulator, mean of seeds 42..51; ``default``
is compared with FGD), and wall seconds per seed. ``--write FILE`` replaces the rows it measured in
the results table of FILE (between ``<!-- placement-results:begin -->`` and ``...:end -->``).
"""
from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpupool.scheduler.placement import POLICIES  # noqa: E402
from gpupool.sim.tracefill import run_trace_fill  # noqa: E402

TRACES_DIR = Path(os.environ.get("GPUPOOL_TRACES", ROOT.parent / "shared" / "traces" / "alibaba-gpu-2023"))
PAPER_TRACES = ("default", "cpu050", "cpu100", "cpu200", "cpu250", "gpushare40", "gpushare60", "gpushare80",
                "gpushare100", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33", "multigpu20", "multigpu30",
                "multigpu40", "multigpu50")
PAPER_POLICY = {"random": "01-Random", "bestfit": "05-BestFit", "fgd": "06-FGD", "default": "06-FGD"}
BEGIN, END = "<!-- placement-results:begin -->", "<!-- placement-results:end -->"
HEADER = ("| trace | policy | alloc % @100 | paper @100 | alloc % @130 | paper @130 | seeds | s/seed |\n"
          "|---|---|---:|---:|---:|---:|---|---:|")


def paper_numbers(traces_dir: Path) -> dict:
    out = {}
    path = traces_dir / "fgd-expected-results" / "summary_alloc_at_100_130_derived.csv"
    if path.exists():
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                out[(row["workload"], row["policy"], int(row["arrived_pct"]))] = float(row["gpu_alloc_pct_mean"])
    return out


def parse_seeds(text: str) -> list[int]:
    seeds = []
    for part in text.split(","):
        part = part.strip()
        if re.fullmatch(r"\d+-\d+", part):
            a, b = map(int, part.split("-"))
            seeds.extend(range(a, b + 1))
        elif part.isdigit():
            seeds.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"--seeds: bad item {part!r} (use e.g. 42-51 or 42,43)")
    return seeds


def _one(args):
    trace, policy, seed, fill, nodes = args
    r = run_trace_fill(nodes, TRACES_DIR / f"openb_pod_list_{trace}.csv", fill=fill, seed=seed, policy=policy)
    m = r["metrics"]
    return trace, policy, seed, m["alloc_pct_at_100"], m["alloc_pct_at_130"], m["seconds"]


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _fmt(v):
    return "n/a" if v is None else f"{v:.2f}"


def write_table(path: Path, rows: dict) -> None:
    """Merge ``rows`` {(trace, policy): line} into the results table of ``path``."""
    text = path.read_text() if path.exists() else ""
    if BEGIN not in text or END not in text:
        text = text.rstrip() + f"\n\n{BEGIN}\n{HEADER}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    existing = {}
    for line in body.strip().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0] not in ("trace", "---") and not cells[0].startswith("-"):
            existing[(cells[0], cells[1])] = line.strip()
    existing.update(rows)
    order = {t: i for i, t in enumerate(PAPER_TRACES)}
    pol_order = {p: i for i, p in enumerate(POLICIES)}
    keys = sorted(existing, key=lambda k: (order.get(k[0], 99), k[0], pol_order.get(k[1], 99), k[1]))
    table = "\n".join([HEADER] + [existing[k] for k in keys])
    path.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def latency(policies, nodes: int = 1000, gpus: int = 8, pods: int = 2000) -> None:
    """Microseconds per choose() on a synthetic cluster, half filled: the first call on a fresh
    state (cold: builds the per-node tables) and the mean over a stream of placements (warm)."""
    import numpy as np

    from gpupool.scheduler.cluster import ClusterState, PodRequest
    from gpupool.scheduler.model import NodeSpec

    gi = 2**30
    rng = np.random.default_rng(0)
    specs = [NodeSpec(f"n{i:04d}", gpus, gpu_memory=80 * gi, gpu_model="H100" if i % 3 else "A100",
                      cpu=128, memory=1024 * gi) for i in range(nodes)]
    shapes = [(PodRequest(1, 1000, 0, 12000, 64 * gi), 0.4), (PodRequest(1, 500, 0, 4000, 16 * gi), 0.2),
              (PodRequest(1, 250, 0, 2000, 8 * gi), 0.15), (PodRequest(2, 1000, 0, 24000, 128 * gi), 0.1),
              (PodRequest(8, 1000, 0, 96000, 512 * gi), 0.05), (PodRequest(0, 0, 0, 8000, 32 * gi), 0.1)]
    reqs = [shapes[i][0] for i in rng.choice(len(shapes), size=pods, p=[w for _, w in shapes])]
    print(f"choose() latency, {nodes} nodes x {gpus} GPUs, {pods} placements:")
    for name in policies:
        state = ClusterState(specs)
        pol = __import__("gpupool.scheduler.placement", fromlist=["make_policy"]).make_policy(name, shapes=shapes)
        for r in reqs[: pods // 2]:  # half fill
            c = pol.choose(state, r)
            if c:
                state.take(c[0], c[1], c[2], r.cpu_milli, r.memory)
        fresh = state.copy()
        fresh_pol = __import__("gpupool.scheduler.placement", fromlist=["make_policy"]).make_policy(name, shapes=shapes)
        t = time.perf_counter()
        fresh_pol.choose(fresh, reqs[0])
        cold = time.perf_counter() - t
        t = time.perf_counter()
        n = 0
        for r in reqs[pods // 2:]:
            c = pol.choose(state, r)
            n += 1
            if c:
                state.take(c[0], c[1], c[2], r.cpu_milli, r.memory)
        warm = (time.perf_counter() - t) / n
        print(f"  {name:<9} cold {cold * 1e6:8.0f} us   warm {warm * 1e6:6.0f} us/choose")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", nargs="+", default=["default"],
                    help="trace names (openb_pod_list_NAME.csv), or 'all' for the paper's 17")
    ap.add_argument("--policy", nargs="+", default=["default", "fgd", "bestfit", "random"], choices=POLICIES)
    ap.add_argument("--seeds", type=parse_seeds, default=list(range(42, 52)), help="e.g. 42-51 (default) or 42,43")
    ap.add_argument("--fill", type=float, default=1.3)
    ap.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    ap.add_argument("--nodes", default=str(TRACES_DIR / "openb_node_list_gpu_node.csv"))
    ap.add_argument("--write", metavar="FILE", help="update the results table in FILE (e.g. docs/placement.md)")
    ap.add_argument("--latency", action="store_true", help="only measure choose() latency on 1000 nodes x 8 GPUs")
    args = ap.parse_args(argv)
    if args.latency:
        latency(args.policy)
        return 0
    traces = list(PAPER_TRACES) if args.trace == ["all"] else args.trace
    for t in traces:
        if not (TRACES_DIR / f"openb_pod_list_{t}.csv").exists():
            print(f"error: no trace {t!r} in {TRACES_DIR}", file=sys.stderr)
            return 2
    paper = paper_numbers(TRACES_DIR)
    jobs = [(t, p, s, args.fill, args.nodes) for t in traces for p in args.policy for s in args.seeds]
    results: dict = {}
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as ex:
            done = list(ex.map(_one, jobs))
    else:
        done = map(_one, jobs)
    rows = {}
    print(f"{'trace':<12} {'policy':<8} {'@100':>7} {'paper':>7} {'@130':>7} {'paper':>7} {'s/seed':>7}")
    for trace, policy, seed, a100, a130, sec in done:
        results.setdefault((trace, policy), []).append((a100, a130, sec))
        if len(results[(trace, policy)]) == len(args.seeds):
            vals = results[(trace, policy)]
            m100, m130, msec = _mean([v[0] for v in vals]), _mean([v[1] for v in vals]), _mean([v[2] for v in vals])
            key = f"openb_pod_list_{trace}"
            p100 = paper.get((key, PAPER_POLICY.get(policy, ""), 100))
            p130 = paper.get((key, PAPER_POLICY.get(policy, ""), 130))
            print(f"{trace:<12} {policy:<8} {_fmt(m100):>7} {_fmt(p100):>7} {_fmt(m130):>7} {_fmt(p130):>7} "
                  f"{msec:>7.2f}", flush=True)
            seeds = f"{args.seeds[0]}-{args.seeds[-1]}" if args.seeds == list(range(args.seeds[0], args.seeds[-1] + 1)) \
                else ",".join(map(str, args.seeds))
            paper_label = f"{_fmt(p100)} ({'FGD' if policy == 'default' else policy})" if p100 is not None else "n/a"
            rows[(trace, policy)] = (f"| {trace} | {policy} | {_fmt(m100)} | {paper_label} | {_fmt(m130)} | "
                                     f"{_fmt(p130)} | {seeds} | {msec:.2f} |")
    print(f"total {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if args.write:
        write_table(Path(args.write), rows)
        print(f"updated {args.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
