"""``c.GPUPool``: every admin knob of the gpupool hub service, as traitlets.

The admin writes, in ``jupyterhub_config.py``::

    from gpupool.hub_ext import configure
    configure(c)
    c.GPUPool.queues = [{"name": "vision", "deserved": {"gpu": 2}, "users": ["alice"], "groups": ["cv"]}]
    c.GPUPool.nodes = [{"name": "box", "gpus": 4, "gpu_memory": "24Gi"}]

``configure(c)`` gives the service an environment variable ``GPUPOOL_CONFIG`` that JupyterHub
computes when it starts the service (after the whole file ran, so ``c.GPUPool`` may be set before
or after ``configure(c)``): :func:`load` validates everything, resolves what depends on the hub's
working directory, and hands the service every ``GPUPool`` trait as JSON. A bad entry raises
:class:`GPUPoolConfigError`, which stops the hub with a message naming it.
"""
from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from traitlets import Bool, Dict, Enum, Float, Integer, List, Unicode, Union
from traitlets.config import Config

from ..backends import nvml as nvml_mod
from ..scheduler.model import NodeSpec, QueueSpec
from ..scheduler.placement import POLICIES
from ..scheduler.spec import SpecError, parse_nodes, parse_queues
from .config_checks import knob_errors, over_commit_warnings
from .config_endpoints import EndpointSettings, endpoint_errors
from .config_gpus import GpuTruthSettings
from .config_pools import PoolSettings, pool_errors
from .domain.idle_rules import RuleError, resolve_limits, resolve_rules
from .domain.policies import merge_time_rules, resolve as resolve_policies, unknown_pools
from .web.scopes import role_errors

QUEUE_ACCESS_FIELDS = ("users", "groups")


class GPUPoolConfigError(ValueError):
    """A bad ``c.GPUPool`` setting; the message names it."""


class GPUPool(PoolSettings, GpuTruthSettings, EndpointSettings):  # + the knobs of node pools and fairness
    # over time (config_pools.py), of GPU enforcement on a cluster (config_gpus.py), of endpoints (config_endpoints.py)
    """The gpupool hub service: queues, nodes and how jobs run."""

    queues = List(
        Dict(),
        default_value=[],
        help="""Queues, in the scenario format (name, parent, deserved, limit, over_quota_weight,
        priority, pools: a quota per node pool) plus who may use each leaf queue: ``users`` (names)
        and ``groups`` (JupyterHub groups). A queue with neither is open to every user. ``policy``
        (any queue or department): defaults and limits per kind, which a child may only tighten
        (docs/admin.md). Example:
        ``[{"name": "vision", "deserved": {"gpu": 2}, "users": ["alice"], "groups": ["cv"]}]``.
        Empty: one queue ``default`` open to everyone, deserving all GPUs.
        Changes apply when the hub restarts; queued and running jobs are kept.""",
    ).tag(config=True)

    nodes = Union(
        [List(Dict()), Unicode()],
        default_value=None,
        allow_none=True,
        help="""Nodes and their GPUs, in the scenario format (name, count, gpus, gpu_memory,
        gpu_model, cpu, memory, labels, pool), e.g. ``[{"name": "box", "gpus": 4, "gpu_memory": "24Gi"}]``.
        Unset (None): this machine's GPUs (NVML). An empty list: no GPUs (CPU-only jobs still run).""",
    ).tag(config=True)

    db_url = Unicode(
        "",
        help="""SQLAlchemy URL of the service's state database. Default: SQLite file
        ``gpupool.sqlite`` in the hub's working directory (WAL mode).""",
    ).tag(config=True)

    cycle_seconds = Float(
        2.0, help="Seconds between scheduling cycles (a submission or release also wakes the loop at once)."
    ).tag(config=True)

    preemption_grace = Float(
        30.0,
        help="""Seconds a preempted or cancelled job gets to checkpoint and exit after it is asked
        to stop (``gpupool.checkpoint.should_stop()`` turns True) before it is terminated.""",
    ).tag(config=True)

    kill_after = Float(
        5.0, help="Seconds between SIGTERM and SIGKILL when a job does not exit after its grace period."
    ).tag(config=True)

    min_runtime = Float(
        0.0, help="Seconds a started preemptible job is protected from preemption."
    ).tag(config=True)

    max_pods = Integer(
        64, help="""Most workers (``pods``) one distributed job may ask for; a submission with more
        is refused (400, field ``pods``).""",
    ).tag(config=True)

    gang_restarts = Integer(
        3, help="""How often a distributed job is requeued (and resumes from its checkpoint) after
        one of its workers died (killed by a signal, its process or pod gone) before it fails.
        A worker that exits with an error status fails the job at once.""",
    ).tag(config=True)

    startup_retries = Integer(
        2, help="""How often a job whose run died before its code ran (the machinery failed, not the job:
        its kernel died before it answered) starts again before it fails, as a Kubernetes Job's
        backoffLimit; its history names each cause. 0 = never.""",
    ).tag(config=True)

    cycle_in_process = Bool(
        True,
        help="""Run the heavy part of each scheduling cycle (reading every active workload from the
        database, the scheduler's decisions, the pending reasons) in a worker process of the service,
        so that the API answers at once while a long cycle runs (a pool of 1000 nodes and 20,000
        workloads takes about a second per cycle). False: in a thread of the service (the same
        decisions; API requests then wait on Python's GIL while a cycle runs). A worker process
        that dies costs no cycle: that cycle runs in a thread and a new worker is started (after 3
        deaths in a row, cycles stay in a thread and the log says so).""",
    ).tag(config=True)

    cycle_timeout = Float(
        60.0,
        help="""Seconds the loop waits for the worker process's decision (``cycle_in_process``). A
        worker that hangs (rather than dies) is then killed, that cycle is decided in a thread of
        the service, and a new worker is started (counted like a death: after 3 in a row, cycles
        stay in a thread); the log names this knob. A cycle of a pool of 1000 nodes and 20,000
        workloads takes about a second, and a worker starting up a few; raise it only for a pool
        whose cycles take tens of seconds. Not applied when cycles run in a thread.""",
    ).tag(config=True)

    placement = Enum(
        list(POLICIES), default_value="default", help="Placement policy of the scheduler."
    ).tag(config=True)

    gpu_memory_reserve = Float(
        0.03,
        help="""Fraction of each GPU's memory the driver keeps for itself (CUDA context, ECC): a
        memory-sized request (``gpu_memory``) is placed against what is left, the memory less
        ``max(gpu_memory_reserve x memory, gpu_memory_reserve_min)``, so that shares that add up to
        the card's size never fail with out-of-memory. 0 (with ``gpu_memory_reserve_min = 0``):
        the whole memory. Between 0 and 1.""",
    ).tag(config=True)

    gpu_memory_reserve_min = Union(
        [Integer(), Unicode()],
        default_value="256Mi",
        help="""The least GPU memory kept back per GPU (see ``gpu_memory_reserve``): bytes or a
        quantity such as ``256Mi`` or ``1Gi``.""",
    ).tag(config=True)

    job_root = Unicode(
        "",
        help="""Directory holding each job's files: ``<job_root>/<job id>/`` with the submitted
        notebook, the executed output notebook, the log, and ``checkpoints/`` (kept across
        requeues). Default: ``gpupool-jobs`` in the hub's working directory.""",
    ).tag(config=True)

    work_dir = Unicode(
        "{home}",
        help="""Working directory of a user's jobs (papermill runs the notebook there; a job's
        ``notebook`` path is relative to it). ``{home}`` is the user's home directory from the
        system's user database, ``{user}`` the JupyterHub user name, e.g. ``/srv/homes/{user}``.""",
    ).tag(config=True)

    run_as_user = Bool(
        True,
        help="""When the service runs as root, run each job as the system user of the same name
        (the job fails with a clear reason if there is none). Set False to run jobs as the
        service's own user (e.g. a demo with users that have no system account).""",
    ).tag(config=True)

    job_python = Unicode(
        "",
        help="Python interpreter that runs papermill for jobs (default: the service's own).",
    ).tag(config=True)

    kernel_name = Unicode(
        "", help="Jupyter kernel for jobs (default: the one named in the notebook's metadata)."
    ).tag(config=True)

    backend = Unicode(
        "local",
        help="""Job backend: ``local`` (jobs are processes on this machine) or an import path
        ``package.module.Class`` of a :class:`gpupool.backends.base.JobBackend`.""",
    ).tag(config=True)

    memory_enforcement = Enum(
        ["report", "stop"],
        default_value="report",
        help="""What to do when NVML shows a fractional-GPU job using more GPU memory than its
        share: ``report`` (say so in the job's reason) or ``stop`` (stop it; it fails with that
        reason). Dormant without NVML.""",
    ).tag(config=True)

    workspace_preemptible_default = Bool(
        False,
        help="Whether a workspace (notebook server) is preemptible when its request does not say.",
    ).tag(config=True)

    default_queue = Unicode(
        "", help="Queue of a submission that names none (default: the user's first permitted queue)."
    ).tag(config=True)

    port = Integer(10101, help="""Port the service listens on (127.0.0.1); set it before configure(c). A
        port in use (another hub's service) stops the hub at start with a message naming this setting.""",
                   ).tag(config=True)

    service_name = Unicode("gpupool", help="Name of the JupyterHub service.").tag(config=True)

    api_token = Unicode(
        "",
        help="""API token of the service (JupyterHub service token). Default: a fresh random
        token at each hub start. In-hub code (the spawner) uses it to call the service.""",
    ).tag(config=True)

    api_url = Unicode(
        "",
        help="""URL jobs use to reach the service (GPUPOOL_API_URL in a job's environment).
        Default: the service's own URL.""",
    ).tag(config=True)

    max_log_bytes = Integer(
        0, help="Largest log response in bytes (0 = no limit); clients page with ?offset=."
    ).tag(config=True)

    metrics_require_auth = Bool(
        False, help="Whether GET metrics (Prometheus) needs a token with a gpupool scope."
    ).tag(config=True)

    group_cache_seconds = Float(
        30.0, help="How long the service caches a user's JupyterHub groups and admin flag."
    ).tag(config=True)

    workspace_reconcile_seconds = Float(
        30.0,
        help="""Seconds between checks of workspaces against JupyterHub (and one at service start):
        the service asks the hub which servers are running or starting (``GET /hub/api/users
        ?state=active``) and releases the GPUs of a workspace whose server the hub no longer has
        (e.g. the hub stopped its servers after it stopped this service, so their release never
        arrived). The workspace ends ``cancelled`` with a reason saying so. 0 = never check.""",
    ).tag(config=True)

    workspace_release_grace = Float(
        60.0,
        help="""Seconds a workspace's server must be missing from JupyterHub, in consecutive checks,
        before its workspace is released (a server that is starting or stopping counts as present;
        the grace covers requests racing with a check). Nothing is released while the hub cannot
        be asked.""",
    ).tag(config=True)

    nvml_module = Unicode(
        "pynvml",
        help="""The NVML library the service reads GPUs through: ``pynvml`` (from nvidia-ml-py), or the
        import path of a module with the same functions (``package.module`` or
        ``package.module:object``), e.g. a stand-in for tests or a wrapper for a special driver.""",
    ).tag(config=True)

    usage_sample_seconds = Float(
        10.0,
        help="""Seconds between NVML utilisation readings of every GPU (stored in the service's database
        for the utilisation history, the used GPU-hours of reports, and the idle rules). 0 = no
        sampling. Only GPUs found through NVML are read; a declared inventory has no readings.""",
    ).tag(config=True)

    usage_raw_retention = Float(
        86400.0,
        help="""Seconds raw readings are kept; older ones are merged into rows of
        ``usage_rollup_seconds`` (time-weighted means).""",
    ).tag(config=True)

    usage_rollup_seconds = Float(
        300.0, help="Length in seconds of a downsampled utilisation row (after ``usage_raw_retention``)."
    ).tag(config=True)

    usage_rollup_retention = Float(
        90 * 86400.0,
        help="""Seconds downsampled utilisation rows are kept (the usage ledger itself is kept
        forever: it is one row per allocation interval).""",
    ).tag(config=True)

    idle_rules = Dict(
        default_value={},
        help="""Idle-GPU rules per queue (``"*"``: the whole pool) and workload class, e.g.
        ``{"*": {"interactive": {"after": "2h"}}, "vision": {"train": {"after": "30m", "action": "requeue"}}}``.
        Classes: interactive, interactive-preemptible, train, hpo-trial, inference. Actions:
        suspend (workspaces: the server stops, its GPUs go back, it can be resumed) or flag;
        flag or requeue (jobs). A child queue may only tighten its parents' rules. Empty: no rules.
        See docs/admin.md.""",
    ).tag(config=True)

    idle_window_seconds = Float(
        30.0,
        help="""Idle time is counted in windows of this many seconds: a workload is idle when every
        window of its rule's time had NVML readings of its GPUs, all at 0 % utilisation.""",
    ).tag(config=True)

    max_runtime = Dict(
        default_value={},
        help="""Maximum run time per queue (``"*"``: the whole pool) and class, e.g.
        ``{"*": {"train": "72h", "interactive": "24h"}}``. Past it a job is asked to checkpoint and
        requeued (not killed) and a workspace is suspended; ``max_runtime_warning`` seconds before,
        the workload's reason says so (a job also sees it through ``gpupool.checkpoint.warning()``).
        A child queue may only shorten its parents' limits. Empty: no limit.""",
    ).tag(config=True)

    max_runtime_warning = Float(
        600.0, help="Seconds before a workload reaches its maximum run time that it is warned."
    ).tag(config=True)


@dataclass
class Settings:
    """The validated, resolved configuration the service runs with."""

    pool: GPUPool
    queues: list[QueueSpec]
    access: dict[str, dict[str, list[str]]]  # leaf queue -> {"users": [...], "groups": [...]}
    nodes: list[NodeSpec]
    gpu_uuids: dict[str, list[str]] = field(default_factory=dict)  # node -> uuid per index (NVML)
    warnings: list[str] = field(default_factory=list)  # e.g. over-committed quotas (logged at start)
    idle_rules: dict = field(default_factory=dict)  # (queue, class) -> domain.idle_rules.Rule
    max_runtime: dict = field(default_factory=dict)  # (queue, class) -> domain.idle_rules.Rule
    policies: dict = field(default_factory=dict)  # leaf queue -> kind -> domain.policies.KindPolicy


def _traits_json(pool: GPUPool) -> dict[str, Any]:
    return {name: getattr(pool, name) for name in pool.trait_names(config=True)}


def _resolve(pool: GPUPool, cwd: str) -> None:
    if not pool.db_url:
        pool.db_url = "sqlite:///" + os.path.join(cwd, "gpupool.sqlite")
    if not pool.job_root:
        pool.job_root = os.path.join(cwd, "gpupool-jobs")
    pool.job_root = os.path.abspath(pool.job_root)


def load(config: Config | GPUPool | dict, cwd: str | None = None, discover: bool = True) -> Settings:
    """Validate a ``GPUPool`` configuration and resolve it into :class:`Settings`.

    Raises :class:`GPUPoolConfigError` naming the setting at fault (one line per problem)."""
    settings, errors = _examine(config, cwd, discover)
    if errors:
        raise GPUPoolConfigError("\n".join(errors))
    assert settings is not None
    return settings


def check(config: Config | GPUPool | dict, cwd: str | None = None, discover: bool = True) -> tuple[list[str], list[str]]:
    """Every problem (errors) and every warning of a configuration, one sentence each."""
    settings, errors = _examine(config, cwd, discover)
    return errors, (settings.warnings if settings is not None else [])


def _pool(config: Config | GPUPool | dict, errors: list[str]) -> GPUPool:
    """The GPUPool of ``config``: an unknown (e.g. misspelled) setting or a value of the wrong type
    is an error, not a warning that lets the hub start with the default."""
    if isinstance(config, GPUPool):
        return config
    if isinstance(config, dict) and not isinstance(config, Config):
        config = Config({"GPUPool": config})
    section = config.GPUPool if "GPUPool" in config else {}
    known = set(GPUPool.class_trait_names(config=True))
    good: dict[str, Any] = {}
    for key, value in section.items():
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean c.GPUPool.{close[0]}?" if close else "the settings are listed in docs/hub.md"
            errors.append(f"c.GPUPool.{key}: no such setting ({hint})")
            continue
        try:
            GPUPool(config=Config({"GPUPool": {key: value}}))
        except Exception as e:  # traitlets TraitError: wrong type for a knob
            errors.append(f"c.GPUPool.{key}: {e}")
            continue
        good[key] = value
    return GPUPool(config=Config({"GPUPool": good}))


def _roles(value: Any) -> list:
    """``c.JupyterHub.load_roles`` (a traitlets lazy value when the file appended to it)."""
    get_value = getattr(value, "get_value", None)
    return list(get_value([]) if get_value is not None else value or [])


def _examine(config: Config | GPUPool | dict, cwd: str | None, discover: bool) -> tuple[Settings | None, list[str]]:
    errors: list[str] = []
    pool = _pool(config, errors)
    _resolve(pool, cwd or os.getcwd())
    raw = pool.queues or [{"name": "default"}]
    queues: list[QueueSpec] = []
    access: dict[str, dict[str, list[str]]] = {}
    try:
        queues = parse_queues(raw, "c.GPUPool.queues", extra_fields=(*QUEUE_ACCESS_FIELDS, "policy"))
    except SpecError as e:
        errors.append(str(e))
    else:
        for i, entry in enumerate(raw):
            for key in QUEUE_ACCESS_FIELDS:
                val = entry.get(key, [])
                if not isinstance(val, list) or not all(isinstance(v, str) and v for v in val):
                    errors.append(f"c.GPUPool.queues[{i}].{key}: must be a list of names")
            access[entry["name"]] = {k: list(entry[k]) if isinstance(entry.get(k), list) else []
                                     for k in QUEUE_ACCESS_FIELDS}
    uuids: dict[str, list[str]] = {}
    nodes: list[NodeSpec] = []
    nodes_ok = True
    try:
        nvml = nvml_mod.Reader(nvml_mod.load_module(pool.nvml_module))
    except (ImportError, AttributeError) as e:
        errors.append(f"c.GPUPool.nvml_module: cannot load {pool.nvml_module!r}: {e}")
        nvml = nvml_mod.Reader(None)
    if pool.nodes is None:
        if discover:
            nodes = nvml.discover_nodes()
            if not nodes:
                nodes_ok = False
                errors.append(
                    "c.GPUPool.nodes: not set and NVML finds no GPU on this machine; declare the "
                    "GPUs, e.g. c.GPUPool.nodes = [{'name': 'box', 'gpus': 4, 'gpu_memory': '24Gi'}] "
                    "(or c.GPUPool.nodes = [] for CPU-only jobs)")
            else:
                uuids = {nodes[0].name: [g["uuid"] for g in nvml.gpus()]}
        else:
            nodes_ok = False  # not known yet: nothing to compare quotas with
    elif isinstance(pool.nodes, str):
        nodes_ok = False
        errors.append("c.GPUPool.nodes: must be a list of node entries")
    else:
        try:
            nodes = parse_nodes(pool.nodes, "c.GPUPool.nodes")
        except SpecError as e:
            nodes_ok = False
            errors.append(str(e))
    policies, policy_errors = resolve_policies(raw, queues) if queues else ({}, [])
    errors += policy_errors
    if nodes_ok and isinstance(pool.nodes, list):  # declared nodes: a policy's pools must be theirs
        errors += unknown_pools(raw, {n.pool for n in nodes})
    if pool.default_queue and access and pool.default_queue not in access:
        errors.append(f"c.GPUPool.default_queue: unknown queue {pool.default_queue!r}")
    errors += knob_errors(pool) + pool_errors(pool) + endpoint_errors(pool)
    if isinstance(config, Config) and "JupyterHub" in config and "load_roles" in config.JupyterHub:
        errors += role_errors(_roles(config.JupyterHub.load_roles))
    if errors:
        return None, errors
    try:
        idle_rules = resolve_rules(pool.idle_rules, queues)
        max_runtime = resolve_limits(pool.max_runtime, queues)
    except RuleError as e:
        return None, [str(e)]
    merge_time_rules(policies, max_runtime, idle_rules)
    warnings = over_commit_warnings(queues, nodes if nodes_ok else None)
    return Settings(pool=pool, queues=queues, access=access, nodes=nodes, gpu_uuids=uuids, warnings=warnings,
                    idle_rules=idle_rules, max_runtime=max_runtime, policies=policies), []


def to_json(settings: Settings) -> str:
    """The document handed to the service (GPUPOOL_CONFIG)."""
    doc = _traits_json(settings.pool)
    return json.dumps({"GPUPool": doc})


def from_json(text: str) -> Settings:
    """The service side of :func:`to_json`."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise GPUPoolConfigError(f"GPUPOOL_CONFIG is not JSON: {e}") from None
    return load(Config(doc), discover=True)


def check_file(path: str, cwd: str | None = None) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the gpupool settings in a ``jupyterhub_config.py``, without starting
    anything: the file is run as JupyterHub runs it, then :func:`check` looks at ``c.GPUPool``."""
    from traitlets.config.loader import PyFileConfigLoader

    full = os.path.abspath(path)
    try:
        c = PyFileConfigLoader(os.path.basename(full), path=os.path.dirname(full)).load_config()
    except GPUPoolConfigError as e:  # configure(c) checks what is set before it
        return str(e).splitlines(), []
    except Exception as e:  # a syntax error, an import that fails...
        return [f"{path}: the file does not run: {type(e).__name__}: {e}"], []
    services = c.JupyterHub.services if "services" in c.JupyterHub else []
    name = c.GPUPool.service_name if "service_name" in c.GPUPool else "gpupool"
    if not any(isinstance(sv, dict) and sv.get("name") == name for sv in services or []):
        return [f"{path}: does not call configure(c) (add `from gpupool.hub_ext import configure; configure(c)`)"], []
    return check(c, cwd=cwd)
