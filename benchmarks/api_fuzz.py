"""A long schemathesis run against the real service behind a real hub (goal: no 5xx and every answer
as the OpenAPI document says, over 10,000 generated requests).

The same generator and checks as tests/hub/test_api_fuzz.py (which runs ~1,200 cases in `make test`):
requests generated from ``GET api/v1/openapi.json``, valid and invalid in equal parts, with the
tokens of alice, bob and an admin in turn. Prints the answers by status and the rate.

    .venv/bin/python benchmarks/api_fuzz.py [--cases 10000] [--seed 9] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from api_fuzzing import TRACEBACK, fuzz_hub, run_schemathesis  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=10_000, help="generated requests (default 10000)")
    p.add_argument("--seed", type=int, default=9, help="hypothesis seed (default 9)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpupool-fuzz-") as tmp, fuzz_hub(Path(tmp)) as hub:
        tokens = {u: hub.token(u) for u in ("alice", "bob")} | {"admin": hub.admin_token}
        t0 = time.perf_counter()
        failure = None
        counts: dict[str, int] = {}
        try:
            counts = run_schemathesis(hub, tokens, args.cases, seed=args.seed)
        except Exception as e:  # schemathesis' failure report names the request that failed
            failure = str(e)
        seconds = time.perf_counter() - t0
        log = hub.service_log()
        tracebacks = log.count(TRACEBACK)
        if tracebacks:
            print(log[log.index(TRACEBACK) - 300:][:3000], file=sys.stderr)
    total = sum(counts.values())
    result = {"cases": total, "seconds": round(seconds, 1),
              "per_second": round(total / seconds, 1) if seconds else 0, "by_status": dict(sorted(counts.items())),
              "server_errors": sum(n for c, n in counts.items() if c[0] == "5"),
              "service_tracebacks": tracebacks, "failure": failure}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"api fuzz: {total} generated requests in {seconds:.0f} s ({result['per_second']}/s)")
        print("  answers by status: " + ", ".join(f"{c}: {n}" for c, n in result["by_status"].items()))
        print(f"  5xx answers: {result['server_errors']}; tracebacks in the service log: {tracebacks}")
        print("  result: " + ("FAILED\n" + failure if failure else "every answer as documented, no 5xx"))
    ok = failure is None and not result["server_errors"] and not tracebacks
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
