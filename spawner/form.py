"""The GPU options form shown at ``/hub/spawn`` and the parsing/validation of ``user_options``.

``user_options`` (from the form or straight from the REST API,
``POST /hub/api/users/{name}/server`` with a JSON body) has these fields, all optional:

=============== =========================== ==================================================
field           example                     meaning
=============== =========================== ==================================================
``gpus``        ``0``, ``0.5``, ``2``       whole GPUs, or a fraction below 1 (hub_ext/domain/gpus.py)
``gpu_memory``  ``"20Gi"``                  instead of ``gpus``: a share of one GPU sized by
                                            memory
``queue``       ``"vision"``                a queue the user may submit to (default: the first)
``preemptible`` ``true``                    may borrow idle GPUs beyond the queue's quota, but
                                            can be preempted when the owner queue needs them
``pool``        ``"build"``                 the node pool to run in (default: the queue's
                                            preference per kind, ``c.GPUPool.pool_preference``)
=============== =========================== ==================================================

Everything here is pure (no I/O) so the KubeSpawner subclass and the local spawner share it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..contract import format_bytes, format_gpus, format_request, parse_bytes
from ..hub_ext.domain.gpus import check_gpus
from ..templating import render

_HERE = os.path.dirname(os.path.abspath(__file__))

OPTION_FIELDS = ("gpus", "gpu_memory", "queue", "preemptible", "pool")


class OptionError(ValueError):
    """A bad user option; ``field`` names it, ``message`` says what is wrong in plain words."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class GPURequest:
    """A validated request: exactly one of ``gpus`` / ``gpu_memory`` is non-zero, or neither (CPU
    only, no admission needed)."""

    gpus: float = 0.0
    gpu_memory: int = 0
    queue: str | None = None
    preemptible: bool = False
    pools: tuple[str, ...] = ()  # the node pool the user chose (none: the service's preference)
    image: str | None = None  # the image the server runs, where the spawner has one (Kubernetes)

    @property
    def wants_gpu(self) -> bool:
        return self.gpus > 0 or self.gpu_memory > 0

    def describe(self) -> str:
        return format_request(self.gpus, self.gpu_memory)

    def body(self, server: str = "") -> dict:
        """The JSON body of ``POST workspaces/{user}``."""
        out: dict[str, Any] = {"server": server, "preemptible": self.preemptible}
        if self.gpu_memory:
            out["gpu_memory"] = self.gpu_memory
        else:
            out["gpus"] = self.gpus
        if self.queue:
            out["queue"] = self.queue
        if self.pools:
            out["pools"] = list(self.pools)
        if self.image:
            out["image"] = self.image
        return out


def _fraction_label(f: float) -> str:
    return {0.25: "a quarter", 0.5: "half", 0.75: "three quarters"}.get(f, f"{f:g}")


def parse_bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, list) and len(value) == 1:  # raw form data
        value = value[0]
    if isinstance(value, str) and value.strip().lower() in ("true", "on", "yes", "1"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "off", "no", "0", ""):
        return False
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise OptionError(field, f"must be true or false, not {value!r}")


def parse_user_options(options: Any, *, max_gpus: int = 8,
                       max_gpu_memory: int = 0, queues: Sequence[str] | None = None,
                       default_gpus: float = 0, default_preemptible: bool = False,
                       extra_fields: Iterable[str] = ()) -> GPURequest:
    """Validate ``user_options`` and return the request, or raise :class:`OptionError`.

    ``queues``: the queues this user may submit to (None: not known, the service checks);
    ``max_gpu_memory``: the largest GPU's memory in bytes (0: not known).
    """
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise OptionError("user_options", "must be a JSON object such as {\"gpus\": 1}")
    allowed = set(OPTION_FIELDS) | set(extra_fields)
    for key in options:
        if key not in allowed:
            raise OptionError(str(key), f"unknown option (allowed: {', '.join(sorted(allowed))})")

    gpus: float = default_gpus if max_gpus > 0 else 0.0
    gpu_memory = 0
    raw_mem = options.get("gpu_memory")
    if isinstance(raw_mem, str) and not raw_mem.strip():
        raw_mem = None
    if raw_mem is not None:
        try:
            gpu_memory = parse_bytes(raw_mem)
        except ValueError as e:
            raise OptionError("gpu_memory", str(e)) from None
        if gpu_memory <= 0:
            raise OptionError("gpu_memory", "must be more than 0, e.g. 20Gi")
        if max_gpus <= 0:
            raise OptionError("gpu_memory", "this hub has no GPUs; start without a GPU")
        if max_gpu_memory and gpu_memory > max_gpu_memory:
            raise OptionError("gpu_memory", f"{format_bytes(gpu_memory)} is more than one GPU has "
                                            f"({format_bytes(max_gpu_memory)}); ask for whole GPUs instead")
        gpus = 0.0
    if "gpus" in options and options["gpus"] not in (None, ""):
        raw = options["gpus"]
        if isinstance(raw, str):  # form data
            try:
                raw = float(raw.strip())
            except ValueError:
                raise OptionError("gpus", f"{options['gpus']!r} is not a number of GPUs") from None
        try:
            gpus = check_gpus(raw)  # the same rule as jobs (hub_ext/domain/gpus.py); fractions are the menu
        except ValueError as e:
            raise OptionError("gpus", str(e)) from None
        if gpu_memory and gpus > 0:
            raise OptionError("gpu_memory", "give either gpus or gpu_memory, not both")
        if gpus > 0 and max_gpus <= 0:
            raise OptionError("gpus", "this hub has no GPUs; start without a GPU (gpus: 0)")
        if gpus > max_gpus:
            raise OptionError("gpus", f"{gpus:g} is more than a workspace may use (at most {max_gpus})")

    queue = options.get("queue")
    if isinstance(queue, str) and not queue.strip():
        queue = None
    if queue is not None:
        if not isinstance(queue, str):
            raise OptionError("queue", "must be a queue name")
        queue = queue.strip()
        if queues is not None and queue not in queues:
            if queues:
                raise OptionError("queue", f"you may not use queue {queue!r} (yours: {', '.join(queues)})")
            raise OptionError("queue", f"you may not use queue {queue!r}; you have no queue, ask your admin")
    elif queues:
        queue = queues[0]

    preemptible = default_preemptible
    if options.get("preemptible") is not None:
        preemptible = parse_bool(options["preemptible"], "preemptible")
    pool = options.get("pool")
    if isinstance(pool, list) and len(pool) == 1:  # raw form data
        pool = pool[0]
    if pool in (None, ""):
        pools: tuple[str, ...] = ()
    elif isinstance(pool, str) and pool.strip():
        pools = (pool.strip(),)  # the service checks it (a pool of the nodes, allowed by the queue's policy)
    else:
        raise OptionError("pool", "must be the name of a node pool")
    return GPURequest(gpus=gpus, gpu_memory=gpu_memory, queue=queue, preemptible=preemptible, pools=pools)


def options_from_form(formdata: dict[str, list[str]]) -> dict:
    """Form data (every value a list of strings) -> ``user_options``.

    Only shapes the data; :func:`parse_user_options` validates. An unchecked checkbox is absent
    from the form, so ``preemptible`` is always set explicitly."""
    def one(key: str) -> str | None:
        v = formdata.get(key)
        if isinstance(v, list):
            v = v[0] if v else None
        return v.strip() if isinstance(v, str) else v

    out: dict[str, Any] = {}
    mem = one("gpu_memory")
    if mem:
        out["gpu_memory"] = mem
    else:
        gpus = one("gpus")
        if gpus:
            out["gpus"] = gpus
    queue = one("queue")
    if queue:
        out["queue"] = queue
    pool = one("pool")
    if pool:
        out["pool"] = pool
    out["preemptible"] = (one("preemptible") or "").lower() in ("on", "true", "1", "yes")
    return out


def queue_policy(policy: dict | None, max_gpus: int) -> dict:
    """What a queue's workload policy (its ``interactive`` entry of ``GET policies/effective``)
    lets a workspace ask for: the most GPUs (``max_gpus``: the pool's, or less), and its defaults."""
    policy = policy or {}
    limits = {k: v.get("value") for k, v in (policy.get("limits") or {}).items()}
    defaults = {k: v.get("value") for k, v in (policy.get("defaults") or {}).items()}
    most = float(max_gpus)
    for key in ("gpus", "gpus_per_pod"):
        if limits.get(key) is not None:
            most = min(most, float(limits[key]))
    where = {k: v.get("set_by") for k, v in (policy.get("limits") or {}).items()}
    return {"max_gpus": most, "gpus": defaults.get("gpus"), "gpu_memory": defaults.get("gpu_memory"),
            "preemptible": defaults.get("preemptible"), "set_by": where.get("gpus") or where.get("gpus_per_pod"),
            "allowed_pools": limits.get("pools")}


def render_form(*, queues: Sequence[dict], fractions: Sequence[float] = (0.25, 0.5), max_gpus: int = 8,
                gpu_memory: int = 0, gpu_model: str = "", defaults: dict | None = None,
                note: str = "", policies: dict | None = None, gpu_kinds: str = "") -> str:
    """The form body (JupyterHub wraps it in ``<form>`` with a Start button), from
    ``templates/gpu_form.html``.

    ``queues``: entries of ``GET queues`` the user may submit to (``name``, ``deserved``,
    ``allocated``, ``pending``); ``defaults``: the user's last ``user_options``; ``policies``: queue
    -> its ``interactive`` policy (``GET policies/effective``): the menu offers only the GPUs the
    chosen queue allows (a script follows the queue menu) and pre-selects its defaults; ``gpu_kinds``:
    the kinds of GPU where they differ (node pools of different GPUs)."""
    d = dict(defaults or {})
    gpu_options = [(0.0, "0", format_gpus(0))]
    if max_gpus > 0:
        gpu_options += [(f, f"{f:g}", f"{format_gpus(f)} ({_fraction_label(f)} of one, shared)") for f in fractions]
    gpu_options += [(float(n), str(n), format_gpus(n)) for n in range(1, max_gpus + 1)]
    rows = []
    for q in queues:
        pools = pool_rows(q)  # with node pools, what a queue deserves is its quotas' sum over them
        deserved = sum(p["deserved"] for p in pools) if pools else float((q.get("deserved") or {}).get("gpu", 0))
        policy = queue_policy((policies or {}).get(str(q.get("name", ""))), max_gpus)
        if policy["allowed_pools"] is not None:  # the pools its workload policy lets workspaces use
            pools = [p for p in pools if p["name"] in policy["allowed_pools"]]
        rows.append({"name": str(q.get("name", "")), "deserved": deserved,
                     "allocated": float((q.get("allocated") or {}).get("gpu", 0)), "pending": q.get("pending", 0),
                     **policy, "pools": pools})
    current_queue = d.get("queue") if any(r["name"] == d.get("queue") for r in rows) else (rows[0]["name"] if rows
                                                                                          else "")
    policy = next((r for r in rows if r["name"] == current_queue), queue_policy(None, max_gpus))
    try:
        last = float(str(d["gpus"])) if d.get("gpus") not in (None, "") else None
    except ValueError:
        last = None
    if d.get("gpu_memory"):  # the user's last choice: a share of one GPU
        chosen, gpu_memory_value = 0.0, str(d["gpu_memory"])
    elif last is not None and last <= policy["max_gpus"]:
        chosen, gpu_memory_value = last, ""
    else:  # the queue's defaults
        chosen = float(policy["gpus"] or 0)
        gpu_memory_value = format_bytes(policy["gpu_memory"]) if policy["gpu_memory"] else ""
    preemptible = d.get("preemptible") if "preemptible" in d else policy["preemptible"]
    menu = pool_menu(rows)
    current_pool = d.get("pool") if any(m["name"] == d.get("pool") and current_queue in m["queues"]
                                        for m in menu) else ""
    return render(_HERE, "gpu_form.html", note=note, gpu_options=gpu_options, current_gpus=f"{chosen:g}",
                  pool_menu=menu, current_pool=current_pool,
                  gpu_memory_value=gpu_memory_value, gpu_memory=0 if gpu_kinds else gpu_memory,
                  gpu_model=gpu_kinds or gpu_model,
                  queues=rows, current_queue=current_queue, max_allowed=policy["max_gpus"],
                  preemptible=preemptible in (True, "on", "true"))


def pool_rows(queue: dict) -> list[dict]:
    """The node pools a queue (an entry of ``GET queues``) may use, with each pool's free GPUs and
    waiting workloads and the queue's deserved GPUs there; [] when the pool has one pool, ``default``."""
    pools = queue.get("pools") or {}
    if list(pools) in ([], ["default"]):
        return []
    return [{"name": name, "free": float(p.get("free") or 0), "queued": int(p.get("queued") or 0),
             "deserved": float((p.get("deserved") or {}).get("gpu", 0))}
            for name, p in pools.items() if p.get("may_use", True)]


def pool_menu(rows: Sequence[dict]) -> list[dict]:
    """The spawn page's node pool menu: every pool some queue of the user may use (quota and
    policy), with its free GPUs and waiting workloads and the queues that may use it."""
    menu: dict[str, dict] = {}
    for r in rows:
        for p in r["pools"]:
            entry = menu.setdefault(p["name"], {"name": p["name"], "free": p["free"], "queued": p["queued"],
                                                "queues": []})
            entry["queues"].append(r["name"])
    return list(menu.values())


def render_unavailable() -> str:
    """What the form says while the service does not answer (a workspace without GPU can still start)."""
    return render(_HERE, "unavailable.html")
