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
  the share and memory cap through the environment (see :func:`fraction_env` and
  docs/kubernetes.md for what this does and does not isolate).

``python -m gpupool.backends.kube_manifests run-job`` is the entrypoint of a job pod: it runs
papermill and turns the container's SIGTERM (pod deletion with a grace period) into a SIGTERM to
the notebook's kernel, where ``gpupool.checkpoint`` treats it as the request to save and stop.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..scheduler.model import PodPlacement

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
    return {
        LABEL_MANAGED: "true",
        LABEL_JOB: label_value(job_id),
        LABEL_QUEUE: label_value(queue),
        LABEL_USER: label_value(user),
        LABEL_KIND: label_value(kind),
        LABEL_COMPONENT: component,
    }


def selector(labels: dict[str, str]) -> str:
    """A label selector string from a mapping: ``a=b,c=d``."""
    return ",".join(f"{k}={v}" for k, v in labels.items())


def placement_to_json(placements: Sequence[PodPlacement]) -> str:
    return json.dumps([{"pod": p.pod, "node": p.node, "gpus": list(p.gpus), "fraction": p.fraction}
                       for p in placements], separators=(",", ":"))


def placement_from_json(text: str | None) -> tuple[PodPlacement, ...]:
    """Inverse of :func:`placement_to_json`; an empty tuple for a missing or broken value."""
    if not text:
        return ()
    try:
        items = json.loads(text)
        return tuple(PodPlacement(pod=int(i.get("pod", 0)), node=str(i["node"]),
                                  gpus=tuple(int(g) for g in i.get("gpus", ())),
                                  fraction=float(i.get("fraction", 1.0))) for i in items)
    except (ValueError, TypeError, KeyError, AttributeError):
        return ()


def gpupool_annotations(*, job_id: str, user: str, queue: str, placements: Sequence[PodPlacement],
                        attempt: int = 0, gpu_ids: Sequence[str] = ()) -> dict[str, str]:
    ann = {ANN_JOB: str(job_id), ANN_USER: str(user), ANN_QUEUE: str(queue),
           ANN_PLACEMENT: placement_to_json(placements), ANN_ATTEMPT: str(int(attempt))}
    if gpu_ids:
        ann[ANN_GPU_IDS] = ",".join(gpu_ids)
    return ann


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
    out = []
    for g in placement.gpus:
        if uuids and g < len(uuids) and uuids[g]:
            out.append(str(uuids[g]))
        else:
            out.append(str(g))
    return out


def fraction_env(fraction: float, gpu_ids: Sequence[str], gpu_memory: int = 0) -> dict[str, str]:
    """Environment that shares one GPU without MIG, the way Run:ai / KAI do it.

    * ``NVIDIA_VISIBLE_DEVICES``: the NVIDIA container runtime mounts only this GPU into the
      container (when the runtime accepts the variable from unprivileged pods, its default).
    * ``GPUPOOL_GPU_FRACTION`` / ``GPUPOOL_GPU_MEMORY_LIMIT`` (bytes): read by gpupool's helpers
      and by user code (e.g. ``torch.cuda.set_per_process_memory_fraction``).
    * ``XLA_PYTHON_CLIENT_MEM_FRACTION``: JAX allocates at most this share.
    * ``TF_FORCE_GPU_ALLOW_GROWTH``: TensorFlow does not grab the whole GPU at start.
    * ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: enforced only
      when an MPS control daemon serves the node; ignored otherwise.

    None of these is a hard memory limit without MPS: a process that allocates beyond its share
    can still exhaust the GPU for its neighbours (docs/kubernetes.md says so)."""
    frac = max(0.0, min(1.0, float(fraction)))
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(gpu_ids),
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "GPUPOOL_GPU_FRACTION": f"{frac:g}",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": f"{frac:.2f}",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, int(round(frac * 100)))),
    }
    if gpu_memory > 0:
        limit = int(gpu_memory * frac)
        env["GPUPOOL_GPU_MEMORY_LIMIT"] = str(limit)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={max(1, limit // 2**20)}M"
    return env


def gpu_env(placement: PodPlacement, uuids: Sequence[str] | None = None, gpu_memory: int = 0) -> dict[str, str]:
    """The GPU part of a pod's environment for ``placement``: fraction variables for a share,
    only ``GPUPOOL_GPUS`` for whole GPUs (the device plugin sets NVIDIA_VISIBLE_DEVICES) and
    ``NVIDIA_VISIBLE_DEVICES=void`` for a CPU-only pod, so an image built on a CUDA base image
    does not see every GPU of the node."""
    if not placement.gpus:
        return {"NVIDIA_VISIBLE_DEVICES": "void", "GPUPOOL_GPUS": "0"}
    if placement.fraction < 1.0:
        env = fraction_env(placement.fraction, gpu_ids_for(placement, uuids)[:1], gpu_memory)
        env["GPUPOOL_GPUS"] = f"{placement.fraction:g}"
        return env
    return {"GPUPOOL_GPUS": str(len(placement.gpus))}


def env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": str(k), "value": str(v)} for k, v in env.items()]


@dataclass
class JobPodSpec:
    """Everything a job pod needs. ``home_claim`` is the user's PVC (z2jh names it
    ``claim-{username}``); ``jobs_claim`` is the shared PVC holding each job's directory
    (``{jobs_mount}/{job_id}``: output notebook and checkpoints) that the service also mounts."""

    job_id: str
    user: str
    queue: str
    image: str
    placement: PodPlacement
    namespace: str = "default"
    kind: str = "train"
    name: str = ""
    attempt: int = 0
    notebook: str | None = None  # path relative to the home directory
    notebook_content: dict | None = None
    parameters: dict = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    gpu_uuids: Sequence[str] | None = None
    gpu_memory: int = 0
    cpu: float = 0.0
    memory: int = 0
    home_claim: str | None = None
    home_mount: str = "/home/jovyan"
    jobs_claim: str | None = None
    jobs_mount: str = "/gpupool/jobs"
    grace_seconds: int = 30
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


def job_pod_name(job_id: str, attempt: int = 0) -> str:
    return dns_name(f"gpupool-{job_id}-{attempt}".lower())


def job_dir(spec: JobPodSpec) -> str:
    return f"{spec.jobs_mount.rstrip('/')}/{dns_name(spec.job_id.lower())}"


def _quantity_cpu(cpu: float) -> str:
    return f"{int(round(cpu * 1000))}m"


def job_pod_manifest(spec: JobPodSpec) -> dict[str, Any]:
    """The Pod that runs one attempt of a notebook job with papermill in the user's image."""
    if bool(spec.notebook) == (spec.notebook_content is not None):
        raise ValueError("exactly one of notebook / notebook_content must be given")
    p = spec.placement
    jdir = job_dir(spec)
    env: dict[str, str] = {
        "GPUPOOL_JOB_ID": spec.job_id,
        "GPUPOOL_JOB_DIR": jdir,
        "GPUPOOL_CHECKPOINT_DIR": f"{jdir}/checkpoints",
        "GPUPOOL_OUTPUT": f"{jdir}/output.ipynb",
        "GPUPOOL_PARAMETERS": json.dumps(spec.parameters or {}),
        "GPUPOOL_ATTEMPT": str(spec.attempt),
        "GPUPOOL_PREEMPTION_GRACE": str(int(spec.grace_seconds)),
        "HOME": spec.home_mount,
    }
    if spec.notebook:
        env["GPUPOOL_NOTEBOOK"] = spec.notebook
    else:
        raw = json.dumps(spec.notebook_content).encode()
        env["GPUPOOL_NOTEBOOK_B64"] = base64.b64encode(raw).decode()
    env.update({str(k): str(v) for k, v in (spec.env or {}).items()})
    env.update(gpu_env(p, spec.gpu_uuids, spec.gpu_memory))

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

    container: dict[str, Any] = {
        "name": "notebook",
        "image": spec.image,
        "command": [spec.python, "-m", "gpupool.backends.kube_manifests", "run-job"],
        "workingDir": spec.home_mount,
        "env": env_list(env),
        "volumeMounts": mounts,
    }
    if resources:
        container["resources"] = resources
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    security: dict[str, Any] = {}
    if spec.run_as_uid is not None:
        security["runAsUser"] = int(spec.run_as_uid)
    if spec.run_as_gid is not None:
        security["runAsGroup"] = int(spec.run_as_gid)
    if spec.fs_gid is not None:
        security["fsGroup"] = int(spec.fs_gid)

    labels = gpupool_labels(job_id=spec.job_id, user=spec.user, queue=spec.queue, kind=spec.kind)
    labels.update(spec.extra_labels)
    gpu_ids = gpu_ids_for(p, spec.gpu_uuids) if p.fraction < 1.0 else []
    annotations = gpupool_annotations(job_id=spec.job_id, user=spec.user, queue=spec.queue,
                                      placements=[p], attempt=spec.attempt, gpu_ids=gpu_ids)
    annotations.update(spec.extra_annotations)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": int(spec.grace_seconds),
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
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": job_pod_name(spec.job_id, spec.attempt),
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

def _children_tree(root: int) -> list[int]:
    """PIDs of all descendants of ``root`` (read from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in parents.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


def papermill_command(env: dict[str, str], python: str | None = None) -> tuple[list[str], str | None]:
    """The papermill command line for a job pod's environment, and the notebook written from
    ``GPUPOOL_NOTEBOOK_B64`` (if any)."""
    jdir = env["GPUPOOL_JOB_DIR"]
    written = None
    if env.get("GPUPOOL_NOTEBOOK_B64"):
        written = os.path.join(jdir, "input.ipynb")
        source = written
    else:
        source = env["GPUPOOL_NOTEBOOK"]
    output = env.get("GPUPOOL_OUTPUT") or os.path.join(jdir, "output.ipynb")
    cmd = [python or sys.executable, "-m", "papermill", "--log-output", "--no-progress-bar",
           "-y", env.get("GPUPOOL_PARAMETERS") or "{}", source, output]
    return cmd, written


def run_job(env: dict[str, str] | None = None) -> int:
    """Run papermill as a child; forward SIGTERM to its descendants (the kernel) but not to
    papermill itself, so papermill survives to write the output notebook after the notebook
    saved its checkpoint and stopped. Returns papermill's exit code."""
    env = dict(os.environ if env is None else env)
    jdir = env["GPUPOOL_JOB_DIR"]
    os.makedirs(os.path.join(jdir, "checkpoints"), exist_ok=True)
    cmd, written = papermill_command(env)
    if written:
        with open(written, "wb") as f:
            f.write(base64.b64decode(env["GPUPOOL_NOTEBOOK_B64"]))
    print(f"gpupool: job {env.get('GPUPOOL_JOB_ID')} attempt {env.get('GPUPOOL_ATTEMPT', '0')}: "
          f"{' '.join(cmd[1:4])} ... {cmd[-2]} -> {cmd[-1]}", flush=True)

    def _ignore_term() -> None:  # papermill ignores SIGTERM; its kernel inherits SIG_IGN unless it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # installs a handler (gpupool.checkpoint does)

    proc = subprocess.Popen(cmd, env=env, preexec_fn=_ignore_term)
    stopping = {"asked": False}

    def _on_term(signum: int, frame: Any) -> None:
        if not stopping["asked"]:
            print("gpupool: stop requested (SIGTERM): asking the notebook to checkpoint and stop", flush=True)
        stopping["asked"] = True
        for pid in _children_tree(proc.pid):
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass

    signal.signal(signal.SIGTERM, _on_term)
    while True:
        try:
            return proc.wait()
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue


def main(argv: Iterable[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["run-job"]:
        print("usage: python -m gpupool.backends.kube_manifests run-job  (inside a gpupool job pod)",
              file=sys.stderr)
        return 2
    missing = [k for k in ("GPUPOOL_JOB_DIR",) if not os.environ.get(k)]
    if missing or not (os.environ.get("GPUPOOL_NOTEBOOK") or os.environ.get("GPUPOOL_NOTEBOOK_B64")):
        print("gpupool: not a job pod: GPUPOOL_JOB_DIR and GPUPOOL_NOTEBOOK(_B64) must be set", file=sys.stderr)
        return 2
    return run_job()


if __name__ == "__main__":
    sys.exit(main())
