"""Model endpoints: a job of kind ``inference`` serves HTTP on ``$PORT`` behind a stable URL of the
service (docs/endpoints.md). The rules: what an endpoint's request may say (``replicas`` are its
workers, so the scheduler places them as it places a distributed job's; ``share`` names who else
may call it), who may call it, and its URL path.

The scheduler already treats ``inference`` as non-preemptible (``scheduler/model.py``
``DEFAULT_PREEMPTIBLE``), so an endpoint runs within its queue's deserved quota unless its request
says ``preemptible: true``.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from ... import contract as C
from .errors import APIError

_PREFIX = ["/services/gpupool/"]  # the service's URL prefix (set once at start: set_service_prefix)


def set_service_prefix(prefix: str) -> None:
    """The service's prefix under the hub (``JUPYTERHUB_SERVICE_PREFIX``), for the endpoints' URLs."""
    _PREFIX[0] = prefix.rstrip("/") + "/"


def service_prefix(service_name: str = "gpupool") -> str:
    """The prefix the service answers under: the hub's ``JUPYTERHUB_SERVICE_PREFIX``, else
    ``/services/<name>/``."""
    return os.environ.get("JUPYTERHUB_SERVICE_PREFIX") or f"/services/{service_name}/"


def url_path(job_id: str) -> str:
    """The endpoint's URL path through the hub: ``/services/gpupool/endpoints/j-000042/``."""
    return C.endpoint_path(_PREFIX[0], job_id)


def checked(request: Any, kind: str) -> Any:
    """The request with its ``replicas`` as its workers (``pods``); a 400 naming the field when
    ``replicas`` or ``share`` is given to a job that is not an endpoint, or ``pods`` disagrees."""
    replicas, share = getattr(request, "replicas", None), getattr(request, "share", None)
    if kind != C.INFERENCE:
        for field, value in (("replicas", replicas), ("share", share)):
            if value is not None:
                raise APIError(400, f"{field}: only an endpoint (kind: inference) has {field}"
                                    + ("; a distributed job has pods" if field == "replicas" else ""), field)
        return request
    if replicas is None:
        return request
    if request.pods is not None and request.pods != replicas:
        raise APIError(400, f"pods: an endpoint's workers are its replicas; give replicas ({replicas}) alone", "pods")
    return request.model_copy(update={"pods": replicas})


def may_call(row: Any, user: str, groups: Iterable[str]) -> bool:
    """Whether ``user`` (a member of ``groups``) may call the endpoint of ``row``: its owner, and the
    users and groups it is shared with."""
    if user == row.user:
        return True
    share = row.share or {}
    return user in (share.get("users") or ()) or bool(set(groups) & set(share.get("groups") or ()))


def view(row: Any) -> dict:
    """The endpoint fields of a job's answer (none for a job that is not an endpoint)."""
    if row.kind != C.INFERENCE:
        return {}
    state = row.endpoint_state if row.status == C.RUNNING and row.endpoint_state else C.EndpointState.STARTING.value
    return {"endpoint": url_path(row.public_id), "endpoint_state": state}
