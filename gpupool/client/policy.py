"""``gpupool policy [QUEUE]``: the workload policy a queue's workloads get, per kind: what a request
that leaves a field out gets (defaults), the most it may ask for (limits), which kinds the queue
takes, and the queue or department that sets each (``GET policies/effective``, docs/admin.md)."""
from __future__ import annotations

from ..contract import format_policy_value
from .cli import _client, _common, _guard, _print_json, table


def rows_of(policy: dict) -> list[tuple[str, str, str, str]]:
    """(kind, rule, value, set by) of one queue's effective policy."""
    rows = []
    for kind, p in policy["kinds"].items():
        if not p["allowed"]:
            rows.append((kind, "not taken", "-", p.get("refused_by") or "-"))
            continue
        items = [("default", n, v) for n, v in p["defaults"].items()] + [("limit", n, v) for n, v in p["limits"].items()]
        if not items:
            rows.append((kind, "no defaults or limits", "-", "-"))
        rows += [(kind, f"{part} {name}", format_policy_value(name, v["value"]), v["set_by"]) for part, name, v in items]
    return rows


def cmd_policy(args) -> int:
    doc = _client(args).get("policies/effective", params={"queue": args.queue} if args.queue else None)
    if args.json:
        _print_json(doc["policies"][0] if args.queue else doc)
        return 0
    for i, policy in enumerate(doc["policies"]):
        if i:
            print()
        print(f"queue {policy['queue']}")
        print(table(["KIND", "RULE", "VALUE", "SET BY"], rows_of(policy)))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("policy", help="the workload policy of a queue: defaults, limits and where each is set",
                              description=__doc__.split("\n\n")[0], parents=[_common()])
    p.add_argument("queue", nargs="?", metavar="QUEUE", help="a leaf queue (default: every queue)")
    p.set_defaults(func=_guard(cmd_policy))
