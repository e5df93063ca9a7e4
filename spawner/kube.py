"""GPUPoolKubeSpawner: KubeSpawner whose GPU servers are admitted and placed by gpupool.

``c.JupyterHub.spawner_class = "gpupool.spawner.kube.GPUPoolKubeSpawner"``. A start goes through
the gpupool scheduler first (:class:`~gpupool.spawner.mixin.GPUPoolSpawnerMixin`: queue, fair
share, progress messages); once GPUs are granted the notebook pod is built by KubeSpawner and then:

* pinned to the node the scheduler chose: a required node affinity on the node's name
  (``matchFields metadata.name``), ANDed into every node selector term KubeSpawner already has;
* whole GPUs: ``nvidia.com/gpu: N`` in the notebook container's limits (the NVIDIA device plugin
  picks and isolates the devices);
* a fraction of a GPU: no ``nvidia.com/gpu`` request; ``NVIDIA_VISIBLE_DEVICES`` is the chosen
  GPU's UUID (the node annotation ``gpupool.io/gpu-uuids``; its index when unknown), with the
  share and the frameworks' memory caps in the environment
  (:func:`gpupool.protocol.gpu_env`; docs/kubernetes.md lists what this does
  not isolate);
* labels ``gpupool.io/managed=true``, ``gpupool.io/user``, ``gpupool.io/queue``,
  ``gpupool.io/component=workspace`` (so gpupool's Kubernetes inventory does not count the pod as
  a foreign GPU user) and the placement as an annotation.

``profile_list`` works as usual; a profile (or a profile option's choice) asks for GPUs with a
``gpupool`` key in its ``kubespawner_override``::

    c.GPUPoolKubeSpawner.profile_list = [
        {"display_name": "CPU only", "default": True},
        {"display_name": "Half an A100 (vision)", "slug": "half",
         "kubespawner_override": {"gpupool": {"gpus": 0.5, "queue": "vision"},
                                  "image": "quay.io/jupyter/pytorch-notebook:cuda12-latest"}},
    ]

Without ``profile_list`` users get the mixin's GPU form (GPUs, queue, preemptible).
"""
from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from jupyterhub.spawner import SpawnException
from jupyterhub.utils import maybe_future
from kubespawner import KubeSpawner
from traitlets import Dict, Unicode, default

from ..backends import kube_manifests as km
from ..contract import decode_allocation
from ..scheduler.model import PodPlacement
from .mixin import GPUPoolSpawnerMixin

GPUPOOL_KEYS = ("gpus", "gpu_memory", "queue", "preemptible")


class GPUPoolKubeSpawner(GPUPoolSpawnerMixin, KubeSpawner):
    """KubeSpawner with GPUs granted and placed by the gpupool scheduler."""

    gpupool = Dict(
        help="""The GPU request of a profile: ``{"gpus": 0.5, "queue": "vision", "preemptible":
        false}`` (or ``gpu_memory: "20Gi"`` instead of ``gpus``). Set it in a profile's
        ``kubespawner_override``; as a plain setting it is the request of every start without a
        profile. Keys the user also gives (form / REST) are overridden by the profile's.""",
    ).tag(config=True)

    gpu_runtime_class = Unicode(
        "",
        help="""runtimeClassName of GPU notebook pods, e.g. ``nvidia`` on k3s or clusters where the
        NVIDIA container runtime is not the default (fractions need it: without a
        ``nvidia.com/gpu`` request only the runtime reads NVIDIA_VISIBLE_DEVICES).""",
    ).tag(config=True)

    _profile_image: str | None = None  # the image the chosen profile and its options ask for

    # what admission granted, for the pod manifest and the environment
    _gpu_node_uuids: list[str] | None = None
    _gpu_node_memory: int = 0

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # KubeSpawner merges a profile's dict overrides into the trait and keeps them across
        # starts of the same server: remember the configured request to start from each time
        self._gpupool_configured = copy.deepcopy(dict(self.gpupool or {}))

    # -- the form: KubeSpawner's profile form when profiles exist, else the GPU form ------------
    @default("options_form")
    def _gpupool_options_form(self):
        if self.profile_list:
            return KubeSpawner._options_form_default(self)
        return GPUPoolSpawnerMixin._default_options_form(self)

    @default("options_from_form")
    def _gpupool_options_from_form(self):
        if self.profile_list:
            return KubeSpawner._options_from_form_default(self)
        return GPUPoolSpawnerMixin._default_options_from_form(self)

    # -- user_options -> GPU request, profiles included -----------------------------------------
    async def _profile_gpu_request(self, user_options: dict) -> tuple[dict, set[str]]:
        """The ``gpupool`` override of the chosen profile and its chosen options, and the
        user_options keys that belong to KubeSpawner's profile form (``_profile_image``: the
        image they choose, if any)."""
        self.gpupool = copy.deepcopy(self._gpupool_configured)
        request = dict(self.gpupool)
        profile_keys: set[str] = set()
        self._profile_image = None
        if not self.profile_list:
            return request, profile_keys
        profile_list = self.profile_list
        if callable(profile_list):
            profile_list = await maybe_future(profile_list(self))
        profiles = self._get_initialized_profile_list(copy.deepcopy(profile_list))
        if not profiles:
            return request, profile_keys
        profile_keys.add("profile")
        try:
            profile = self._get_profile(user_options.get("profile"), profiles)
        except ValueError as e:
            raise SpawnException(f"profile: {e}", status_code=400, reason="gpupool-bad-option") from None
        request.update((profile.get("kubespawner_override") or {}).get("gpupool") or {})
        self._profile_image = profile_image(profile, user_options)
        for name, option in (profile.get("profile_options") or {}).items():
            profile_keys.update({name, f"{name}--unlisted-choice"})
            choices = option.get("choices") or {}
            chosen = user_options.get(name)
            choice = choices.get(chosen) if chosen else next((c for c in choices.values() if c.get("default")), None)
            if choice:
                request.update((choice.get("kubespawner_override") or {}).get("gpupool") or {})
        bad = [k for k in request if k not in GPUPOOL_KEYS]
        if bad:
            raise SpawnException(f"profile {profile.get('slug')!r}: kubespawner_override.gpupool.{bad[0]}: unknown "
                                 f"key (use {', '.join(GPUPOOL_KEYS)}); tell your admin", status_code=500,
                                 reason="gpupool-bad-profile")
        return request, profile_keys

    async def validate_gpu_options(self, user_options: dict):
        user_options = dict(user_options or {})
        request, profile_keys = await self._profile_gpu_request(user_options)
        gpu_options = {k: v for k, v in user_options.items() if k not in profile_keys}
        gpu_options.update(request)
        if "gpus" in request:
            gpu_options.pop("gpu_memory", None)
        if "gpu_memory" in request:
            gpu_options.pop("gpus", None)
        out = await super().validate_gpu_options(gpu_options)
        # the image the pod will run, which the queue's workload policy may limit (its ``images``)
        image = self._profile_image or (self.image if isinstance(self.image, str) else None)
        return dataclasses.replace(out, image=image or None)

    # -- admission -> placement ----------------------------------------------------------------
    def _placement(self) -> PodPlacement | None:
        if not self.gpu_allocation:
            return None
        return decode_allocation(self.gpu_allocation[:1])[0]

    async def _read_node(self, name: str) -> dict | None:
        try:
            resp = await self.api.read_node(name, _preload_content=False)
            return json.loads(await resp.read())
        except Exception as e:  # noqa: BLE001 - no RBAC for nodes or no such node: use indices
            self.log.warning("gpupool: could not read node %s (%s); pinning fractions by GPU index", name, e)
            return None

    async def admit(self, request) -> dict:
        ws = await super().admit(request)
        self._gpu_node_uuids, self._gpu_node_memory = None, 0
        allocation = (ws or {}).get("allocation") or []
        if allocation and allocation[0].get("node"):
            node = await self._read_node(str(allocation[0]["node"]))
            if node:
                meta = node.get("metadata", {})
                uuids = (meta.get("annotations") or {}).get(km.NODE_ANN_GPU_UUIDS) or ""
                self._gpu_node_uuids = [u.strip() for u in uuids.split(",") if u.strip()] or None
                try:
                    self._gpu_node_memory = int((meta.get("labels") or {}).get("nvidia.com/gpu.memory", 0)) * 2**20
                except ValueError:
                    self._gpu_node_memory = 0
        return ws

    def get_env(self) -> dict:
        env = super().get_env()
        place = self._placement()
        if place is None or not place.gpus:
            if self.hide_gpus_without_allocation:
                # CUDA base images say NVIDIA_VISIBLE_DEVICES=all: without this a CPU-only pod on a
                # node whose default runtime is NVIDIA's would see every GPU of the node
                env["NVIDIA_VISIBLE_DEVICES"] = "void"
            return env
        for key in km.HOST_ONLY_ENV:
            if key not in ("HOME", "PATH"):
                env.pop(key, None)  # host GPU indices mean nothing in the pod
        env.update(km.gpu_env(place, self._gpu_node_uuids, self._gpu_node_memory))
        return env

    async def get_pod_manifest(self):
        pod = await super().get_pod_manifest()
        place = self._placement()
        if place is None or not place.node:
            return pod
        from kubernetes_asyncio.client.models import (V1Affinity, V1NodeAffinity, V1NodeSelector,
                                                      V1NodeSelectorRequirement, V1NodeSelectorTerm,
                                                      V1ResourceRequirements, V1Toleration)

        pin = V1NodeSelectorRequirement(key="metadata.name", operator="In", values=[place.node])
        spec = pod.spec
        spec.affinity = spec.affinity or V1Affinity()
        spec.affinity.node_affinity = spec.affinity.node_affinity or V1NodeAffinity()
        na = spec.affinity.node_affinity
        required = na.required_during_scheduling_ignored_during_execution
        if required is None or not required.node_selector_terms:
            na.required_during_scheduling_ignored_during_execution = V1NodeSelector(
                node_selector_terms=[V1NodeSelectorTerm(match_fields=[pin])])
        else:  # terms are ORed: the node pin goes into each of them
            for term in required.node_selector_terms:
                term.match_fields = list(term.match_fields or []) + [pin]
        container = next((c for c in spec.containers if c.name == "notebook"), spec.containers[0])
        container.resources = container.resources or V1ResourceRequirements()
        limits = dict(container.resources.limits or {})
        requests = dict(container.resources.requests or {})
        limits.pop(km.GPU_RESOURCE, None)
        requests.pop(km.GPU_RESOURCE, None)
        limits.update(km.gpu_limits(place))
        container.resources.limits = limits or None
        container.resources.requests = requests or None
        if place.gpus:
            tolerations = list(spec.tolerations or [])
            for t in km.gpu_tolerations():
                if not any(getattr(x, "key", None) == t["key"] and getattr(x, "effect", None) == t["effect"] for x in tolerations):
                    tolerations.append(V1Toleration(**t))
            spec.tolerations = tolerations
            if self.gpu_runtime_class:
                spec.runtime_class_name = self.gpu_runtime_class
        request = self.gpu_request
        queue = (getattr(request, "queue", None) or (self.gpu_allocation[0].get("queue") if self.gpu_allocation else None)
                 or "")
        labels = dict(pod.metadata.labels or {})
        labels.update({km.LABEL_MANAGED: "true", km.LABEL_USER: km.label_value(self.user.name),
                       km.LABEL_COMPONENT: "workspace", km.LABEL_JOB: km.label_value(self._workspace_id())})
        if queue:
            labels[km.LABEL_QUEUE] = km.label_value(queue)
        pod.metadata.labels = labels
        annotations = dict(pod.metadata.annotations or {})
        annotations.update({km.ANN_USER: self.user.name, km.ANN_PLACEMENT: km.placement_to_json([place]),
                            km.ANN_JOB: self._workspace_id()})
        if 0 < place.fraction < 1:
            annotations[km.ANN_GPU_IDS] = ",".join(km.gpu_ids_for(place, self._gpu_node_uuids)[:1])
        pod.metadata.annotations = annotations
        return pod

    def _workspace_id(self) -> str:
        return f"ws-{self.user.name}" + (f"-{self.name}" if self.name else "")


__all__ = ["GPUPoolKubeSpawner"]


def profile_image(profile: dict, user_options: dict) -> str | None:
    """The image a profile of ``profile_list`` runs with the user's choices of its options (a
    choice's ``kubespawner_override``, an unlisted choice's with ``{value}`` filled in, else the
    profile's own); None when they name none (the spawner's ``image`` then)."""
    image = (profile.get("kubespawner_override") or {}).get("image")
    for name, option in (profile.get("profile_options") or {}).items():
        unlisted = user_options.get(f"{name}--unlisted-choice")
        free = option.get("unlisted_choice") or {}
        if unlisted and free.get("enabled"):
            override = free.get("kubespawner_override") or {}
            if isinstance(override.get("image"), str):
                image = override["image"].format(value=unlisted)
            continue
        choices = option.get("choices") or {}
        chosen = user_options.get(name)
        choice = choices.get(chosen) if chosen else next((c for c in choices.values() if c.get("default")), None)
        if choice and (choice.get("kubespawner_override") or {}).get("image"):
            image = choice["kubespawner_override"]["image"]
    return image
