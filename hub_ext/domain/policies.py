"""Workload policies: what a queue's workloads get by default and the most they may ask for, per
kind (the contract's kind names), set on any queue or department of ``c.GPUPool.queues``::

    {"name": "research", "policy": {"*": {"limits": {"kinds": ["train", "interactive"]}},
                                    "interactive": {"limits": {"gpus": 1, "run_time": "8h"}}}},
    {"name": "vision", "parent": "research",
     "policy": {"train": {"defaults": {"gpus": 1}, "limits": {"gpus": 2}}}}

* ``defaults`` fill what a request leaves out: ``gpus`` or ``gpu_memory``, ``cpu``, ``memory``,
  ``pods`` (jobs), ``preemptible``, ``run_time`` (the maximum run time a workload of the kind gets).
* ``limits``: ``gpus`` (the most GPUs per workload: every pod's together), ``gpus_per_pod``, ``pods``,
  ``run_time`` (the longest run: past it a job is requeued, a workspace suspended), ``idle_time``
  (the longest idle time: a workspace is suspended, a job requeued), ``pools`` (the node pools it
  may run in: a request naming another is refused, one naming none runs only there), ``images``
  (the images a workspace may run, names or shell patterns such as ``quay.io/jupyter/*``: the
  spawner sends its image) and, under ``"*"`` only, ``kinds`` (the kinds the queue takes). A
  GPU-memory share counts as one GPU against the limits.
* ``"*"`` is every kind of the queue; a kind's own entry at the same level adds to it (a default
  of the kind's entry wins, the tighter of two limits holds).
* A child may only tighten what its parents set: a higher number, a longer time, or a kind, pool
  or image its parent does not allow is refused at start (``gpupool hub --check``) naming the queue and field.
  Defaults are inherited and may be changed, but must stay within the effective limits.

The effective policy of a leaf queue (:func:`resolve`) says for every value where it is set
(``department research``), so that a refusal names the rule and its place: ``gpus: queue vision
allows at most 2 GPUs per workspace (policy of department research)``. The run and idle time
limits are not a second mechanism: :func:`merge_time_rules` tightens the maximum run times and idle
rules (domain/idle_rules.py) with them, which runtime/idle.py acts on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from ...contract import INTERACTIVE, KINDS, format_bytes, format_gpus, format_policy_value
from ...scheduler.fairshare import QueueTree
from ...scheduler.units import parse_bytes
from .errors import APIError
from .gpus import check_gpus
from .idle_rules import REQUEUE, SUSPEND, Rule, RuleError, human, parse_duration

ALL = "*"
DEFAULT_FIELDS = ("gpus", "gpu_memory", "cpu", "memory", "pods", "preemptible", "run_time")
LIMIT_FIELDS = ("gpus", "gpus_per_pod", "pods", "run_time", "idle_time", "kinds", "pools", "images")
SETS = ("kinds", "pools", "images")  # limits that are sets: a child's must be within its parent's
PATTERNS = ("images",)  # sets of names or shell patterns (``quay.io/jupyter/*``)
TIMES = ("run_time", "idle_time")


class PolicyError(RuleError):
    """A bad ``policy`` entry; the message names the queue and the field."""


@dataclass(frozen=True)
class Setting:
    value: Any
    level: str  # "department research", "queue vision"

    @property
    def where(self) -> str:
        return f"policy of {self.level}"


@dataclass
class KindPolicy:
    """The effective policy of one kind in one leaf queue: every value with where it is set."""

    defaults: dict[str, Setting] = field(default_factory=dict)
    limits: dict[str, Setting] = field(default_factory=dict)
    allowed: Setting | None = None  # None: every kind; else the kinds limit that refuses it (value False)

    def default(self, name: str) -> Any:
        s = self.defaults.get(name)
        return None if s is None else s.value

    def limit(self, name: str) -> Any:
        s = self.limits.get(name)
        return None if s is None else s.value


# ------------------------------------------------------------------------------------- parsing
def _number(value: Any, where: str, *, whole: bool = False, least: float = 0) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise PolicyError(f"{where}: must be a number")
    if value < least:
        raise PolicyError(f"{where}: must be >= {least:g}")
    if whole:
        if value != int(value):
            raise PolicyError(f"{where}: must be a whole number")
        return int(value)
    return float(value)


def _bytes(value: Any, where: str) -> int:
    try:
        n = parse_bytes(value)
    except (ValueError, TypeError) as e:
        raise PolicyError(f"{where}: {e}") from None
    if n <= 0:
        raise PolicyError(f"{where}: must be more than 0")
    return n


def _default(name: str, value: Any, where: str) -> Any:
    if name == "gpus":
        try:
            return check_gpus(value)
        except ValueError as e:
            raise PolicyError(f"{where}: {e}") from None
    if name in ("gpu_memory", "memory"):
        return _bytes(value, where)
    if name == "cpu":
        return _number(value, where)
    if name == "pods":
        return _number(value, where, whole=True, least=1)
    if name == "preemptible":
        if not isinstance(value, bool):
            raise PolicyError(f"{where}: must be true or false")
        return value
    return parse_duration(value, where)  # run_time


def _limit(name: str, value: Any, where: str) -> Any:
    if name in ("gpus", "gpus_per_pod"):
        return _number(value, where)
    if name == "pods":
        return _number(value, where, whole=True, least=1)
    if name in TIMES:
        return parse_duration(value, where)
    if name in ("pools", "images"):
        what = "node pool names" if name == "pools" else "image names or patterns such as 'quay.io/jupyter/*'"
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
            raise PolicyError(f"{where}: must be a list of {what}")
        return frozenset(v.strip() for v in value)
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):  # kinds
        raise PolicyError(f"{where}: must be a list of kinds ({', '.join(KINDS)})")
    unknown = [k for k in value if k not in KINDS]
    if unknown:
        raise PolicyError(f"{where}: unknown kind {unknown[0]!r} (kinds: {', '.join(KINDS)})")
    return frozenset(value)


def parse_policy(raw: Any, where: str) -> dict[str, dict[str, dict[str, Any]]]:
    """One queue's ``policy`` entry as {kind or "*": {"defaults": {...}, "limits": {...}}}."""
    if not isinstance(raw, dict):
        raise PolicyError(f"{where}: must map a kind ({', '.join(KINDS)}) or '*' to "
                          "{'defaults': {...}, 'limits': {...}}")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for kind, entry in raw.items():
        w = f"{where}.{kind}"
        if kind != ALL and kind not in KINDS:
            raise PolicyError(f"{w}: unknown kind (use {', '.join(KINDS)} or '*' for every kind)")
        if not isinstance(entry, dict) or set(entry) - {"defaults", "limits"}:
            raise PolicyError(f"{w}: must be {{'defaults': {{...}}, 'limits': {{...}}}}")
        parsed: dict[str, dict[str, Any]] = {"defaults": {}, "limits": {}}
        for part, names, parse in (("defaults", DEFAULT_FIELDS, _default), ("limits", LIMIT_FIELDS, _limit)):
            values = entry.get(part) or {}
            if not isinstance(values, dict):
                raise PolicyError(f"{w}.{part}: must be an object")
            for name, value in values.items():
                if name not in names:
                    raise PolicyError(f"{w}.{part}.{name}: unknown field (use {', '.join(names)})")
                if name == "kinds" and kind != ALL:
                    raise PolicyError(f"{w}.limits.kinds: set the kinds a queue takes under '*'")
                parsed[part][name] = parse(name, value, f"{w}.{part}.{name}")
        if "gpus" in parsed["defaults"] and "gpu_memory" in parsed["defaults"]:
            raise PolicyError(f"{w}.defaults.gpu_memory: give either gpus or gpu_memory, not both")
        out[kind] = parsed
    return out


# ---------------------------------------------------------------------------------- resolving
def matches(value: str, patterns: Any) -> bool:
    """Whether ``value`` (an image, or a child's pattern) is one of ``patterns`` or matches one."""
    return any(value == p or fnmatchcase(value, p) for p in patterns)


def _tighter(name: str, a: Any, b: Any) -> Any:
    if name in PATTERNS:  # what both lists allow: each one's entries that the other admits
        return frozenset({x for x in a if matches(x, b)} | {x for x in b if matches(x, a)})
    return a & b if name in SETS else min(a, b)


def _looser(name: str, child: Any, parent: Any) -> bool:
    if name in PATTERNS:
        return not all(matches(x, parent) for x in child)
    return not child <= parent  # numbers: more; sets: not a subset


def _words(name: str, value: Any) -> str:
    return format_policy_value(name, value) or "none"


def level_name(tree: QueueTree, queue: str) -> str:
    return f"{'queue' if tree.is_leaf(queue) else 'department'} {queue}"


def resolve(raw_queues: list[dict], queues: list[Any]) -> tuple[dict[str, dict[str, KindPolicy]], list[str]]:
    """The effective policy of every leaf queue and kind, and one error per bad or loosening entry
    (``c.GPUPool.queues[i] (name).policy...``)."""
    errors: list[str] = []
    own: dict[str, dict] = {}
    where_of: dict[str, str] = {}
    for i, entry in enumerate(raw_queues):
        name = entry.get("name")
        where_of[name] = f"c.GPUPool.queues[{i}] ({name}).policy"
        if entry.get("policy") is None:
            continue
        try:
            own[name] = parse_policy(entry["policy"], where_of[name])
        except RuleError as e:
            errors.append(str(e))
    tree = QueueTree(queues)
    out: dict[str, dict[str, KindPolicy]] = {}
    reported: set[str] = set()
    for q in queues:
        if not tree.is_leaf(q.name):
            continue
        out[q.name] = {}
        for kind in KINDS:
            eff = KindPolicy()
            for level in tree.path(q.name):
                entries = own.get(level, {})
                here = level_name(tree, level)
                level_limits: dict[str, Setting] = {}
                for key in (ALL, kind):
                    for name, value in entries.get(key, {}).get("limits", {}).items():
                        mine = level_limits.get(name)
                        level_limits[name] = Setting(value if mine is None else _tighter(name, mine.value, value), here)
                for name, setting in level_limits.items():
                    parent = eff.limits.get(name)
                    if parent is not None and _looser(name, setting.value, parent.value):
                        msg = (f"{where_of[level]}.{kind if name != 'kinds' else ALL}.limits.{name}: "
                               f"{_words(name, setting.value)} is looser than the {_words(name, parent.value)} "
                               f"of the {parent.where} (a queue may only tighten its parent's policy)")
                        if msg not in reported:
                            reported.add(msg)
                            errors.append(msg)
                        continue
                    eff.limits[name] = setting
                for key in (ALL, kind):
                    for name, value in entries.get(key, {}).get("defaults", {}).items():
                        if name in ("gpus", "gpu_memory"):  # the one replaces the other
                            eff.defaults.pop("gpu_memory" if name == "gpus" else "gpus", None)
                        eff.defaults[name] = Setting(value, here)
            for name in ("pools", "images"):
                lim = eff.limits.get(name)
                if lim is not None and not lim.value:
                    msg = (f"{where_of[lim.level.split(' ', 1)[1]]}.{kind}.limits.{name}: queue {q.name} is left no "
                           f"{name[:-1]} for {_kind_words(kind)} (the lists of '*' and {kind} have none in common)")
                    if msg not in reported:
                        reported.add(msg)
                        errors.append(msg)
            kinds = eff.limits.pop("kinds", None)
            if kinds is not None and kind not in kinds.value:
                eff.allowed = Setting(False, kinds.level)
            for msg in _defaults_beyond_limits(q.name, kind, eff, where_of):
                if msg not in reported:
                    reported.add(msg)
                    errors.append(msg)
            out[q.name][kind] = eff
    return out, errors


def unknown_pools(raw_queues: list[dict], pools: Any) -> list[str]:
    """One error per pool a policy names that no declared node is in (a typo would refuse every
    request of the queue)."""
    out = []
    for i, entry in enumerate(raw_queues):
        policy = entry.get("policy")
        for kind, parts in (policy.items() if isinstance(policy, dict) else ()):
            named = ((parts or {}).get("limits") or {}).get("pools") if isinstance(parts, dict) else None
            for p in named if isinstance(named, list) else ():
                if isinstance(p, str) and p.strip() not in pools:
                    out.append(f"c.GPUPool.queues[{i}] ({entry.get('name')}).policy.{kind}.limits.pools: no node is "
                               f"in pool {p!r} (the pools: {', '.join(sorted(pools))})")
    return out


def _defaults_beyond_limits(queue: str, kind: str, eff: KindPolicy, where_of: dict[str, str]) -> list[str]:
    """A default the effective limits refuse: every request that leaves the field out would be refused."""
    checks = {"gpus": ("gpus_per_pod", "gpus"), "pods": ("pods",), "run_time": ("run_time",)}
    out = []
    for name, limits in checks.items():
        d = eff.defaults.get(name)
        if d is None:
            continue
        for lim in limits:
            limit = eff.limits.get(lim)
            if limit is not None and d.value > limit.value:
                out.append(f"{where_of[d.level.split(' ', 1)[1]]}.{kind}.defaults.{name}: the default "
                           f"{_words(name, d.value)} is more than queue {queue} allows ({lim} "
                           f"{_words(lim, limit.value)}, {limit.where})")
    return out


def merge_time_rules(policies: dict[str, dict[str, KindPolicy]], max_runtime: dict, idle_rules: dict) -> None:
    """Tighten the maximum run times and the idle rules (domain/idle_rules.py, ``(queue, class) ->
    Rule``) with the policies' ``run_time`` (the smaller of its default and limit) and
    ``idle_time``: a workspace is then suspended, a job requeued, by runtime/idle.py."""
    for queue, kinds in policies.items():
        for kind, eff in kinds.items():
            classes = (INTERACTIVE, f"{INTERACTIVE}-preemptible") if kind == INTERACTIVE else (kind,)
            action = SUSPEND if kind == INTERACTIVE else REQUEUE
            run = [s for s in (eff.defaults.get("run_time"), eff.limits.get("run_time")) if s is not None]
            for rules, setting, noun in ((max_runtime, min(run, key=lambda s: s.value) if run else None,
                                          "maximum run time"),
                                         (idle_rules, eff.limits.get("idle_time"), "longest idle time")):
                if setting is None:
                    continue
                for cls in classes:
                    current = rules.get((queue, cls))
                    if current is None or setting.value < current.after:
                        rules[(queue, cls)] = Rule(setting.value, action,
                                                   f"the {noun} of the {setting.where} for {_kind_words(kind)}")


# ---------------------------------------------------------------------------------- applying
def _kind_words(kind: str, one: bool = False) -> str:
    if kind == INTERACTIVE:
        return "workspace" if one else "workspaces"
    return f"{kind} job" if one else f"{kind} jobs"


def fill(eff: KindPolicy | None, given: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The defaults of ``eff`` for the ``fields`` a request has and left out (``given``: the
    request's values, None when left out); GPUs are filled only when neither gpus nor gpu_memory is given."""
    if eff is None:
        return {}
    out: dict[str, Any] = {}
    for name, setting in eff.defaults.items():
        if name not in fields or given.get(name) is not None:
            continue
        if name in ("gpus", "gpu_memory") and (given.get("gpus") is not None or given.get("gpu_memory") is not None):
            continue
        out[name] = setting.value
    return out


def check(eff: KindPolicy | None, queue: str, kind: str, w: Any) -> None:
    """Refuse (400 naming the field, the rule and where it is set) a request beyond the limits:
    ``w`` is its scheduler ``Workload`` (gpus per pod, gpu_memory, pods)."""
    if eff is None:
        return
    what = _kind_words(kind, one=True)
    if eff.allowed is not None:
        raise APIError(400, f"kind: queue {queue} does not take {_kind_words(kind)} ({eff.allowed.where})", "kind")
    per_pod = 1.0 if w.gpu_memory else float(w.gpus)
    field_ = "gpu_memory" if w.gpu_memory else "gpus"
    share = f" ({format_bytes(w.gpu_memory)} of GPU memory counts as one GPU)" if w.gpu_memory else ""
    pods = int(getattr(w, "pods", 1) or 1)
    lim = eff.limits.get("pods")
    if lim is not None and pods > lim.value:
        raise APIError(400, f"pods: queue {queue} allows at most {lim.value} pods per {what} ({lim.where})", "pods")
    lim = eff.limits.get("gpus_per_pod")
    if lim is not None and per_pod > lim.value:
        raise APIError(400, f"{field_}: queue {queue} allows at most {format_gpus(lim.value)} per pod of a "
                            f"{what}{share} ({lim.where})", field_)
    lim = eff.limits.get("gpus")
    if lim is not None and per_pod * pods > lim.value:
        asked = f" (asked: {pods} pods x {format_gpus(per_pod)})" if pods > 1 else share
        raise APIError(400, f"{field_}: queue {queue} allows at most {format_gpus(lim.value)} per {what}{asked} "
                            f"({lim.where})", field_)


def check_pools(eff: KindPolicy | None, queue: str, kind: str, asked: Any) -> None:
    """Refuse (400 naming ``pools``, the rule and where it is set) a request naming a node pool its
    queue's policy does not allow for ``kind``."""
    lim = None if eff is None else eff.limits.get("pools")
    if lim is None:
        return
    for p in asked or ():
        if p not in lim.value:
            raise APIError(400, f"pools: queue {queue} may not use pool {p!r} for {_kind_words(kind)} (allowed: "
                                f"{_words('pools', lim.value)}; {lim.where})", "pools")


def allowed_pools(eff: KindPolicy | None) -> Any:
    """The node pools a policy allows (a frozenset), or None: every pool."""
    lim = None if eff is None else eff.limits.get("pools")
    return None if lim is None else lim.value


def check_image(eff: KindPolicy | None, queue: str, kind: str, image: str | None) -> None:
    """Refuse (400 naming ``image``) an image the policy's ``images`` limit does not allow. A
    request that names no image (the local backend has none) passes."""
    lim = None if eff is None else eff.limits.get("images")
    if lim is None or not image or matches(image, lim.value):
        return
    raise APIError(400, f"image: queue {queue} does not allow image {image!r} for {_kind_words(kind)} (allowed: "
                        f"{_words('images', lim.value)}; {lim.where})", "image")


def view(eff: KindPolicy) -> dict[str, Any]:
    """The effective policy of one kind as the API answers it (``GET policies/effective``)."""
    def out(settings: dict[str, Setting]) -> dict[str, Any]:
        return {name: {"value": sorted(s.value) if name in SETS else s.value, "set_by": s.level}
                for name, s in sorted(settings.items())}

    return {"allowed": eff.allowed is None, "refused_by": eff.allowed.level if eff.allowed else None,
            "defaults": out(eff.defaults), "limits": out(eff.limits)}
