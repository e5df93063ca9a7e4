"""A Kubernetes API server for tests: kmock's in-memory emulator plus the parts it lacks, and a
"fake kubelet".

kmock (PyPI) is a real HTTP server on 127.0.0.1 with a stateful Kubernetes API that the official
``kubernetes`` / ``kubernetes_asyncio`` clients (and so KubeSpawner) talk to. It lacks a few things
that gpupool and KubeSpawner rely on; :class:`FakeKube` adds them:

* ``?watch=True`` (what kubernetes_asyncio sends; kmock knows only ``watch=true``), watch
  ``timeoutSeconds``, and ``resourceVersion`` (only changes after that version are replayed);
* ``metadata.namespace / uid / resourceVersion / creationTimestamp / generateName`` on create, a
  new ``resourceVersion`` on every change, and the list's ``metadata.resourceVersion``;
* label selectors (``a=b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``, ``a notin (x,y)``) and
  field selectors (dotted paths with ``=``, ``==``, ``!=``) on list and watch;
* graceful pod deletion: ``DELETE`` with ``gracePeriodSeconds`` (body or query) marks the pod
  ``deletionTimestamp`` and the kubelet removes it when the grace is over, or earlier when the
  pod "exits on SIGTERM" (``behave(..., exit_on_term_after=s)``); every deletion is recorded in
  :attr:`FakeKube.deletions` with its grace period;
* ``pods/{name}/log`` serves the text set with :meth:`KubeCluster.set_log`;
* Secrets store ``stringData`` as base64 ``data``; deleting an object deletes the objects it owns
  (``ownerReferences``), as the garbage collector does.

With ``KubeCluster(run_jobs=True)`` the kubelet really runs the command of gpupool job pods
(label ``gpupool.io/component=job``) as a local process with the pod's environment and working
directory (the job paths are the same on this machine), its output as the pod's log; deleting
the pod sends SIGTERM to its main process and, when the grace period is over, SIGKILL to every
process of the "container" (found by a marker in their environment), as a kubelet does; when
the main process ends, what is left of the container is killed too, and so is the container of a
pod deleted with grace 0 (gone from the API at once).

The fake kubelet binds pods to the node named by their required node affinity (``matchFields
metadata.name`` or ``kubernetes.io/hostname``), ``nodeSelector`` or ``spec.nodeName`` (else to the
first Ready, uncordoned node matching the ``nodeSelector``, as a scheduler would), waits for
Secrets the pod's environment refers to (``CreateContainerConfigError``), refuses a
node that is missing, cordoned, NotReady or out of ``nvidia.com/gpu`` (the pod stays Pending
with an ``Unschedulable`` condition, as the kube-scheduler would leave it) and otherwise moves the
pod to Running with a pod IP and ready container statuses.

The server runs in its own thread and event loop, so synchronous and asynchronous test code and
subprocesses can all use it. Use the ``kube`` pytest fixture, or ``KubeCluster()`` as a context
manager.
"""
from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import re
import signal
import sys
import threading
import uuid
from typing import Any, Callable

import aiohttp.web
import attrs
import kmock
import pytest
import yaml
from kmock._internal import enums, rendering

PODS = kmock.resource("", "v1", "pods")
NODES = kmock.resource("", "v1", "nodes")
EVENTS = kmock.resource("", "v1", "events")
PVCS = kmock.resource("", "v1", "persistentvolumeclaims")
SECRETS = kmock.resource("", "v1", "secrets")
SERVICES = kmock.resource("", "v1", "services")
NAMESPACED = {"pods", "events", "persistentvolumeclaims", "secrets", "services", "configmaps"}


def _now() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _get_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def match_labels(labels: dict[str, str], selector: str | None) -> bool:
    for req in _split_selector(selector or ""):
        m = _SET_RE.match(req)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if (op == "in") != (labels.get(key) in values):
                return False
        elif "!=" in req:
            k, v = req.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in req:
            k, v = req.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif req.startswith("!"):
            if req[1:].strip() in labels:
                return False
        elif req not in labels:
            return False
    return True


def match_fields(obj: dict, selector: str | None) -> bool:
    for req in _split_selector(selector or ""):
        neg = "!=" in req
        k, v = (req.split("!=", 1) if neg else req.replace("==", "=").split("=", 1))
        actual = _get_path(obj, k.strip())
        actual = "" if actual is None else str(actual)
        if (actual == v.strip()) == neg:
            return False
    return True


@attrs.define(kw_only=True)
class FakeKube(kmock.KubernetesEmulator):
    """kmock's emulator with the gaps filled (see the module docstring)."""

    rv: int = 0
    run_jobs: bool = False  # the kubelet runs gpupool job pods' commands as local processes
    procs: dict = attrs.field(factory=dict)  # (namespace, name, uid) -> asyncio subprocess
    logs: dict = attrs.field(factory=dict)
    behaviours: dict = attrs.field(factory=dict)
    deletions: list = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for res in (PODS, NODES, EVENTS, PVCS, SECRETS, SERVICES):
            self.resources[res] = {"namespaced": res.plural in NAMESPACED, "verbs": ["list", "watch", "get"]}

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    # -- object changes (call with self._lock held) ---------------------------------------------
    async def _emit(self, resource: Any, kind: str, raw: dict) -> None:
        await self._buses[resource].put({"type": kind, "object": raw})

    async def patch_object(self, resource: Any, namespace: str | None, name: str, patch: dict) -> dict | None:
        key = (resource, namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        patch = json.loads(json.dumps(patch))
        patch.setdefault("metadata", {})["resourceVersion"] = self.next_rv()
        self._objects[key].patch(patch)
        raw = self._objects[key].raw
        await self._emit(resource, "MODIFIED", raw)
        return raw

    async def remove_object(self, resource: Any, namespace: str | None, name: str) -> dict | None:
        key = (resource, namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        self._objects[key].patch({"metadata": {"resourceVersion": self.next_rv()}})
        raw = self._objects[key].raw
        self._objects[key].delete()
        await self._emit(resource, "DELETED", raw)
        uid = raw.get("metadata", {}).get("uid")
        for (res, ns, name), obj in list(self._objects.items()):  # the garbage collector: owned objects go too
            if not obj.deleted and any(o.get("uid") == uid for o in obj.raw.get("metadata", {}).get("ownerReferences", [])):
                await self.remove_object(res, ns, name)
        return raw

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        k = (SECRETS, namespace, name)
        if k not in self._objects or self._objects[k].deleted:
            return None
        value = (self._objects[k].raw.get("data") or {}).get(key)
        return None if value is None else base64.b64decode(value).decode()

    async def create_object(self, resource: Any, namespace: str | None, data: dict) -> dict:
        data = json.loads(json.dumps(data))
        meta = data.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if resource.plural in NAMESPACED:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["resourceVersion"] = self.next_rv()
        if resource.plural == "pods":
            data.setdefault("status", {}).setdefault("phase", "Pending")
        if resource.plural == "secrets" and "stringData" in data:  # as the API server stores it
            data.setdefault("data", {}).update({k: base64.b64encode(str(v).encode()).decode()
                                                for k, v in data.pop("stringData").items()})
        key = (resource, meta.get("namespace"), meta["name"])
        if key in self._objects and not self._objects[key].deleted:
            raise kmock.KubernetesError(status=409, reason="AlreadyExists",
                                        message=f'{resource.plural} "{meta["name"]}" already exists')
        if key in self._objects:
            self._objects[key].create(data)
        else:
            self._objects[key] = data
        raw = self._objects[key].raw
        await self._emit(resource, "ADDED", raw)
        return raw

    # -- HTTP ------------------------------------------------------------------------------------
    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is None:
            return await super()._handle(request)
        params = {k: v for k, v in request.params.items()}
        if request.method == enums.method.GET and str(params.get("watch", "")).lower() in ("true", "1"):
            watch = attrs.evolve(request, action=enums.action.WATCH)
            # kmock matches reactions against the requests it recorded, by identity
            for i, seen in enumerate(self._requests):
                if seen is request:
                    self._requests[i] = watch
            return await super()._handle(watch)
        res = request.resource
        if request.subresource == "log" and request.method == enums.method.GET:
            key = (res, request.namespace, request.name)
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            return aiohttp.web.Response(text=self.logs.get((request.namespace, request.name), ""))
        if request.action == enums.action.CREATE:
            async with self._lock:
                raw = await self.create_object(res, request.namespace, request.data or {})
            return aiohttp.web.json_response(raw, status=201)
        if request.action == enums.action.UPDATE:
            data = request.data
            if not isinstance(data, dict):
                raise kmock.KubernetesError(status=415, reason="UnsupportedMediaType",
                                            message="this test server supports merge patches only")
            async with self._lock:
                raw = await self.patch_object(res, request.namespace, request.name, data)
            if raw is None:
                raise kmock.KubernetesObjectNotFoundError()
            return aiohttp.web.json_response(raw)
        if request.action == enums.action.DELETE and request.name:
            body = request.data if isinstance(request.data, dict) else {}
            grace = body.get("gracePeriodSeconds", params.get("gracePeriodSeconds"))
            async with self._lock:
                key = (res, request.namespace, request.name)
                if key not in self._objects or self._objects[key].deleted:
                    raise kmock.KubernetesObjectNotFoundError()
                obj = self._objects[key].raw
                if res.plural != "pods":
                    raw = await self.remove_object(res, request.namespace, request.name)
                    return aiohttp.web.json_response(raw)
                if grace is None:
                    grace = obj.get("spec", {}).get("terminationGracePeriodSeconds", 30)
                grace = int(grace)
                self.deletions.append({"namespace": request.namespace, "name": request.name, "grace": grace,
                                       "labels": dict(obj.get("metadata", {}).get("labels", {}))})
                if obj["metadata"].get("deletionTimestamp"):  # already terminating: a shorter grace wins
                    if grace <= 0:
                        raw = await self.remove_object(res, request.namespace, request.name)
                    elif grace < int(obj["metadata"].get("deletionGracePeriodSeconds", grace)):
                        raw = await self.patch_object(res, request.namespace, request.name,
                                                      {"metadata": {"deletionGracePeriodSeconds": grace}})
                    else:
                        raw = obj
                    return aiohttp.web.json_response(raw)
                if grace <= 0 or not obj.get("spec", {}).get("nodeName"):
                    raw = await self.remove_object(res, request.namespace, request.name)
                else:
                    raw = await self.patch_object(res, request.namespace, request.name, {"metadata": {
                        "deletionTimestamp": _now(), "deletionGracePeriodSeconds": grace}})
            return aiohttp.web.json_response(raw)
        return await super()._handle(request)

    def _matching(self, request: rendering.Request, params: dict) -> list[dict]:
        out = []
        for (resource, namespace, name), obj in self._objects.items():
            if resource != request.resource or obj.deleted:
                continue
            if request.namespace is not None and namespace != request.namespace:
                continue
            if request.name is not None and name != request.name:
                continue
            raw = obj.raw
            if not match_labels(raw.get("metadata", {}).get("labels") or {}, params.get("labelSelector")):
                continue
            if not match_fields(raw, params.get("fieldSelector")):
                continue
            out.append(raw)
        return out

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        async with self._lock:
            items = self._matching(request, dict(request.params))
            rv = str(self.rv)
        kind = (request.resource.plural or "").rstrip("s").capitalize() + "List"
        return {"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": rv}, "items": items}

    async def _serve_watch(self, request: rendering.Request):
        yield b""
        params = dict(request.params)
        since = params.get("resourceVersion") or "0"
        timeout = float(params.get("timeoutSeconds") or 0) or None
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        bus = self._buses[request.resource]
        marker = await bus.mark()  # subscribe before replaying, so nothing falls in between
        try:
            async with self._lock:
                objs = self._matching(request, params)
            seen = set()  # what this watcher was shown: an object that stops matching is DELETED for it
            for raw in objs:
                seen.add((raw["metadata"].get("namespace"), raw["metadata"]["name"]))
                if since in ("", "0") or int(raw["metadata"].get("resourceVersion", "0")) > int(since):
                    yield {"type": "ADDED", "object": raw}
            stream = bus.stream(since=marker)
            async for event in self._until(stream, deadline, loop):
                meta = event.get("object", {}).get("metadata", {})
                key = (meta.get("namespace"), meta.get("name"))
                if self._filter_event(request, params, event):
                    if event.get("type") == "DELETED":
                        seen.discard(key)
                    else:
                        seen.add(key)
                    yield event
                elif key in seen and event.get("type") != "DELETED":
                    seen.discard(key)
                    yield {"type": "DELETED", "object": event["object"]}
        finally:
            try:
                await bus.unmark(marker)
            except ValueError:
                pass

    @staticmethod
    async def _until(stream: Any, deadline: float | None, loop: asyncio.AbstractEventLoop):
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return
            try:
                yield await asyncio.wait_for(stream.__anext__(), remaining)
            except (asyncio.TimeoutError, StopAsyncIteration):
                return

    def _filter_event(self, request: rendering.Request, params: dict, event: dict) -> bool:
        raw = event.get("object", {})
        meta = raw.get("metadata", {})
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return False
        if request.name is not None and meta.get("name") != request.name:
            return False
        if not match_labels(meta.get("labels") or {}, params.get("labelSelector")):
            return False
        return match_fields(raw, params.get("fieldSelector"))


# -- the fake kubelet ----------------------------------------------------------------------------

def _pod_node(pod: dict) -> str | None:
    spec = pod.get("spec", {})
    if spec.get("nodeName"):
        return spec["nodeName"]
    terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for expr in (term.get("matchFields") or []):
            if expr.get("key") == "metadata.name" and expr.get("operator") == "In" and expr.get("values"):
                return expr["values"][0]
        for expr in (term.get("matchExpressions") or []):
            if expr.get("key") == "kubernetes.io/hostname" and expr.get("operator") == "In" and expr.get("values"):
                return expr["values"][0]
    return (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")


def _pod_gpus(pod: dict) -> int:
    total = 0
    for c in pod.get("spec", {}).get("containers", []):
        lim = (c.get("resources") or {}).get("limits") or {}
        total += int(lim.get("nvidia.com/gpu", 0) or 0)
    return total


def _terminated(container: dict, code: int) -> dict:
    now = _now()
    return {"name": container["name"], "ready": False, "restartCount": 0, "image": container.get("image", ""),
            "imageID": "", "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                                    "startedAt": now, "finishedAt": now}}}


def _node_ready(node: dict) -> bool:
    for cond in node.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True


CONTAINER_ENV = "KUBE_FIXTURE_CONTAINER"


def _kill_container(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL every process of the "container" (all carry its marker in their environment, the
    kernel papermill starts in a session of its own too), as the end of a real container does."""
    marker = getattr(proc, "container_marker", None)
    if marker is None:
        return
    tag = f"{CONTAINER_ENV}={marker}\0".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if environ.startswith(tag) or b"\0" + tag in environ:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


async def _run_container(api: FakeKube, ns: str, name: str, container: dict) -> asyncio.subprocess.Process:
    """Start a container's command as a local process (its stdout becomes the pod's log)."""
    env = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}
    marker = f"{ns}/{name}/{uuid.uuid4().hex}"
    env[CONTAINER_ENV] = marker
    for e in container.get("env", []):
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        env[e["name"]] = api.secret_value(ns, ref["name"], ref["key"]) or "" if ref else e.get("value", "")
    cmd = [*container.get("command", []), *container.get("args", [])]
    cwd = container.get("workingDir")
    proc = await asyncio.create_subprocess_exec(*cmd, env=env, cwd=cwd if cwd and os.path.isdir(cwd) else None,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    proc.container_marker = marker  # type: ignore[attr-defined]

    async def read() -> None:
        assert proc.stdout is not None
        while True:
            chunk = await proc.stdout.read(4096)
            if not chunk:
                break
            api.logs[(ns, name)] = api.logs.get((ns, name), "") + chunk.decode(errors="replace")
        await proc.wait()

    asyncio.get_running_loop().create_task(read())
    return proc


async def fake_kubelet(api: FakeKube, interval: float = 0.05) -> None:
    """Moves pods through their lives (see the module docstring). Runs until cancelled."""
    ip = 10
    loop = asyncio.get_running_loop()
    deleting: dict[tuple, float] = {}
    while True:
        await asyncio.sleep(interval)
        async with api._lock:
            nodes = {name: obj.raw for (res, _, name), obj in api._objects.items() if res == NODES and not obj.deleted}
            pods = [(ns, name, obj.raw) for (res, ns, name), obj in api._objects.items()
                    if res == PODS and not obj.deleted]
            # a pod removed from the API at once (deleted with grace 0): the kubelet kills its container
            live = {(ns, name, pod["metadata"].get("uid")) for ns, name, pod in pods}
            for pkey in [k for k in api.procs if k not in live]:
                _kill_container(api.procs.pop(pkey))
            for ns, name, pod in pods:
                meta, status = pod["metadata"], pod.get("status", {})
                phase = status.get("phase", "Pending")
                behave = api.behaviours.get((ns, name)) or api.behaviours.get(meta.get("labels", {}).get("gpupool.io/job-id")) or {}
                pkey = (ns, name, meta.get("uid"))
                proc = api.procs.get(pkey)
                if proc is not None:  # a pod whose command really runs here
                    if meta.get("deletionTimestamp"):
                        grace = float(meta.get("deletionGracePeriodSeconds", 30))
                        if pkey not in deleting:
                            deleting[pkey] = (loop.time() + grace, grace)
                            if proc.returncode is None:
                                proc.send_signal(signal.SIGTERM)  # the kubelet stops the container
                        elif grace < deleting[pkey][1]:
                            deleting[pkey] = (min(deleting[pkey][0], loop.time() + grace), grace)
                        if proc.returncode is None and loop.time() >= deleting[pkey][0]:
                            _kill_container(proc)  # grace over: the whole container goes
                    if proc.returncode is not None and phase not in ("Succeeded", "Failed"):
                        _kill_container(proc)  # PID 1 ended: so does everything else in the container
                        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
                        await api.patch_object(PODS, ns, name, {"status": {
                            "phase": "Succeeded" if code == 0 else "Failed",
                            "containerStatuses": [_terminated(c, code) for c in pod["spec"].get("containers", [])]}})
                    if proc.returncode is not None and meta.get("deletionTimestamp"):
                        deleting.pop(pkey, None)
                        api.procs.pop(pkey, None)
                        await api.remove_object(PODS, ns, name)
                    continue
                if meta.get("deletionTimestamp"):
                    key = (ns, name, meta.get("uid"))
                    grace = float(meta.get("deletionGracePeriodSeconds", 30))
                    if key not in deleting:
                        early = behave.get("exit_on_term_after")
                        deleting[key] = (loop.time() + (min(grace, early) if early is not None else grace), grace)
                        if behave.get("log_on_term"):
                            api.logs[(ns, name)] = api.logs.get((ns, name), "") + behave["log_on_term"]
                    elif grace < deleting[key][1]:  # deleted again with a shorter grace period
                        deleting[key] = (min(deleting[key][0], loop.time() + grace), grace)
                    if loop.time() >= deleting[key][0]:
                        early = behave.get("exit_on_term_after") is not None
                        code = int(behave.get("exit_code", 0 if early else 137)) if early else 137
                        deleting.pop(key, None)
                        if pod.get("spec", {}).get("nodeName"):  # the container's end is seen before the pod goes
                            await api.patch_object(PODS, ns, name, {"status": {
                                "phase": "Succeeded" if code == 0 else "Failed",
                                "containerStatuses": [_terminated(c, code) for c in pod["spec"].get("containers", [])]}})
                        await api.remove_object(PODS, ns, name)
                    continue
                if phase != "Pending":
                    continue
                node_name = _pod_node(pod)
                if node_name is None:  # no constraint: like the kube-scheduler, any fitting node
                    sel = pod.get("spec", {}).get("nodeSelector") or {}
                    node_name = next((n for n, obj in sorted(nodes.items())
                                      if not obj.get("spec", {}).get("unschedulable") and _node_ready(obj)
                                      and all((obj["metadata"].get("labels") or {}).get(k) == v for k, v in sel.items())),
                                     None)
                node = nodes.get(node_name) if node_name else None
                reason = None
                if node is None:
                    reason = f"node {node_name!r} not found" if node_name else "no node chosen"
                elif node.get("spec", {}).get("unschedulable"):
                    reason = f"node {node_name} is cordoned"
                elif not _node_ready(node):
                    reason = f"node {node_name} is NotReady"
                else:
                    used = sum(_pod_gpus(p) for n2, nm2, p in pods
                               if (n2, nm2) != (ns, name) and p.get("spec", {}).get("nodeName") == node_name
                               and p.get("status", {}).get("phase") in ("Running", "Pending"))
                    alloc = int((node.get("status", {}).get("allocatable") or {}).get("nvidia.com/gpu", 0) or 0)
                    if _pod_gpus(pod) and used + _pod_gpus(pod) > alloc:
                        reason = f"0/1 nodes are available: 1 Insufficient nvidia.com/gpu on {node_name}"
                if not reason and behave.get("waiting_reason"):  # e.g. ImagePullBackOff: scheduled, never starts
                    if not status.get("containerStatuses"):
                        await api.patch_object(PODS, ns, name, {"spec": {"nodeName": node_name}, "status": {
                            "conditions": [{"type": "PodScheduled", "status": "True"}],
                            "containerStatuses": [{"name": c["name"], "ready": False, "restartCount": 0,
                                                   "image": c.get("image", ""), "imageID": "",
                                                   "state": {"waiting": {"reason": behave["waiting_reason"],
                                                                         "message": behave.get("waiting_message", "")}}}
                                                  for c in pod.get("spec", {}).get("containers", [])]}})
                    continue
                if reason:
                    conds = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": reason}]
                    if status.get("conditions") != conds:
                        await api.patch_object(PODS, ns, name, {"status": {"conditions": conds}})
                    continue
                containers = pod.get("spec", {}).get("containers", [])
                refs = [e["valueFrom"]["secretKeyRef"] for c in containers for e in c.get("env", [])
                        if (e.get("valueFrom") or {}).get("secretKeyRef")]
                missing = [r["name"] for r in refs if api.secret_value(ns, r["name"], r["key"]) is None]
                if missing:  # the kubelet waits for the Secret
                    if not status.get("containerStatuses"):
                        await api.patch_object(PODS, ns, name, {"spec": {"nodeName": node_name}, "status": {
                            "containerStatuses": [{"name": c["name"], "ready": False, "restartCount": 0, "image": c.get("image", ""),
                                                   "imageID": "", "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                                                        "message": f'secret "{missing[0]}" not found'}}}
                                                  for c in containers]}})
                    continue
                ip += 1
                now = _now()
                if api.run_jobs and (meta.get("labels") or {}).get("gpupool.io/component") == "job":
                    api.procs[(ns, name, meta.get("uid"))] = await _run_container(api, ns, name, containers[0])
                await api.patch_object(PODS, ns, name, {
                    "spec": {"nodeName": node_name},
                    "status": {
                        "phase": "Running", "podIP": f"10.0.0.{ip % 250 + 2}", "hostIP": "192.168.0.1",
                        "startTime": now,
                        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                        "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0, "image": c.get("image", ""),
                                               "imageID": "", "started": True, "state": {"running": {"startedAt": now}}}
                                              for c in containers],
                    }})


class KubeCluster:
    """The test API server in its own thread. ``url`` is its address; the helpers add nodes
    and foreign pods, read objects, set logs and end pods, from any thread."""

    def __init__(self, run_jobs: bool = False) -> None:
        self.api = FakeKube(run_jobs=run_jobs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.port = 0

    # lifecycle
    def __enter__(self) -> "KubeCluster":
        self._thread = threading.Thread(target=self._run, name="fake-kube", daemon=True)
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the test Kubernetes API did not start")
        if self._error:
            raise self._error
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(15)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as e:  # noqa: BLE001 - reported to the starting thread
            self._error = e
            self._ready.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with self.api, kmock.Server(self.api) as server:
            self.port = server.port
            kubelet = asyncio.create_task(fake_kubelet(self.api))
            self._ready.set()
            await self._stop.wait()
            kubelet.cancel()
            try:
                await kubelet
            except asyncio.CancelledError:
                pass
            for proc in list(self.api.procs.values()):  # no process outlives the cluster
                _kill_container(proc)
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, path: str, namespace: str = "default") -> str:
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
               "clusters": [{"name": "test", "cluster": {"server": self.url}}],
               "users": [{"name": "test", "user": {"token": "test"}}],
               "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": namespace}}]}
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        return path

    def call(self, fn: Callable[[], Any], timeout: float = 10) -> Any:
        """Run the coroutine function ``fn`` in the server's loop and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout)

    # helpers
    def add_node(self, name: str, gpus: int = 0, *, product: str = "NVIDIA-A100-SXM4-80GB", memory_mib: int = 81920,
                 labels: dict | None = None, unschedulable: bool = False, ready: bool = True, cpu: str = "32",
                 memory: str = "256Gi", uuids: list[str] | None = None, gfd: bool = True) -> dict:
        lab = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
        if gpus and gfd:
            lab.update({"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": str(memory_mib),
                        "nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.present": "true"})
        lab.update(labels or {})
        res = {"cpu": cpu, "memory": memory, "pods": "110"}
        if gpus:
            res["nvidia.com/gpu"] = str(gpus)
        node: dict = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lab},
                      "spec": {"unschedulable": True} if unschedulable else {},
                      "status": {"capacity": dict(res), "allocatable": dict(res),
                                 "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
        if uuids:
            node["metadata"]["annotations"] = {"gpupool.io/gpu-uuids": ",".join(uuids)}

        async def go() -> dict:
            async with self.api._lock:
                return await self.api.create_object(NODES, None, node)
        return self.call(go)

    def patch_node(self, name: str, patch: dict) -> dict | None:
        async def go() -> dict | None:
            async with self.api._lock:
                return await self.api.patch_object(NODES, None, name, patch)
        return self.call(go)

    def add_pod(self, name: str, *, namespace: str = "default", node: str | None = None, gpus: int = 0,
                labels: dict | None = None, annotations: dict | None = None, phase: str | None = None,
                cpu: str | None = None) -> dict:
        """A pod created the way another tool would (e.g. a foreign GPU pod on ``node``)."""
        res: dict = {}
        if gpus:
            res["limits"] = {"nvidia.com/gpu": str(gpus)}
        if cpu:
            res["requests"] = {"cpu": cpu}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
               "spec": {"containers": [{"name": "main", "image": "busybox", "resources": res}],
                        **({"nodeName": node} if node else {})}}

        async def go() -> dict:
            async with self.api._lock:
                raw = await self.api.create_object(PODS, namespace, pod)
                if phase:
                    raw = await self.api.patch_object(PODS, namespace, name, {"status": {"phase": phase}})
                return raw
        return self.call(go)

    def pods(self, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        async def go() -> list[dict]:
            async with self.api._lock:
                return [json.loads(json.dumps(obj.raw)) for (res, ns, name), obj in self.api._objects.items()
                        if res == PODS and not obj.deleted and (namespace is None or ns == namespace)
                        and match_labels(obj.raw.get("metadata", {}).get("labels") or {}, selector)]
        return self.call(go)

    def pod(self, name: str, namespace: str = "default") -> dict | None:
        found = [p for p in self.pods(namespace) if p["metadata"]["name"] == name]
        return found[0] if found else None

    def delete_pod(self, name: str, namespace: str = "default") -> None:
        async def go() -> None:
            async with self.api._lock:
                await self.api.remove_object(PODS, namespace, name)
        self.call(go)

    def set_log(self, name: str, text: str, namespace: str = "default") -> None:
        self.api.logs[(namespace, name)] = text

    def behave(self, key: str | tuple, **behaviour: Any) -> None:
        """``key``: a job id (label gpupool.io/job-id) or (namespace, pod name). Behaviours:
        ``exit_on_term_after`` seconds (the pod exits that soon after SIGTERM instead of using
        its whole grace), ``log_on_term`` (text appended to its log on SIGTERM), ``waiting_reason`` / ``waiting_message``
        (its container never starts, e.g. ``ImagePullBackOff``)."""
        self.api.behaviours[key] = behaviour

    def finish_pod(self, name: str, exit_code: int = 0, namespace: str = "default", log: str | None = None) -> None:
        """The pod's container exits with ``exit_code`` (phase Succeeded or Failed)."""
        if log is not None:
            self.set_log(name, log, namespace)

        async def go() -> None:
            async with self.api._lock:
                pod = self.api._objects[(PODS, namespace, name)].raw
                statuses = [_terminated(c, exit_code) for c in pod["spec"]["containers"]]
                await self.api.patch_object(PODS, namespace, name, {"status": {
                    "phase": "Succeeded" if exit_code == 0 else "Failed", "containerStatuses": statuses}})
        self.call(go)

    @property
    def requests(self) -> list:
        """Every request the server received (kmock Request objects: url, params, data...)."""
        return list(self.api._requests)

    @property
    def deletions(self) -> list[dict]:
        return list(self.api.deletions)


def service_config(cluster: "KubeCluster", tmp: Any, user: str) -> str:
    """The ``extra_config`` of a test hub (tests/support/hub_harness.py) whose gpupool service runs jobs as
    pods on ``cluster`` (namespace ``jobs``, the real Python in the pods, ``user``'s home under
    ``tmp/home`` mounted in them): a ``GPUPoolKubernetes`` file the service is pointed at."""
    kube_cfg = tmp / "kube.json"
    kube_cfg.write_text(json.dumps({"GPUPoolKubernetes": {
        "api_host": cluster.url, "namespace": "jobs", "image": "lab/notebook:1", "python": sys.executable,
        "home_claim": "claim-{username}", "home_mount": str(tmp / "home" / user), "jobs_claim": "gpupool-jobs",
        "image_from_workspace": False}}))
    return ("for _s in c.JupyterHub.services:\n"
            "    if _s['name'] == 'gpupool':\n"
            f"        _s['environment']['GPUPOOL_KUBE_CONFIG'] = {str(kube_cfg)!r}\n")


@pytest.fixture
def kube(tmp_path, monkeypatch):
    """A running test Kubernetes API; the default kubeconfig of kubernetes_asyncio points at it
    (so KubeSpawner's load_config finds it)."""
    from kubernetes_asyncio.config import kube_config

    with KubeCluster() as cluster:
        path = cluster.kubeconfig(str(tmp_path / "kubeconfig"))
        monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", path)
        yield cluster
