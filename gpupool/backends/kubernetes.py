"""Kubernetes: the GPU inventory from the API server, and the job backend that runs notebook jobs
as pods. The scheduler core decides; Kubernetes runs the pods.

Inventory (:class:`KubeInventory`): nodes and GPUs from the API, kept current by watches
(list, then watch from the list's ``resourceVersion``; a new list after an error or a 410 Gone):

* GPUs per node: ``status.allocatable["nvidia.com/gpu"]`` (else capacity, else the GPU feature
  discovery label ``nvidia.com/gpu.count``); model ``nvidia.com/gpu.product``; memory per GPU
  ``nvidia.com/gpu.memory`` (MiB); GPU UUIDs from the node annotation ``gpupool.io/gpu-uuids``
  when an admin sets it (fractions then pin the exact device);
* topology: the zone and rack labels (``c.GPUPoolKubernetes.zone_label`` / ``rack_label``) are
  copied to the node's labels as ``zone`` and ``rack`` (the scheduler's gang topology key);
* node pool: the value of the node label ``c.GPUPoolKubernetes.pool_label`` (``gpupool.io/pool``),
  pool ``default`` without it;
* cordoned (``spec.unschedulable``) and NotReady nodes are kept with ``schedulable=False`` (what
  already runs there stays accounted for; nothing new goes there);
* GPUs (and CPU/memory requests) of pods that gpupool does not manage (no
  ``gpupool.io/managed=true`` label: another scheduler's or a plain ``kubectl run``) are
  subtracted and reported in ``reserved``.

Job backend (:class:`KubeJobBackend`, ``c.GPUPool.backend =
"gpupool.backends.kubernetes.KubeJobBackend"``): one pod per attempt of a job, built by
:mod:`gpupool.backends.kube_manifests`, in the user's image with the user's volume and the shared
jobs volume (the job's notebook, output, log, checkpoints and stop file live there, at the same
path as in the service) mounted. Preemption and cancel write the stop request and delete the pod
with a grace period; the pod's entrypoint turns the SIGTERM into ``should_stop()``; a requeued job
gets a new pod that mounts the same checkpoint directory. Pods carry ``gpupool.io/*`` labels, so a
restarted service finds its runs again by label selector (:meth:`KubeJobBackend.adopt`).

Settings: ``c.GPUPoolKubernetes.*`` in the hub's configuration, or a JSON/YAML file named by the
environment variable ``GPUPOOL_KUBE_CONFIG`` (``{"GPUPoolKubernetes": {...}}``; the Helm chart
mounts one) for the service process.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from traitlets import Bool, Dict, Float, Integer, List, Unicode
from traitlets.config import Config, LoggingConfigurable

from .. import protocol as P
from ..contract import TRAIN, decode_allocation
from ..scheduler.model import DEFAULT_POOL, NodeSpec, PodPlacement
from ..scheduler.units import parse_bytes, parse_cpu
from . import kube_manifests as km
from .base import EXITED, LOST, RUNNING, JobBackend, JobSpec, RunState, gang_state, worker_run_id

IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
TERMINAL = ("Succeeded", "Failed")
IMAGE_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                "CreateContainerConfigError", "CreateContainerError", "RunContainerError")


class GPUPoolKubernetes(LoggingConfigurable):
    """Settings of gpupool's Kubernetes inventory and job backend."""

    api_host = Unicode("", help="""URL of the Kubernetes API server. Default: the in-cluster
        service account, else the kubeconfig (``kubeconfig`` or $KUBECONFIG).""").tag(config=True)
    kubeconfig = Unicode("", help="Path of a kubeconfig file (default: $KUBECONFIG or ~/.kube/config).").tag(config=True)
    namespace = Unicode("", help="""Namespace of job pods. Default: the service account's
        namespace in a cluster, else ``default``.""").tag(config=True)

    # inventory
    discovery = Unicode("kubernetes", help="""Where the node inventory comes from: ``kubernetes``
        (nodes and GPUs from the API, watched) or ``declared`` (``c.GPUPool.nodes``).""").tag(config=True)
    node_selector = Unicode("", help="""Label selector limiting the nodes gpupool schedules on,
        e.g. ``nvidia.com/gpu.present=true`` (default: every node).""").tag(config=True)
    gpu_nodes_only = Bool(True, help="Leave out nodes without ``nvidia.com/gpu``.").tag(config=True)
    zone_label = Unicode("topology.kubernetes.io/zone", help="Node label copied to the inventory as ``zone``.").tag(config=True)
    rack_label = Unicode("topology.gpupool.io/rack", help="""Node label copied to the inventory as
        ``rack`` (the scheduler's default topology key for gangs).""").tag(config=True)
    pool_label = Unicode("gpupool.io/pool", help="""Node label whose value is the node's pool (each pool
        divided by its own quotas: a queue's ``pools`` in c.GPUPool.queues). A node without it (or
        with an empty value) is in pool ``default``; empty: every node in pool ``default``.""").tag(config=True)
    count_foreign_pods = Bool(True, help="""Subtract GPUs (and CPU/memory) held by pods gpupool does not
        manage. Needs cluster-wide read access to pods; False: only nodes are read.""").tag(config=True)
    track_cpu_memory = Bool(True, help="""Track CPU and memory too: allocatable minus the requests of
        pods gpupool does not manage. False: only GPUs are tracked.""").tag(config=True)
    watch_timeout = Integer(300, help="Seconds before a watch is renewed (the API server's timeoutSeconds).").tag(config=True)

    # job pods
    image = Unicode("", help="""Image of job pods when the user has no running notebook server to
        take the image from. It needs Python with gpupool, papermill and ipykernel. Default:
        $GPUPOOL_JOB_IMAGE (the Helm chart sets it to the hub image).""").tag(config=True)
    image_from_workspace = Bool(True, help="""Run a user's job in the image of the user's running
        notebook server pod (KubeSpawner's, found by its labels) when there is one.""").tag(config=True)
    image_pull_policy = Unicode("", help="imagePullPolicy of job pods (default: Kubernetes' default).").tag(config=True)
    image_pull_secrets = List(Unicode(), default_value=[], help="imagePullSecrets of job pods.").tag(config=True)
    home_claim = Unicode("claim-{username}", help="""PVC with the user's home, mounted at
        ``home_mount`` (the z2jh default name; ``{username}`` is KubeSpawner's safe slug of the
        name). Empty: no home volume.""").tag(config=True)
    home_mount = Unicode("/home/jovyan", help="Where the user's home is mounted; the notebook runs there.").tag(config=True)
    jobs_claim = Unicode("gpupool-jobs", help="""PVC holding the jobs' directories (notebook, output,
        log, checkpoints, stop requests), mounted in job pods at ``jobs_mount`` and in the hub pod
        at ``c.GPUPool.job_root``. ReadWriteMany for more than one node.""").tag(config=True)
    jobs_mount = Unicode("", help="Mount path of ``jobs_claim`` in job pods (default: c.GPUPool.job_root, the same path as in the service).").tag(config=True)
    python = Unicode("python3", help="Python interpreter in the job image.").tag(config=True)
    kernel_name = Unicode("", help="Kernel for papermill in the job image (default: the notebook's).").tag(config=True)
    service_account = Unicode("", help="Service account of job pods (default: the namespace's default; its token is not mounted).").tag(config=True)
    runtime_class = Unicode("", help="""runtimeClassName of GPU job pods (e.g. ``nvidia`` on k3s,
        where the NVIDIA runtime is not the default).""").tag(config=True)
    priority_class = Unicode("", help="priorityClassName of job pods.").tag(config=True)
    run_as_uid = Integer(None, allow_none=True, help="runAsUser of job pods (default: the image's user).").tag(config=True)
    run_as_gid = Integer(None, allow_none=True, help="runAsGroup of job pods.").tag(config=True)
    fs_gid = Integer(None, allow_none=True, help="fsGroup of job pods (z2jh uses 100).").tag(config=True)
    cpu = Float(0.0, help="CPU request of a job pod when the job names none (cores).").tag(config=True)
    memory = Unicode("", help="Memory request and limit of a job pod when the job names none (e.g. 8Gi).").tag(config=True)
    extra_node_selector = Dict(default_value={}, help="Extra nodeSelector of job pods.").tag(config=True)
    tolerations = List(Dict(), default_value=[], help="Extra tolerations of job pods.").tag(config=True)
    extra_labels = Dict(default_value={}, help="Extra labels of job pods.").tag(config=True)
    extra_annotations = Dict(default_value={}, help="Extra annotations of job pods.").tag(config=True)
    api_url = Unicode("", help="""GPUPOOL_API_URL in job pods (how a job reaches the service, e.g.
        ``http://proxy-public.jhub.svc/services/gpupool/``). Default: what the service gives.""").tag(config=True)
    delete_finished_pods = Bool(True, help="Delete a job's pod once its end is recorded (the log stays in the job's directory).").tag(config=True)
    pending_timeout = Float(600.0, help="""Seconds a job pod may wait for its node (unschedulable)
        before the job is requeued, or fail to pull its image before the job fails.""").tag(config=True)
    request_timeout = Float(30.0, help="Seconds an API request may take.").tag(config=True)

    # distributed jobs
    rendezvous_host = Unicode("{pod}.{service}.{namespace}.svc", help="""MASTER_ADDR of a
        distributed job's workers: rank 0's pod in the job's headless Service. ``{pod}``,
        ``{service}`` and ``{namespace}`` are filled in; append your cluster domain if pods do not
        resolve the short form (e.g. ``{pod}.{service}.{namespace}.svc.cluster.local``).""").tag(config=True)
    rendezvous_port = Integer(29500, help="MASTER_PORT of a distributed job's workers (rank 0 listens on it in its pod).").tag(config=True)


def load_settings(config: Config | None = None, log: Any = None) -> GPUPoolKubernetes:
    """``GPUPoolKubernetes`` from ``config`` plus the file named by $GPUPOOL_KUBE_CONFIG."""
    cfg = Config()
    if config is not None:
        cfg.merge(config)
    path = os.environ.get("GPUPOOL_KUBE_CONFIG")
    if path:
        with open(path) as f:
            text = f.read()
        try:
            doc = json.loads(text)
        except ValueError:
            import yaml

            doc = yaml.safe_load(text) or {}
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: must be a mapping like {{'GPUPoolKubernetes': {{...}}}}")
        cfg.merge(Config(doc))
    kwargs = {"config": cfg}
    if log is not None:
        kwargs["log"] = log
    return GPUPoolKubernetes(**kwargs)


async def client_configuration(settings: GPUPoolKubernetes) -> Any:
    """A kubernetes_asyncio Configuration: ``api_host``, else in-cluster, else kubeconfig."""
    from kubernetes_asyncio import config as kconfig
    from kubernetes_asyncio.client import Configuration

    cfg = Configuration()
    if settings.api_host:
        cfg.host = settings.api_host.rstrip("/")
        return cfg
    try:
        kconfig.load_incluster_config(client_configuration=cfg)
        return cfg
    except kconfig.ConfigException:
        pass
    await kconfig.load_kube_config(config_file=settings.kubeconfig or None, client_configuration=cfg)
    return cfg


def discover(settings: GPUPoolKubernetes) -> Inventory:
    """One synchronous read of the inventory (nodes, and pods unless ``count_foreign_pods`` is
    off) with the official ``kubernetes`` client: what the service needs before its first cycle.
    Raises RuntimeError with the API's reason when the cluster cannot be read."""
    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    cfg = kclient.Configuration()
    try:
        if settings.api_host:
            cfg.host = settings.api_host.rstrip("/")
        else:
            try:
                kconfig.load_incluster_config(client_configuration=cfg)
            except kconfig.ConfigException:
                kconfig.load_kube_config(config_file=settings.kubeconfig or None, client_configuration=cfg)
        with kclient.ApiClient(cfg) as api:
            core = kclient.CoreV1Api(api)
            kw = {"label_selector": settings.node_selector} if settings.node_selector else {}
            nodes = json.loads(core.list_node(_preload_content=False, _request_timeout=settings.request_timeout,
                                              **kw).data)["items"]
            pods = []
            if settings.count_foreign_pods:
                pods = json.loads(core.list_pod_for_all_namespaces(
                    field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False,
                    _request_timeout=settings.request_timeout).data)["items"]
    except Exception as e:  # noqa: BLE001 - config, network, RBAC: one clear sentence
        reason = getattr(e, "reason", None) or str(e)
        raise RuntimeError(f"cannot read the nodes from the Kubernetes API ({cfg.host}): {reason}") from None
    return build_inventory(nodes, pods, settings)


def default_namespace(settings: GPUPoolKubernetes) -> str:
    if settings.namespace:
        return settings.namespace
    try:
        with open(IN_CLUSTER_NAMESPACE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


# -- list-then-watch ---------------------------------------------------------------------------

class ListWatch:
    """A local copy of a set of objects: list, then watch from the list's resourceVersion; after
    a watch ends (timeout) continue from the last version seen; after an error (410 Gone, network)
    list again, backing off up to 30 s. ``on_change(kind, obj)`` is called for every change
    (kind ``SYNC`` with obj None after a list)."""

    def __init__(self, name: str, list_fn: Callable, *, log: Any, timeout: int = 300,
                 on_change: Callable[[str, dict | None], None] | None = None, **kwargs: Any):
        self.name = name
        self.list_fn = list_fn
        self.kwargs = kwargs
        self.log = log
        self.timeout = timeout
        self.on_change = on_change
        self.items: dict[tuple[str | None, str], dict] = {}
        self.resource_version = ""
        self._task: asyncio.Task | None = None

    @staticmethod
    def key(obj: dict) -> tuple[str | None, str]:
        meta = obj.get("metadata", {})
        return meta.get("namespace"), meta.get("name", "")

    def _notify(self, kind: str, obj: dict | None) -> None:
        if self.on_change:
            try:
                self.on_change(kind, obj)
            except Exception:  # a listener's bug must not stop the watch
                self.log.exception("gpupool: %s watch listener failed", self.name)

    async def relist(self) -> str:
        resp = await self.list_fn(_preload_content=False, **self.kwargs)
        data = json.loads(await resp.read())
        self.items = {self.key(o): o for o in data.get("items", [])}
        self.resource_version = str(data.get("metadata", {}).get("resourceVersion", ""))
        self._notify("SYNC", None)
        return self.resource_version

    async def start(self) -> None:
        await self.relist()
        self._task = asyncio.create_task(self._run(), name=f"gpupool-watch-{self.name}")

    async def _run(self) -> None:
        from kubernetes_asyncio import watch
        from kubernetes_asyncio.client.exceptions import ApiException

        delay = 0.5
        need_list = False
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                w = watch.Watch()
                async with w.stream(self.list_fn, resource_version=self.resource_version,
                                    timeout_seconds=self.timeout, allow_watch_bookmarks=True,
                                    _preload_content=False, **self.kwargs) as stream:
                    async for event in stream:
                        kind = event.get("type")
                        raw = event.get("raw_object") or {}
                        if kind == "ERROR":
                            code = raw.get("code")
                            raise ApiException(status=code, reason=raw.get("message", "watch error"))
                        rv = raw.get("metadata", {}).get("resourceVersion")
                        if rv:
                            self.resource_version = str(rv)
                        if kind == "BOOKMARK":
                            continue
                        key = self.key(raw)
                        if kind == "DELETED":
                            self.items.pop(key, None)
                        else:
                            self.items[key] = raw
                        self._notify(kind, raw)
                        delay = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - network errors, 410 Gone: list again
                status = getattr(e, "status", None)
                if status == 410:
                    self.log.info("gpupool: %s watch expired (410 Gone); listing again", self.name)
                else:
                    self.log.warning("gpupool: %s watch failed (%s); listing again in %.1fs", self.name, e, delay)
                    await asyncio.sleep(delay)
                    delay = min(30.0, delay * 2)
                need_list = True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None


# -- inventory ---------------------------------------------------------------------------------

def _int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def pod_gpus(pod: dict) -> int:
    """``nvidia.com/gpu`` of a pod (limits, else requests), init containers counted the way
    Kubernetes does (the larger of the largest init container and the sum of the others)."""
    def one(c: dict) -> int:
        res = c.get("resources") or {}
        return _int((res.get("limits") or {}).get(km.GPU_RESOURCE) or (res.get("requests") or {}).get(km.GPU_RESOURCE))
    spec = pod.get("spec", {})
    main = sum(one(c) for c in spec.get("containers", []) or [])
    init = max((one(c) for c in spec.get("initContainers", []) or []), default=0)
    return max(main, init)


def pod_requests(pod: dict) -> tuple[float, int]:
    cpu, mem = 0.0, 0
    for c in pod.get("spec", {}).get("containers", []) or []:
        req = (c.get("resources") or {}).get("requests") or {}
        try:
            cpu += parse_cpu(req["cpu"]) if "cpu" in req else 0.0
            mem += parse_bytes(req["memory"]) if "memory" in req else 0
        except ValueError:
            pass
    return cpu, mem


def is_managed(obj: dict) -> bool:
    return (obj.get("metadata", {}).get("labels") or {}).get(km.LABEL_MANAGED) == "true"


def node_ready(node: dict) -> bool:
    for cond in node.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


@dataclass
class Inventory:
    nodes: list[NodeSpec]
    reserved: dict[str, dict[str, float]] = field(default_factory=dict)  # node -> resource -> held by others
    gpu_uuids: dict[str, list[str]] = field(default_factory=dict)  # node -> UUID per GPU index
    why_unschedulable: dict[str, str] = field(default_factory=dict)  # node -> "cordoned" / "NotReady"


def build_inventory(nodes: list[dict], pods: list[dict], settings: GPUPoolKubernetes | None = None) -> Inventory:
    """The inventory from raw Node and Pod objects (pure; the watches feed it)."""
    s = settings or GPUPoolKubernetes()
    foreign_gpu: dict[str, int] = {}
    foreign_cpu: dict[str, float] = {}
    foreign_mem: dict[str, int] = {}
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        if not node or is_managed(pod) or pod.get("status", {}).get("phase") in TERMINAL:
            continue
        foreign_gpu[node] = foreign_gpu.get(node, 0) + pod_gpus(pod)
        c, m = pod_requests(pod)
        foreign_cpu[node] = foreign_cpu.get(node, 0.0) + c
        foreign_mem[node] = foreign_mem.get(node, 0) + m
    out = Inventory(nodes=[])
    for node in sorted(nodes, key=lambda n: n.get("metadata", {}).get("name", "")):
        meta, status = node.get("metadata", {}), node.get("status", {})
        name = meta.get("name", "")
        labels = dict(meta.get("labels") or {})
        alloc = status.get("allocatable") or {}
        cap = status.get("capacity") or {}
        total = _int(alloc.get(km.GPU_RESOURCE)) if km.GPU_RESOURCE in alloc else _int(cap.get(km.GPU_RESOURCE))
        if not total and km.GPU_RESOURCE not in alloc and km.GPU_RESOURCE not in cap:
            total = _int(labels.get("nvidia.com/gpu.count"))
        if s.gpu_nodes_only and total <= 0:
            continue
        used = foreign_gpu.get(name, 0)
        gpus = max(0, total - used)
        why = ""  # NotReady first: a failed node that is also cordoned has failed (service/nodes: fail over drain)
        if not node_ready(node):
            why = "NotReady"
        elif (node.get("spec") or {}).get("unschedulable"):
            why = "cordoned"
        if s.zone_label and s.zone_label in labels:
            labels["zone"] = labels[s.zone_label]
        if s.rack_label and s.rack_label in labels:
            labels["rack"] = labels[s.rack_label]
        cpu = memory = None
        if s.track_cpu_memory:
            try:
                if "cpu" in alloc:
                    cpu = max(0.0, parse_cpu(alloc["cpu"]) - foreign_cpu.get(name, 0.0))
                if "memory" in alloc:
                    memory = max(0, parse_bytes(alloc["memory"]) - foreign_mem.get(name, 0))
            except ValueError:
                cpu = memory = None
        mem_mib = _int(labels.get("nvidia.com/gpu.memory"))
        out.nodes.append(NodeSpec(name=name, gpus=gpus, gpu_memory=mem_mib * 2**20,
                                  gpu_model=labels.get("nvidia.com/gpu.product", ""), cpu=cpu, memory=memory,
                                  labels=labels, schedulable=not why,
                                  pool=(labels.get(s.pool_label) if s.pool_label else "") or DEFAULT_POOL))
        if why:
            out.why_unschedulable[name] = why
        res = {}
        if used:
            res["gpu"] = float(used)
        if foreign_cpu.get(name):
            res["cpu"] = foreign_cpu[name]
        if foreign_mem.get(name):
            res["memory"] = float(foreign_mem[name])
        if res:
            out.reserved[name] = res
        uuids = [u.strip() for u in ((meta.get("annotations") or {}).get(km.NODE_ANN_GPU_UUIDS) or "").split(",") if u.strip()]
        if uuids:
            out.gpu_uuids[name] = uuids
    return out


class KubeInventory:
    """Nodes and GPUs from the Kubernetes API, kept current by two watches (nodes; pods of all
    namespaces that have not ended). ``snapshot()`` is cheap; ``changed`` is set on every
    change that can alter it (wait on it to run a scheduling cycle at once)."""

    def __init__(self, settings: GPUPoolKubernetes, api_client: Any, log: Any = None):
        import logging

        self.settings = settings
        self.api_client = api_client
        self.log = log or logging.getLogger("gpupool.kubernetes")
        self.changed = asyncio.Event()
        self._nodes: ListWatch | None = None
        self._pods: ListWatch | None = None
        self._cache: Inventory | None = None

    def _on_change(self, kind: str, obj: dict | None) -> None:
        if kind in ("MODIFIED",) and obj is not None and obj.get("kind") == "Pod" and is_managed(obj):
            return  # gpupool's own pods do not change the inventory
        self._cache = None
        self.changed.set()

    async def start(self) -> None:
        from kubernetes_asyncio.client import CoreV1Api

        core = CoreV1Api(self.api_client)
        self._nodes = ListWatch("nodes", core.list_node, log=self.log, timeout=self.settings.watch_timeout,
                                on_change=self._on_change, label_selector=self.settings.node_selector)
        await self._nodes.start()
        if self.settings.count_foreign_pods:
            self._pods = ListWatch("pods", core.list_pod_for_all_namespaces, log=self.log,
                                   timeout=self.settings.watch_timeout, on_change=self._on_change,
                                   field_selector="status.phase!=Succeeded,status.phase!=Failed")
            await self._pods.start()

    async def stop(self) -> None:
        for w in (self._nodes, self._pods):
            if w is not None:
                await w.stop()

    def snapshot(self) -> Inventory:
        if self._cache is None:
            nodes = list(self._nodes.items.values()) if self._nodes else []
            pods = list(self._pods.items.values()) if self._pods else []
            self._cache = build_inventory(nodes, pods, self.settings)
        return self._cache

    def nodes(self) -> list[NodeSpec]:
        return self.snapshot().nodes

    def gpu_uuids(self) -> dict[str, list[str]]:
        return self.snapshot().gpu_uuids


# -- job backend -------------------------------------------------------------------------------

def _terminated(pod: dict) -> dict | None:
    for cs in pod.get("status", {}).get("containerStatuses", []) or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return term
    return None


def _waiting_error(pod: dict) -> str | None:
    for cs in pod.get("status", {}).get("containerStatuses", []) or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_ERRORS:
            return f"{waiting['reason']}: {waiting.get('message', '')}".strip(": ")
    return None


def _unschedulable(pod: dict) -> str | None:
    for cond in pod.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return cond.get("message") or cond.get("reason") or "not scheduled"
    return None


read_exit_code = P.read_exit  # the job protocol's exit file (written by the pod's runner)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "the pod ended without an exit status"
    if code == 0:
        return "the notebook ran to the end"
    if code in (137, -9):
        return "it was killed (SIGKILL) at the end of its grace period"
    if code in (143, -15):
        return "it was stopped by SIGTERM"
    return f"papermill exited with status {code}"


class KubeJobBackend(JobBackend):
    """Runs each attempt of a notebook job as a pod (see the module docstring)."""

    name = "kubernetes"

    def __init__(self, settings: Any = None, log: Any = None, kube: GPUPoolKubernetes | None = None):
        super().__init__(settings, log)
        pool = getattr(settings, "pool", None)
        self.kube = kube or load_settings(getattr(pool, "config", None), log=self.log)
        self.namespace = default_namespace(self.kube)
        self.api_client: Any = None
        self.core: Any = None
        self.inventory: KubeInventory | None = None
        self._jobs: ListWatch | None = None
        self._started = asyncio.Lock()
        self._stopping: set[str] = set()  # run ids asked to stop
        self._last: dict[str, dict] = {}  # run id -> last pod state seen
        self._pending_since: dict[str, float] = {}
        self._gone: set[str] = set()  # uids of pods the watch saw deleted
        self._final: dict[str, RunState] = {}  # run id -> how it ended (poll is idempotent)
        self._causes: dict[str, int] = {}  # gang run id -> the rank whose failure stops it
        self._gang_stop: dict[str, float] = {}  # gang run id -> when its workers were first deleted
        if self.kube.discovery not in ("kubernetes", "declared"):
            raise ValueError(f"c.GPUPoolKubernetes.discovery: {self.kube.discovery!r} is neither 'kubernetes' nor 'declared'")
        if self.kube.discovery == "kubernetes" and settings is not None and isinstance(getattr(settings, "nodes", None), list):
            # The service builds its node table right after creating the backend: fill it now.
            inv = discover(self.kube)
            settings.nodes[:] = inv.nodes
            if isinstance(getattr(settings, "gpu_uuids", None), dict):
                settings.gpu_uuids.clear()
                settings.gpu_uuids.update(inv.gpu_uuids)
            self.log.info("gpupool: %d nodes with %d GPUs from the Kubernetes API%s", len(inv.nodes),
                          sum(n.gpus for n in inv.nodes),
                          "".join(f"; {n} {why}" for n, why in sorted(inv.why_unschedulable.items())))

    # settings of the hub service (GPUPool) with safe defaults when used alone
    def _pool(self, name: str, default: Any) -> Any:
        return getattr(getattr(self.settings, "pool", None), name, default)

    async def start_watching(self) -> None:
        """Connect and start the watches (job pods; nodes and pods for the inventory when
        discovery is ``kubernetes``). Called lazily by every method; call it at service start to
        have the inventory ready before the first cycle."""
        async with self._started:
            if self.api_client is not None:
                return
            from kubernetes_asyncio.client import ApiClient, CoreV1Api

            cfg = await client_configuration(self.kube)
            self.api_client = ApiClient(configuration=cfg)
            self.core = CoreV1Api(self.api_client)
            self._jobs = ListWatch("job pods", self.core.list_namespaced_pod, log=self.log,
                                   timeout=self.kube.watch_timeout, on_change=self._on_pod,
                                   namespace=self.namespace,
                                   label_selector=f"{km.LABEL_MANAGED}=true,{km.LABEL_COMPONENT}=job")
            await self._jobs.start()
            if self.kube.discovery == "kubernetes":
                self.inventory = KubeInventory(self.kube, self.api_client, self.log)
                await self.inventory.start()

    def _on_pod(self, kind: str, pod: dict | None) -> None:
        if pod is None:
            return
        run = (pod.get("metadata", {}).get("annotations") or {}).get(f"{km.GROUP}/run-id")
        if run:
            self._last[run] = pod
            if kind == "DELETED":
                self._gone.add(pod.get("metadata", {}).get("uid"))

    # -- inventory for the service ---------------------------------------------------------------
    def nodes(self) -> list[NodeSpec] | None:
        """The current nodes, kept current by the watches (None when the inventory is declared,
        or before :meth:`start_watching`). The service's loop can take its node list from here
        each cycle and wait on ``self.inventory.changed`` to run a cycle when nodes change."""
        return self.inventory.nodes() if self.inventory else None

    def gpu_uuids(self) -> dict[str, list[str]] | None:
        """node -> GPU UUID per index, from the ``gpupool.io/gpu-uuids`` node annotations."""
        return self.inventory.gpu_uuids() if self.inventory else None

    def why_unschedulable(self) -> dict[str, str] | None:
        """node -> why nothing new goes there ("cordoned", "NotReady"), for the service's /nodes."""
        return dict(self.inventory.snapshot().why_unschedulable) if self.inventory else None

    async def node_conditions(self) -> dict[str, tuple[str, str]]:
        """A node that is NotReady has failed (its job pods are deleted at once and their jobs
        requeued from their last checkpoint); a cordoned one is drained (its jobs checkpoint within
        the grace period). Uncordoned or Ready again: back in service."""
        why = self.why_unschedulable() or {}
        return {node: ("fail" if w == "NotReady" else "drain", f"{w} in Kubernetes") for node, w in why.items()}

    def _node_info(self, node: str) -> tuple[list[str] | None, int]:
        if self.inventory is not None:
            inv = self.inventory.snapshot()
            spec = next((n for n in inv.nodes if n.name == node), None)
            return inv.gpu_uuids.get(node), (spec.gpu_memory if spec else 0)
        uuids = (getattr(self.settings, "gpu_uuids", None) or {}).get(node)
        spec = next((n for n in (getattr(self.settings, "nodes", None) or []) if n.name == node), None)
        return uuids, (spec.gpu_memory if spec else 0)

    async def _user_image(self, user: str) -> str | None:
        if not self.kube.image_from_workspace:
            return None
        try:
            resp = await self.core.list_namespaced_pod(
                self.namespace, label_selector="component=singleuser-server",
                _preload_content=False, _request_timeout=self.kube.request_timeout)
            pods = json.loads(await resp.read()).get("items", [])
        except Exception as e:  # noqa: BLE001 - fall back to the default image
            self.log.warning("gpupool: could not look up %s's notebook server image: %s", user, e)
            return None
        for pod in pods:  # KubeSpawner keeps the exact user name in an annotation (the label is a slug)
            meta = pod.get("metadata", {})
            if meta.get("deletionTimestamp") or (meta.get("annotations") or {}).get("hub.jupyter.org/username") != user:
                continue
            for c in pod.get("spec", {}).get("containers", []) or []:
                if c.get("name") == "notebook" and c.get("image"):
                    return c["image"]
        return None

    def _home_claim(self, user: str) -> str | None:
        if not self.kube.home_claim:
            return None
        try:
            from kubespawner.slugs import safe_slug

            slug = safe_slug(user, max_length=48)  # what KubeSpawner 7 puts in {username}
        except Exception:  # noqa: BLE001 - kubespawner missing: a DNS-safe name
            slug = km.dns_name(user.lower())
        return self.kube.home_claim.format(username=slug, user=slug)

    def pod_spec(self, spec: JobSpec, image: str, rank: int = 0, rendezvous: dict | None = None,
                 service: str = "") -> km.JobPodSpec:
        """The pod description for ``spec`` (worker ``rank`` of a distributed job, with its
        ``rendezvous`` variables and headless ``service``); pure apart from settings and the inventory."""
        if spec.placements:
            placement = decode_allocation(spec.placements[rank:rank + 1])[0]
        else:
            placement = PodPlacement(pod=0, node="", gpus=())
        uuids, gpu_memory = self._node_info(placement.node)
        job_root = os.path.dirname(spec.job_dir.rstrip("/"))
        env = dict(spec.env)
        if rank < len(spec.worker_env):
            env.update(spec.worker_env[rank])
        env.update(rendezvous or {})
        env.setdefault("JUPYTERHUB_USER", spec.user)
        if self.kube.api_url:
            env[P.Env.API_URL] = self.kube.api_url
        memory = spec.memory or (parse_bytes(self.kube.memory) if self.kube.memory else 0)
        pod = km.JobPodSpec(
            job_id=spec.job_id, run_id=worker_run_id(spec.run_id, rank), user=spec.user, queue=spec.queue,
            kind=spec.kind or TRAIN, image=image, placement=placement, rank=rank, command=spec.command,
            gang=spec.run_id if spec.pods > 1 else "", subdomain=service,
            notebook=spec.notebook, output=spec.worker_output(rank), log=spec.worker_log(rank), job_dir=spec.job_dir,
            checkpoint_dir=spec.checkpoint_dir, stop_file=spec.stop_file, namespace=self.namespace,
            attempt=spec.attempt, parameters=dict(spec.parameters or {}), env=env, gpu_uuids=uuids,
            gpu_memory=gpu_memory, cpu=float(spec.cpu or self.kube.cpu), memory=int(memory),
            home_claim=self._home_claim(spec.user), home_mount=self.kube.home_mount,
            jobs_claim=self.kube.jobs_claim or None, jobs_mount=self.kube.jobs_mount or job_root,
            grace_seconds=float(self._pool("preemption_grace", 30.0)), kill_after=float(self._pool("kill_after", 5.0)),
            kernel_name=self.kube.kernel_name, service_account=self.kube.service_account or None,
            runtime_class=self.kube.runtime_class or None, priority_class=self.kube.priority_class or None,
            image_pull_policy=self.kube.image_pull_policy or None, image_pull_secrets=list(self.kube.image_pull_secrets),
            run_as_uid=self.kube.run_as_uid, run_as_gid=self.kube.run_as_gid, fs_gid=self.kube.fs_gid,
            node_selector=dict(self.kube.extra_node_selector), tolerations=list(self.kube.tolerations),
            extra_labels=dict(self.kube.extra_labels), extra_annotations=dict(self.kube.extra_annotations),
            python=self.kube.python)
        if spec.endpoint:  # a replica of an endpoint (docs/endpoints.md)
            pod.endpoint, pod.endpoint_port = spec.run_id, int(self._pool("endpoint_port", 8000))
            pod.max_restarts = int(spec.max_restarts)
            pod.restarts_file = spec.files.restarts_file(spec.attempt, rank)
        return pod

    def _handle(self, pod: dict) -> dict:
        meta = pod.get("metadata", {})
        ann = meta.get("annotations") or {}
        placed = km.placement_from_json(ann.get(km.ANN_PLACEMENT))
        return {"namespace": meta.get("namespace", self.namespace), "pod": meta.get("name"), "uid": meta.get("uid"),
                "run_id": ann.get(f"{km.GROUP}/run-id"), "job_id": ann.get(km.ANN_JOB),
                "node": placed[0].node if placed else "",
                "started": time.time()}

    async def start(self, spec: JobSpec) -> dict:
        """Create the run's pod, or every worker's pod and the headless Service of a distributed
        run (all or none: a pod that cannot be created takes the others down with it)."""
        await self.start_watching()
        image = await self._user_image(spec.user) or self.kube.image or os.environ.get("GPUPOOL_JOB_IMAGE", "")
        if not image:
            raise RuntimeError("no image for the job's pod: the user has no running notebook server and "
                               "c.GPUPoolKubernetes.image (or $GPUPOOL_JOB_IMAGE) is not set")
        for path in (spec.checkpoint_dir, os.path.dirname(spec.stop_file)):
            try:
                os.makedirs(path, exist_ok=True)
            except OSError:
                pass
        pods = max(1, int(spec.pods or 1))
        for stale in [spec.stop_file] + [km.exit_file(spec.job_dir, spec.attempt, r) for r in range(pods)]:
            try:
                os.unlink(stale)
            except OSError:
                pass
        if spec.endpoint:
            return await self._start_endpoint(spec, image, pods)
        if pods == 1:
            return (await self._start_worker(spec, self.pod_spec(spec, image)))[0]
        from ..distributed import worker_env

        service = km.gang_service_name(spec.run_id)
        port = self.kube.rendezvous_port
        master = self.kube.rendezvous_host.format(pod=km.job_pod_name(spec.run_id), service=service,
                                                  namespace=self.namespace)
        handles: list[dict] = []
        try:
            for rank in range(pods):
                env = worker_env(spec.placements, rank, master, port)
                handle, raw = await self._start_worker(spec, self.pod_spec(spec, image, rank, env, service))
                handles.append(handle)
                if rank == 0:
                    await self._create(self.core.create_namespaced_service, km.gang_service_manifest(raw, spec.run_id, port),
                                       "the job's headless Service")
        except BaseException:
            for h in handles:
                await self._delete(h.get("pod"), 0)
            raise
        handle = dict(handles[0])
        handle["workers"] = handles[1:]
        return handle

    async def _start_endpoint(self, spec: JobSpec, image: str, pods: int) -> dict:
        """Every replica's pod and the Service in front of them (all or none); the handle's
        ``targets`` is the Service, which the gpupool service proxies to."""
        port = int(self._pool("endpoint_port", 8000))
        handles: list[dict] = []
        try:
            for rank in range(pods):
                handle, raw = await self._start_worker(spec, self.pod_spec(spec, image, rank))
                handles.append(handle)
                if rank == 0:
                    await self._create(self.core.create_namespaced_service,
                                       km.endpoint_service_manifest(raw, spec.run_id, port), "the endpoint's Service")
        except BaseException:
            for h in handles:
                await self._delete(h.get("pod"), 0)
            raise
        handle = dict(handles[0])
        if pods > 1:
            handle["workers"] = handles[1:]
        handle["targets"] = [f"http://{km.endpoint_service_name(spec.run_id)}.{self.namespace}.svc:{port}"]
        return handle

    async def _create(self, fn: Any, manifest: dict, what: str) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            await fn(self.namespace, manifest, _request_timeout=self.kube.request_timeout)
        except ApiException as e:
            if e.status != 409:  # 409: a retry after a lost reply
                raise RuntimeError(f"Kubernetes refused {what}: {_api_message(e)}") from None

    async def _start_worker(self, spec: JobSpec, pod_spec: km.JobPodSpec) -> tuple[dict, dict]:
        """Create one pod (and the Secret with its credentials); its handle and the created pod."""
        from kubernetes_asyncio.client.exceptions import ApiException

        run_id = pod_spec.run_id
        manifest = km.job_pod_manifest(pod_spec)
        try:
            pod = await self.core.create_namespaced_pod(self.namespace, manifest, _preload_content=False,
                                                        _request_timeout=self.kube.request_timeout)
            raw = json.loads(await pod.read())
        except ApiException as e:
            if e.status == 409:  # a retry after a lost reply: the pod of this run exists already
                raw = await self._read_pod(manifest["metadata"]["name"])
                if raw is None:
                    raise RuntimeError(f"pod {manifest['metadata']['name']} exists and vanished; try again") from None
            else:
                raise RuntimeError(f"Kubernetes refused the job's pod: {_api_message(e)}") from None
        secret = {k: str(spec.env[k]) for k in km.SECRET_ENV if k in spec.env}
        if secret:  # the pod waits (CreateContainerConfigError) until its Secret exists
            try:
                await self._create(self.core.create_namespaced_secret, km.job_secret_manifest(raw, secret),
                                   "the job's Secret")
            except RuntimeError:
                await self._delete(raw["metadata"]["name"], 0)
                raise
        self._last[run_id] = raw
        self._stopping.discard(run_id)
        self._final.pop(run_id, None)
        handle = self._handle(raw)
        handle["run_id"] = run_id
        handle["exit_file"] = km.exit_file(spec.job_dir, spec.attempt, pod_spec.rank)
        handle["log"] = pod_spec.log
        return handle, raw

    async def _read_pod(self, name: str) -> dict | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            resp = await self.core.read_namespaced_pod(name, self.namespace, _preload_content=False,
                                                       _request_timeout=self.kube.request_timeout)
            return json.loads(await resp.read())
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def _current(self, handle: dict) -> dict | None:
        """The run's pod as the watch last saw it; None when it is gone. A pod the watch has not
        shown yet (just created) or lost track of (a relist in between) is read from the API."""
        uid = handle.get("uid")
        pod = self._jobs.items.get((handle.get("namespace", self.namespace), handle.get("pod"))) if self._jobs else None
        if pod is not None and (not uid or pod.get("metadata", {}).get("uid") == uid):
            return pod
        if uid and uid in self._gone:
            return None
        pod = await self._read_pod(handle.get("pod"))
        if pod is not None and uid and pod.get("metadata", {}).get("uid") != uid:
            return None  # a different pod of the same name
        return pod

    def _state_of(self, handle: dict, pod: dict | None) -> RunState:
        run_id = handle.get("run_id", "")
        if pod is None:
            last = self._last.get(run_id)
            term = _terminated(last) if last else None
            code = term.get("exitCode") if term else read_exit_code(handle.get("exit_file", ""))
            if code is not None:
                return RunState(EXITED, int(code), describe_exit(int(code)))
            if run_id in self._stopping:
                return RunState(EXITED, None, "its pod was deleted when it was asked to stop")
            return RunState(LOST, None, f"its pod {handle.get('pod')} is gone (deleted outside gpupool, or its node failed)")
        status = pod.get("status", {})
        phase = status.get("phase", "Pending")
        if phase in TERMINAL:
            if status.get("reason") in ("Evicted", "Preempting", "NodeLost", "Shutdown", "NodeShutdown", "Terminated"):
                return RunState(LOST, None, f"Kubernetes stopped its pod ({status.get('reason')}: {status.get('message', '')})".rstrip(": )") + ")")
            term = _terminated(pod) or {}
            code = term.get("exitCode", 0 if phase == "Succeeded" else None)
            detail = describe_exit(code)
            if term.get("reason") == "OOMKilled":
                detail = "it ran out of memory (OOMKilled): ask for more memory"
            return RunState(EXITED, code, detail)
        if phase == "Pending" and not pod.get("metadata", {}).get("deletionTimestamp"):
            now = time.monotonic()
            since = self._pending_since.setdefault(run_id, now)
            err = _waiting_error(pod)
            if err and now - since > self.kube.pending_timeout:
                return RunState(EXITED, None, f"its container could not start: {err}")
            why = _unschedulable(pod)
            if why and now - since > self.kube.pending_timeout:
                return RunState(LOST, None, f"Kubernetes could not place its pod on {handle.get('node') or 'its node'}: {why}")
            return RunState(RUNNING, None, f"waiting: {err or why}" if (err or why) else "its pod is starting")
        self._pending_since.pop(run_id, None)
        return RunState(RUNNING)

    async def poll(self, handle: dict) -> RunState:
        await self.start_watching()
        if "workers" not in handle:
            return await self._poll_worker(handle)
        workers = [handle, *handle["workers"]]
        run_id = handle.get("run_id", "")
        state, cause = gang_state([await self._poll_worker(h) for h in workers], self._causes.get(run_id))
        if cause is None:
            return state
        self._causes[run_id] = cause
        if state.state == RUNNING:  # one worker failed: the gang stops as a unit (grace, then at once)
            first = self._gang_stop.setdefault(run_id, time.monotonic())
            grace = 0 if time.monotonic() - first >= float(self._pool("kill_after", 5.0)) else float(self._pool("kill_after", 5.0))
            for h in workers:
                if h.get("run_id") not in self._final:
                    self._stopping.add(h.get("run_id", ""))
                    await self._delete(h.get("pod"), grace)
        else:
            self._causes.pop(run_id, None)
            self._gang_stop.pop(run_id, None)
        return state

    async def _poll_worker(self, handle: dict) -> RunState:
        run_id = handle.get("run_id", "")
        if run_id in self._final:  # an ended run stays ended, whatever happens to its pod afterwards
            return self._final[run_id]
        pod = await self._current(handle)
        state = self._state_of(handle, pod)
        if state.state != RUNNING:  # recorded before the clean-up below, which may fail
            self._final[run_id] = state
        if state.state == EXITED and pod is not None:
            if state.exit_code != 0:
                state = await self._keep_container_log(handle, state)
            if self.kube.delete_finished_pods:
                await self._delete(handle.get("pod"), 0)
        elif state.state == LOST and pod is not None:
            # given up on (e.g. unschedulable too long): the job is requeued, so this pod must not
            # start later and run the same attempt twice
            await self._delete(handle.get("pod"), 0)
        if state.state != RUNNING:
            self._final[run_id] = state
        return state

    async def _keep_container_log(self, handle: dict, state: RunState) -> RunState:
        """A pod that failed before the job's log was written (the image lacks gpupool or
        papermill, a bad command): copy the container's log into the job's log, so the user sees
        why, and name its last line in the reason."""
        path = handle.get("log")
        try:
            if not path or (os.path.exists(path) and os.path.getsize(path) > 0):
                return state
            text = await self.pod_log(handle)
        except Exception as e:  # noqa: BLE001 - the log is a courtesy; the state stands
            self.log.info("gpupool: no container log for %s: %s", handle.get("pod"), e)
            return state
        if not text.strip():
            return state
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a") as f:
                f.write(f"gpupool: the job's container ({handle.get('pod')}) failed before papermill's log "
                        f"started; its output:\n{text}")
        except OSError:
            pass
        last = text.strip().splitlines()[-1][:200]
        return RunState(state.state, state.exit_code, f"{state.detail}: {last}")

    async def _delete(self, name: str | None, grace: float) -> bool:
        from kubernetes_asyncio.client.exceptions import ApiException

        if not name:
            return False
        try:
            await self.core.delete_namespaced_pod(name, self.namespace, body=km.delete_options(int(math.ceil(grace))),
                                                  _request_timeout=self.kube.request_timeout)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise RuntimeError(f"could not delete pod {name}: {_api_message(e)}") from None

    async def request_checkpoint(self, handle: dict, spec: JobSpec, reason: str = "") -> None:
        """Write the stop request into the job's directory (the shared volume) and delete the
        pod with a grace period of preemption_grace + kill_after: the container gets SIGTERM now
        (the entrypoint writes the stop request too, in case the volume is not shared with the
        service), SIGTERM reaches the notebook after preemption_grace, SIGKILL after both."""
        await self.start_watching()
        try:
            P.write_stop(spec.stop_file, reason)
        except OSError as e:
            self.log.info("gpupool: stop file %s not written here (%s); the pod writes it on SIGTERM", spec.stop_file, e)
        grace = float(self._pool("preemption_grace", 30.0)) + float(self._pool("kill_after", 5.0))
        for h in [handle, *handle.get("workers", [])]:  # every worker of a distributed run
            self._stopping.add(h.get("run_id", ""))
            await self._delete(h.get("pod"), grace)

    async def terminate(self, handle: dict, force: bool = False) -> None:
        """Delete the pod: with ``kill_after`` seconds of grace (a second delete shortens a
        running grace period), or at once with ``force``."""
        await self.start_watching()
        for h in [handle, *handle.get("workers", [])]:
            self._stopping.add(h.get("run_id", ""))
            await self._delete(h.get("pod"), 0 if force else float(self._pool("kill_after", 5.0)))

    async def list_runs(self) -> list[dict]:
        """Handles of every gpupool job pod in the namespace (for orphans the database lacks)."""
        await self.start_watching()
        return [self._handle(p) for p in (self._jobs.items.values() if self._jobs else [])]

    async def adopt(self, spec: JobSpec, handle: dict | None) -> tuple[dict | None, RunState]:
        """Find the run's pod by its ``gpupool.io/run-id`` label (the handle may be missing)."""
        await self.start_watching()
        assert self._jobs is not None
        await self._jobs.relist()
        pods = max(1, int(spec.pods or 1))
        found = [self._adopt_worker(spec, rank, handle) for rank in range(pods)]
        if pods == 1:
            return found[0]
        new = dict(found[0][0])
        new["workers"] = [h for h, _ in found[1:]]
        state, cause = gang_state([st for _, st in found])
        if cause is not None and state.state == RUNNING:
            return new, await self.poll(new)  # a worker ended while the service was down: stop the others
        return new, state

    def _adopt_worker(self, spec: JobSpec, rank: int, handle: dict | None) -> tuple[dict, RunState]:
        run_id = worker_run_id(spec.run_id, rank)
        found = [p for p in self._jobs.items.values()
                 if (p.get("metadata", {}).get("annotations") or {}).get(f"{km.GROUP}/run-id") == run_id]
        exit_path = km.exit_file(spec.job_dir, spec.attempt, rank)
        if found:
            new = self._handle(found[0])
            new["run_id"] = run_id
            new["exit_file"] = exit_path
            self._last[run_id] = found[0]
            return new, self._state_of(new, found[0])
        old = next((h for h in ([handle, *handle.get("workers", [])] if handle else []) if h.get("run_id") == run_id),
                   None) or {"run_id": run_id, "exit_file": exit_path, "pod": km.job_pod_name(run_id)}
        code = read_exit_code(exit_path)
        if code is not None:
            return old, RunState(EXITED, code, describe_exit(code))
        return old, RunState(LOST, None, "its pod was gone when the gpupool service restarted")

    async def pod_log(self, handle: dict, limit_bytes: int = 65536) -> str:
        """The container's log from the API (``kubectl logs``): useful when the pod failed
        before the job's log file was written (e.g. the image lacks gpupool)."""
        from kubernetes_asyncio.client.exceptions import ApiException

        await self.start_watching()
        try:
            return await self.core.read_namespaced_pod_log(handle.get("pod"), self.namespace, limit_bytes=limit_bytes,
                                                           _request_timeout=self.kube.request_timeout)
        except ApiException as e:
            if e.status == 404:
                return ""
            raise

    async def close(self) -> None:
        for w in (self._jobs,):
            if w is not None:
                await w.stop()
        if self.inventory is not None:
            await self.inventory.stop()
        if self.api_client is not None:
            await self.api_client.close()
        self.api_client = None


def _api_message(e: Any) -> str:
    try:
        return json.loads(e.body).get("message") or str(e.reason)
    except Exception:  # noqa: BLE001
        return f"{getattr(e, 'status', '')} {getattr(e, 'reason', '')}".strip()
