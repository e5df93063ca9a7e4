"""Kubernetes manifests for gpupool: pure functions, no API calls.

Used by the Kubernetes job backend (:mod:`gpupool.backends.kubernetes`) and the Kubernetes
spawner (:mod:`gpupool.spawner.kube`), so the two place pods the same way:

* every pod of gpupool carries the labels ``gpupool.io/managed=true``, ``gpupool.io/job-id``,
  ``gpupool.io/queue``, ``gpupool.io/user`` (label-safe values) and the raw values plus the
  placement as annotations, so the service can find and adopt its pods after a restart
  (``kubectl get pods -l gpupool.io/managed=true``);
* it is pinned to the node the scheduler chose with a *required node affinity on the node's name*
  (``matchFields metadata.name``): the kube-scheduler still checks taints and resources, it just
  has one node to choose from;
* whole GPUs are requested as ``nvidia.com/gpu`` limits (the NVIDIA device plugin picks the
  devices and isolates them);
* a fraction of a GPU requests no ``nvidia.com/gpu``; the container is given the chosen GPU
  through ``NVIDIA_VISIBLE_DEVICES`` (its UUID when the inventory knows it, else its index) and
  the share and memory cap through the environment (see :func:`gpupool.protocol.gpu_env` and
  docs/kubernetes.md for what this does and does not isolate).

``python -m gpupool.backends.kube_manifests run-job`` is the entrypoint of a job pod: it runs
papermill through the local backend's runner and turns the container's SIGTERM (pod deletion with
a grace period) into gpupool's stop request (``gpupool.checkpoint.should_stop()`` turns True),
then SIGTERM to the notebook once the preemption grace is over.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from .. import protocol as P
from ..contract import TRAIN, decode_allocation, encode_allocation
from ..protocol import Env
from ..scheduler.model import PodPlacement
from .base import program_argv

GROUP = "gpupool.io"
LABEL_MANAGED = f"{GROUP}/managed"
LABEL_JOB = f"{GROUP}/job-id"
LABEL_QUEUE = f"{GROUP}/queue"
LABEL_USER = f"{GROUP}/user"
LABEL_KIND = f"{GROUP}/kind"
LABEL_COMPONENT = f"{GROUP}/component"
ANN_JOB = f"{GROUP}/job-id"
ANN_USER = f"{GROUP}/user"
ANN_QUEUE = f"{GROUP}/queue"
ANN_PLACEMENT = f"{GROUP}/placement"
ANN_ATTEMPT = f"{GROUP}/attempt"
ANN_GPU_IDS = f"{GROUP}/gpu-ids"
# KAI-Scheduler's GPU-sharing annotations (pkg/common/constants): a fractional pod's share as
# ``gpu-memory`` (MiB) when its cap is known, else ``gpu-fraction`` (KAI refuses both on one pod),
# and the container that holds it (``gpu-fraction-container-name``)
KAI_GPU_FRACTION = "gpu-fraction"
KAI_GPU_MEMORY = "gpu-memory"
KAI_CONTAINER = "gpu-fraction-container-name"
# Optional node annotation: the node's GPU UUIDs in index order, comma-separated
# (kubectl annotate node N gpupool.io/gpu-uuids=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | paste -sd,))
NODE_ANN_GPU_UUIDS = f"{GROUP}/gpu-uuids"

GPU_RESOURCE = "nvidia.com/gpu"
HOSTNAME_LABEL = "kubernetes.io/hostname"

_LABEL_OK = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_OK = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _digest(value: str, n: int = 8) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:n]


def label_value(value: str) -> str:
    """A valid label value (<= 63 chars of ``[A-Za-z0-9_.-]``, alphanumeric at both ends) for
    any string. Valid values are kept as they are; others are cleaned and get a short hash
    suffix so that two different names never map to the same label."""
    value = str(value)
    if len(value) <= 63 and _LABEL_OK.match(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value).strip("-_.")
    return f"{cleaned[:54].strip('-_.')}-{_digest(value)}".strip("-")


def dns_name(value: str, max_len: int = 63) -> str:
    """A DNS-1123 label (lowercase alphanumerics and '-') for any string, hash-suffixed when
    the string had to be changed or shortened."""
    value = str(value)
    if len(value) <= max_len and _DNS_OK.match(value):
        return value
    cleaned = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")
    return f"{cleaned[:max_len - 9].strip('-')}-{_digest(value)}".strip("-")


def gpupool_labels(*, job_id: str, user: str, queue: str, kind: str, component: str = "job") -> dict[str, str]:
    labels = {
        LABEL_MANAGED: "true",
        LABEL_JOB: label_value(job_id),
        LABEL_QUEUE: label_value(queue),
        LABEL_USER: label_value(user),
        LABEL_KIND: label_value(kind),
        LABEL_COMPONENT: component,
    }
    return {k: v for k, v in labels.items() if v}  # an unknown queue/kind is left out, not ""


def selector(labels: dict[str, str]) -> str:
    """A label selector string from a mapping: ``a=b,c=d``."""
    return ",".join(f"{k}={v}" for k, v in labels.items())


def placement_to_json(placements: Sequence[PodPlacement]) -> str:
    """The placement annotation: the contract's stored allocation as compact JSON."""
    return json.dumps(encode_allocation(placements), separators=(",", ":"))


def placement_from_json(text: str | None) -> tuple[PodPlacement, ...]:
    """Inverse of :func:`placement_to_json`; an empty tuple for a missing or broken value."""
    if not text:
        return ()
    try:
        return decode_allocation(json.loads(text))
    except (ValueError, TypeError, KeyError, AttributeError):
        return ()


def gpupool_annotations(*, job_id: str, user: str, queue: str, placements: Sequence[PodPlacement],
                        attempt: int = 0, gpu_ids: Sequence[str] = ()) -> dict[str, str]:
    ann = {ANN_JOB: str(job_id), ANN_USER: str(user), ANN_PLACEMENT: placement_to_json(placements),
           ANN_ATTEMPT: str(int(attempt))}
    if queue:
        ann[ANN_QUEUE] = str(queue)
    if gpu_ids:
        ann[ANN_GPU_IDS] = ",".join(gpu_ids)
    return ann


def kai_annotations(placement: PodPlacement, memory: int, container: str) -> dict[str, str]:
    """KAI-Scheduler's per-container annotations of a fractional pod (none for whole GPUs): its
    memory cap in MiB (``memory`` bytes), else its fraction, and the container that holds it. A
    KAI or Run:ai installation that enforces GPU memory reads them; gpupool's own placement
    annotation stays the one it reads back."""
    if not placement.gpus or placement.fraction >= 1.0:
        return {}
    share = {KAI_GPU_MEMORY: str(max(1, int(memory) // 2**20))} if memory else {KAI_GPU_FRACTION: f"{placement.fraction:g}"}
    return {**share, KAI_CONTAINER: container}


def node_affinity(node: str) -> dict[str, Any]:
    """Required node affinity on the node's name (exact, unlike the hostname label, which may
    differ from the node name on some clouds)."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [node_selector_term(node)]}}}


def node_selector_term(node: str) -> dict[str, Any]:
    """One ``nodeSelectorTerm`` matching exactly the node named ``node`` (KubeSpawner's
    ``node_affinity_required`` takes a list of these)."""
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}


def gpu_tolerations() -> list[dict[str, Any]]:
    """GPU nodes are often tainted ``nvidia.com/gpu:NoSchedule``. The device plugin's admission
    adds the toleration only to pods that request ``nvidia.com/gpu``; fractional pods request
    none, so gpupool adds it to all of its GPU pods."""
    return [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]


def gpu_limits(placement: PodPlacement) -> dict[str, str]:
    """``{"nvidia.com/gpu": "N"}`` for whole GPUs; ``{}`` for a fraction (or CPU-only)."""
    if not placement.gpus or placement.fraction < 1.0:
        return {}
    return {GPU_RESOURCE: str(len(placement.gpus))}


def gpu_ids_for(placement: PodPlacement, uuids: Sequence[str] | None) -> list[str]:
    """The device ids for ``NVIDIA_VISIBLE_DEVICES``: UUIDs when known, else the indices."""
    return P.device_ids(placement.gpus, uuids)


def gpu_env(placement: PodPlacement, uuids: Sequence[str] | None = None, gpu_memory: int = 0,
            memory: int = 0) -> dict[str, str]:
    """The GPU part of a pod's environment for ``placement`` (``gpu_memory``: the memory of one of
    the node's GPUs, 0 unknown): :func:`gpupool.protocol.gpu_env` for a container. Whole GPUs are
    named only by where they are (the device plugin picks and isolates the devices); a fraction
    names its GPU in ``NVIDIA_VISIBLE_DEVICES`` and its share and memory cap in the environment,
    the way Run:ai / KAI share a GPU without MIG; a CPU-only pod gets
    ``NVIDIA_VISIBLE_DEVICES=void``. ``memory``: the fraction's cap when known (else its share
    of ``gpu_memory``)."""
    memory = memory or P.memory_limit(placement.fraction, gpu_memory)
    return P.gpu_env(placement, uuids=uuids, memory=memory, total=gpu_memory, container=True)


def env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": str(k), "value": str(v)} for k, v in env.items()]


@dataclass
class JobPodSpec:
    """Everything one job pod needs. The paths (``notebook``, ``output``, ``log``, ``job_dir``,
    ``checkpoint_dir``, ``stop_file``) are the service's paths under its job root; the pod mounts
    the shared jobs volume (``jobs_claim``) at ``jobs_mount`` (the service's job root) so the same
    paths work in both. ``home_claim`` is the user's PVC (z2jh names it ``claim-{username}``),
    mounted at ``home_mount``, the notebook's working directory."""

    job_id: str
    run_id: str
    user: str
    queue: str
    image: str
    placement: PodPlacement
    notebook: str
    output: str
    log: str
    job_dir: str
    checkpoint_dir: str
    stop_file: str
    namespace: str = "default"
    kind: str = TRAIN
    attempt: int = 0
    parameters: dict = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    gpu_uuids: Sequence[str] | None = None
    gpu_memory: int = 0
    cpu: float = 0.0
    memory: int = 0
    home_claim: str | None = None
    home_mount: str = "/home/jovyan"
    jobs_claim: str | None = None
    jobs_mount: str = "/srv/gpupool/jobs"
    grace_seconds: float = 30.0  # the preemption grace: stop file first, SIGTERM after it
    kill_after: float = 5.0  # SIGTERM -> SIGKILL
    kernel_name: str = ""
    service_account: str | None = None
    runtime_class: str | None = None
    priority_class: str | None = None
    image_pull_policy: str | None = None
    image_pull_secrets: Sequence[str] = ()
    run_as_uid: int | None = None
    run_as_gid: int | None = None
    fs_gid: int | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    extra_labels: dict[str, str] = field(default_factory=dict)
    extra_annotations: dict[str, str] = field(default_factory=dict)
    python: str = "python3"
    # a distributed job: this pod is worker ``rank`` (``run_id``, ``log`` and ``output`` are that
    # worker's); ``gang`` labels every pod of the run (the headless Service selects them) and
    # ``subdomain`` is that Service, so the pod is reachable as <pod name>.<subdomain>
    rank: int = 0
    gang: str = ""
    subdomain: str = ""
    command: list[str] | None = None  # a script/command job's argv (None: papermill on ``notebook``)
    # an endpoint (kind inference): the run id its replicas share (the Service selects them by it), the
    # port its server listens on ($PORT), how often the runner restarts a crashed server and where it counts
    endpoint: str = ""
    endpoint_port: int = 0
    max_restarts: int = 0
    restarts_file: str = ""


LABEL_RUN = f"{GROUP}/run-id"
# Credentials in a job's environment go into a Secret owned by the pod, not into the pod spec
SECRET_ENV = (*Env.SECRETS, "JUPYTERHUB_API_TOKEN")
# Environment variables describing the service's own machine that make no sense in a pod
HOST_ONLY_ENV = (*P.GPU_VISIBILITY, "HOME", "PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH")


def job_pod_name(run_id: str) -> str:
    """``gpupool-j-000042-3`` for run ``j-000042.3``."""
    return dns_name(f"gpupool-{run_id}".lower().replace(".", "-"))


def exit_file(job_dir: str, attempt: int, rank: int = 0) -> str:
    """Where the run (worker ``rank``) writes its exit status (the job directory's layout)."""
    return P.JobDir(job_dir.rstrip("/")).exit_file(attempt, rank)


LABEL_GANG = f"{GROUP}/gang"
LABEL_ENDPOINT = f"{GROUP}/endpoint"
LABEL_RANK = f"{GROUP}/rank"


def gang_service_name(run_id: str) -> str:
    """The headless Service of a distributed run (``gpupool-j-000042-3-...``)."""
    return job_pod_name(run_id)


def _owned_service(pod: dict[str, Any], name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A Service owned by ``pod`` (created, so with its uid: Kubernetes deletes it with that pod),
    labelled as the pod but for its rank and run."""
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace", "default"),
            "labels": {k: v for k, v in meta.get("labels", {}).items() if k.startswith(GROUP) and k != LABEL_RANK
                       and k != LABEL_RUN},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                                 "blockOwnerDeletion": False}],
        },
        "spec": spec,
    }


def gang_service_manifest(pod: dict[str, Any], run_id: str, port: int) -> dict[str, Any]:
    """The headless Service that gives every worker pod of a run a DNS name
    (``<pod>.<service>.<namespace>.svc``) for the rendezvous; owned by rank 0's pod. It publishes
    pods before they are ready: the workers must find rank 0 while they start."""
    return _owned_service(pod, gang_service_name(run_id), {
        "clusterIP": "None", "publishNotReadyAddresses": True,
        "selector": {LABEL_GANG: pod["metadata"]["labels"][LABEL_GANG]},
        "ports": [{"name": "rendezvous", "port": int(port), "targetPort": int(port), "protocol": "TCP"}]})


def endpoint_service_name(run_id: str) -> str:
    """The Service in front of an endpoint's replicas (``gpupool-j-000042-3-...-http``)."""
    return dns_name(f"{job_pod_name(run_id)[:57]}-http")


def endpoint_service_manifest(pod: dict[str, Any], run_id: str, port: int) -> dict[str, Any]:
    """The ClusterIP Service in front of every replica of an endpoint's run (selected by the
    endpoint label; only ready pods, those whose readiness probe answers, get requests). Owned by
    rank 0's pod. The gpupool service proxies to it."""
    return _owned_service(pod, endpoint_service_name(run_id), {
        "type": "ClusterIP", "selector": {LABEL_ENDPOINT: label_value(run_id)},
        "ports": [{"name": "http", "port": int(port), "targetPort": int(port), "protocol": "TCP"}]})


def job_secret_name(run_id: str) -> str:
    return dns_name(f"gpupool-{run_id}-env".lower().replace(".", "-"))


def job_secret_manifest(pod: dict[str, Any], values: dict[str, str]) -> dict[str, Any]:
    """The Secret holding a job pod's credentials, owned by the pod (Kubernetes deletes it with
    the pod). ``pod`` is the created pod (its uid is needed)."""
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": job_secret_name(meta["annotations"][f"{GROUP}/run-id"]),
            "namespace": meta.get("namespace", "default"),
            "labels": {k: v for k, v in meta.get("labels", {}).items() if k.startswith(GROUP)},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                                 "blockOwnerDeletion": False}],
        },
        "stringData": {k: str(v) for k, v in values.items()},
    }


def _quantity_cpu(cpu: float) -> str:
    return f"{int(round(cpu * 1000))}m"


def papermill_command(spec: JobPodSpec) -> list[str]:
    """What the pod runs: papermill on the notebook (writing this worker's output), or the job's
    script / command (a leading ``python`` is the image's ``spec.python``)."""
    cmd = [spec.python, "-m", "papermill", spec.notebook, spec.output, "-y", json.dumps(spec.parameters or {}),
           "--cwd", spec.home_mount, "--log-output", "--no-progress-bar"]
    if spec.kernel_name:
        cmd += ["-k", spec.kernel_name]
    return program_argv(spec.command, spec.python, cmd)


def job_pod_manifest(spec: JobPodSpec) -> dict[str, Any]:
    """The Pod that runs one attempt of a notebook job with papermill in the user's image.

    Credentials of the environment (:data:`SECRET_ENV`) are read from the Secret
    :func:`job_secret_name` (made with :func:`job_secret_manifest` once the pod exists), so the
    pod spec never holds them.

    Its command is this module's ``run-job`` entrypoint around the local backend's runner (which
    appends papermill's output to the job's log, forwards signals to papermill and the kernel and
    writes the exit status); ``run-job`` also copies the log to the container's stdout (so
    ``kubectl logs`` and the API's pods/log show it) and turns the pod's SIGTERM into a stop
    request (see :func:`run_job`)."""
    p = spec.placement
    # GPUPOOL_RUN_ID marks the run's processes (the runner finds and cleans them up by it); run-job
    # gives it to the runner only, so the entrypoint itself is not one of them
    env: dict[str, str] = {k: str(v) for k, v in (spec.env or {}).items()
                           if k not in HOST_ONLY_ENV and k != Env.RUN_ID}
    env.update({
        Env.JOB_ID: spec.job_id,
        Env.CHECKPOINT_DIR: spec.checkpoint_dir,
        Env.STOP_FILE: spec.stop_file,
        Env.PREEMPTION_GRACE: f"{float(spec.grace_seconds):g}",
        "HOME": spec.home_mount,
        "PYTHONUNBUFFERED": "1",
    })
    if spec.endpoint:
        env[P.PORT] = str(int(spec.endpoint_port))
    # the cap the service computed (a memory request, the driver's reserve) is kept
    cap = int((spec.env or {}).get(Env.GPU_MEMORY_LIMIT) or 0) if 0 < p.fraction < 1 else 0
    env.update(gpu_env(p, spec.gpu_uuids, spec.gpu_memory, memory=cap))
    secret = {k: env.pop(k) for k in SECRET_ENV if k in env}
    env_entries = env_list(env) + [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": job_secret_name(spec.run_id), "key": k}}} for k in secret]

    resources: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    if spec.cpu > 0:
        resources["requests"]["cpu"] = _quantity_cpu(spec.cpu)
    if spec.memory > 0:
        resources["requests"]["memory"] = str(int(spec.memory))
        resources["limits"]["memory"] = str(int(spec.memory))
    resources["limits"].update(gpu_limits(p))
    resources = {k: v for k, v in resources.items() if v}

    volumes, mounts = [], []
    if spec.home_claim:
        volumes.append({"name": "home", "persistentVolumeClaim": {"claimName": spec.home_claim}})
        mounts.append({"name": "home", "mountPath": spec.home_mount})
    if spec.jobs_claim:
        volumes.append({"name": "gpupool-jobs", "persistentVolumeClaim": {"claimName": spec.jobs_claim}})
        mounts.append({"name": "gpupool-jobs", "mountPath": spec.jobs_mount})

    serve = ["--restarts", str(int(spec.max_restarts)), "--restarts-file", spec.restarts_file] if spec.endpoint else []
    args = ["run-job", "--exit-file", exit_file(spec.job_dir, spec.attempt, spec.rank), "--log", spec.log,
            "--run-id", spec.run_id, "--stop-file", spec.stop_file, "--grace", f"{float(spec.grace_seconds):g}",
            *serve, "--", *papermill_command(spec)]
    container: dict[str, Any] = {
        "name": "notebook",
        "image": spec.image,
        "command": [spec.python, "-m", "gpupool.backends.kube_manifests"],
        "args": args,
        "workingDir": spec.home_mount,
        "env": env_entries,
        "volumeMounts": mounts,
    }
    if resources:
        container["resources"] = resources
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    if spec.endpoint:  # a replica: it serves on its port; the Service sends requests to it once it answers
        container["ports"] = [{"name": "http", "containerPort": int(spec.endpoint_port), "protocol": "TCP"}]
        container["readinessProbe"] = {"httpGet": {"path": "/", "port": int(spec.endpoint_port)},
                                       "periodSeconds": 2, "failureThreshold": 1}
    security: dict[str, Any] = {}
    if spec.run_as_uid is not None:
        security["runAsUser"] = int(spec.run_as_uid)
    if spec.run_as_gid is not None:
        security["runAsGroup"] = int(spec.run_as_gid)
    if spec.fs_gid is not None:
        security["fsGroup"] = int(spec.fs_gid)

    labels = gpupool_labels(job_id=spec.job_id, user=spec.user, queue=spec.queue, kind=spec.kind)
    labels[LABEL_RUN] = label_value(spec.run_id)
    if spec.gang:
        labels[LABEL_GANG] = label_value(spec.gang)
        labels[LABEL_RANK] = str(int(spec.rank))
    if spec.endpoint:
        labels[LABEL_ENDPOINT] = label_value(spec.endpoint)
    labels.update(spec.extra_labels)
    gpu_ids = gpu_ids_for(p, spec.gpu_uuids) if 0 < p.fraction < 1.0 else []
    annotations = gpupool_annotations(job_id=spec.job_id, user=spec.user, queue=spec.queue,
                                      placements=[p], attempt=spec.attempt, gpu_ids=gpu_ids)
    annotations[f"{GROUP}/run-id"] = spec.run_id
    annotations.update(kai_annotations(p, int(env.get(Env.GPU_MEMORY_LIMIT) or 0), container["name"]))
    annotations.update(spec.extra_annotations)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # stop file at once, SIGTERM after the grace (run-job), SIGKILL kill_after later (kubelet)
        "terminationGracePeriodSeconds": int(math.ceil(spec.grace_seconds + spec.kill_after)),
        "affinity": node_affinity(p.node),
        "containers": [container],
        "volumes": volumes,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    tolerations = (gpu_tolerations() if p.gpus else []) + list(spec.tolerations)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if security:
        pod_spec["securityContext"] = security
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    if spec.runtime_class and p.gpus:
        pod_spec["runtimeClassName"] = spec.runtime_class
    if spec.priority_class:
        pod_spec["priorityClassName"] = spec.priority_class
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in spec.image_pull_secrets]
    if spec.subdomain:  # a worker of a distributed job: reachable as <hostname>.<subdomain>
        pod_spec["hostname"] = job_pod_name(spec.run_id)
        pod_spec["subdomain"] = spec.subdomain
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": job_pod_name(spec.run_id),
            "namespace": spec.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def delete_options(grace_seconds: int) -> dict[str, Any]:
    """The body of a pod DELETE that gives the container ``grace_seconds`` between SIGTERM and
    SIGKILL (``0`` = kill now)."""
    return {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": int(max(0, grace_seconds)),
            "propagationPolicy": "Background"}


# -- the job pod's entrypoint -------------------------------------------------------------------

def _write_stop_file(path: str, reason: str) -> None:
    """The pod's own stop request (kept when the service wrote one first, with its reason)."""
    if not path:
        return
    try:
        P.write_stop(path, reason, replace=False)
    except OSError as e:
        print(f"gpupool: could not write the stop request {path}: {e}", flush=True)


def run_job(argv: Sequence[str]) -> int:
    """``run-job --exit-file F --log L --run-id R --stop-file S --grace G -- CMD...``

    Runs the local backend's runner (``python -m gpupool.backends.local run``) with CMD, copies
    the job's log to stdout as it grows, and on SIGTERM (the pod is being deleted: preemption,
    cancel, drain) writes the stop request at once (``gpupool.checkpoint.should_stop()`` turns
    True), then after ``--grace`` seconds forwards SIGTERM to the runner (papermill and the
    kernel). The kubelet sends SIGKILL when the pod's termination grace period is over.
    Returns the runner's exit status (papermill's)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m gpupool.backends.kube_manifests run-job")
    ap.add_argument("--exit-file", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--stop-file", default="")
    ap.add_argument("--grace", type=float, default=30.0)
    ap.add_argument("--restarts", type=int, default=0)
    ap.add_argument("--restarts-file", default="")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(list(argv))
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("a command is required after --")
    for path in (os.path.dirname(args.exit_file), os.path.dirname(args.log)):
        if path:
            os.makedirs(path, exist_ok=True)
    try:
        os.unlink(args.exit_file)
    except FileNotFoundError:
        pass
    start_offset = os.path.getsize(args.log) if os.path.exists(args.log) else 0
    runner = [sys.executable, "-m", "gpupool.backends.local", "run", "--exit-file", args.exit_file,
              "--log", args.log, "--run-id", args.run_id,
              *(["--restarts", str(args.restarts), "--restarts-file", args.restarts_file] if args.restarts else []),
              "--", *cmd]
    env = dict(os.environ)
    env[Env.RUN_ID] = args.run_id
    proc = subprocess.Popen(runner, env=env, stdin=subprocess.DEVNULL)
    state: dict[str, Any] = {"term_at": None, "forwarded": False}

    def _on_term(signum: int, frame: Any) -> None:
        if state["term_at"] is None:
            state["term_at"] = time.monotonic()
            print(f"gpupool: the pod is being stopped: stop requested, SIGTERM to the notebook in {args.grace:g}s",
                  flush=True)
            _write_stop_file(args.stop_file, "the job's pod is being stopped (preempted, cancelled or its node drained)")

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    offset = start_offset
    out = sys.stdout.buffer

    def _copy_log() -> None:
        nonlocal offset
        try:
            with open(args.log, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        except OSError:
            return
        if chunk:
            offset += len(chunk)
            out.write(chunk)
            out.flush()

    while True:
        try:
            rc = proc.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            pass
        _copy_log()
        if state["term_at"] is not None and not state["forwarded"] and time.monotonic() - state["term_at"] >= args.grace:
            state["forwarded"] = True
            print("gpupool: grace period over: SIGTERM to the notebook", flush=True)
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    _copy_log()
    return 128 - rc if rc < 0 else rc


def main(argv: Iterable[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["run-job"] and argv is None and Env.RUN_ID in os.environ:
        # the runner kills every process whose environment carries the run id once papermill is
        # done: start again without it (/proc/<pid>/environ is the environment at exec time)
        env = {k: v for k, v in os.environ.items() if k != Env.RUN_ID}
        os.execve(sys.executable, [sys.executable, "-m", "gpupool.backends.kube_manifests", *args], env)
    if args[:1] != ["run-job"]:
        print("usage: python -m gpupool.backends.kube_manifests run-job --exit-file F --log L --run-id R "
              "[--stop-file S] [--grace SECONDS] -- CMD...   (the entrypoint of a gpupool job pod)", file=sys.stderr)
        return 2
    return run_job(args[1:])


if __name__ == "__main__":
    sys.exit(main())
