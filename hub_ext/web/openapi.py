"""The OpenAPI 3.1 description of the REST API, built from the pydantic models of
:mod:`.schemas` (the same ones that validate requests) and from the scope each handler declares
(web/scopes.py): ``GET api/v1/openapi.json``.

To document a new endpoint add an :class:`Op` to :data:`OPERATIONS`; a new field of a request or
an answer appears here by itself once it is in its model.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ... import __version__ as _version
from ... import contract as C
from . import schemas as S
from .base import BaseHandler
from .cluster import HealthHandler, MetricsHandler, QueuesHandler
from .jobs import JobHandler, JobLogHandler, JobMetricsHandler, JobOutputHandler, JobsHandler
from .nodes import NodeActionHandler, NodesHandler
from .policies import EffectivePoliciesHandler, EffectivePolicyList, EffectivePolicyQuery
from .pools import PoolsHandler
from .scopes import ADMIN_SCOPE, PUBLIC, need_of, needs_scope
from .suspensions import ResumeHandler, SuspensionsHandler
from .usage import UsageHandler, UsageHistoryHandler
from .workspaces import WorkspaceHandler, WorkspacesHandler

REF = "#/components/schemas/{model}"
_ERRORS = {400: "bad input: `field` names it", 401: "no token, or a token the hub does not accept",
           403: "no gpupool scope, or not yours", 404: "no such job, workspace, suspension or node",
           409: "already resumed, the hub refused to start the server (e.g. it runs already), or a node the "
                "backend holds out of service",
           502: "the hub could not be reached or failed", 503: "the database refused the request (try again)"}


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    summary: str
    handler: type  # what answers it: its method's declared scope is the operation's security
    answer: Any = None  # a model, or a media type for text answers
    status: int = 200
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    errors: tuple[int, ...] = (401, 403)
    headers: dict[str, str] = field(default_factory=dict)
    example: dict | None = None
    also: tuple[str, ...] = ()  # other media types of the answer (text)

    @property
    def auth(self) -> bool:
        """Whether a token is needed (a scope needed only when a knob is set is documented as none)."""
        need = need_of(self.handler, self.method)
        return need is not None and need.scope is not None and not need.unless

    @property
    def admin(self) -> bool:
        need = need_of(self.handler, self.method)
        return need is not None and need.scope == ADMIN_SCOPE


class OpenAPIHandler(BaseHandler):
    """The OpenAPI 3.1 description of this API; no token needed (it holds no data, only shapes)."""

    @needs_scope(PUBLIC)
    def get(self) -> None:
        self.send(document(self.settings["gpupool_api_path"], tuple(self.svc.access.leaves)))


_NOTEBOOK = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
             "cells": [{"cell_type": "code", "id": "c0", "metadata": {}, "source": "print(lr)", "outputs": [],
                        "execution_count": None}]}
OPERATIONS = (
    Op("get", "/health", "Liveness and the number of scheduling cycles run", HealthHandler, S.Health, errors=()),
    Op("get", "/openapi.json", "This document", OpenAPIHandler, "application/json", errors=()),
    Op("get", "/metrics", "Prometheus metrics (a token only with c.GPUPool.metrics_require_auth)",
       MetricsHandler, "text/plain", errors=()),
    Op("get", "/queues", "Queues with quota, fair share, allocation and whether you may submit", QueuesHandler,
       S.QueueList,
       query=S.QueuesQuery, errors=(400, 401, 403)),
    Op("get", "/policies/effective", "The workload policy of a leaf queue (default: every one), per kind: defaults "
       "and limits, each with the queue or department that sets it", EffectivePoliciesHandler, EffectivePolicyList,
       query=EffectivePolicyQuery, errors=(400, 401, 403)),
    Op("get", "/pools", "Node pools: their GPUs, what they hold and what waits for them", PoolsHandler, S.PoolList),
    Op("get", "/nodes", "Nodes and their GPUs with allocations, live readings and whether each is in service",
       NodesHandler, S.NodeList),
    *(Op("post", f"/nodes/{{name}}/{action}", summary, NodeActionHandler, S.NodeAction, body=S.NodeActionRequest,
         errors=(400, 401, 403, 404, *((409,) if action == "return" else ())), example={"reason": "kernel update"})
      for action, summary in (
          ("drain", "Drain a node: no new placements; its workloads checkpoint and leave (grace period)"),
          ("fail", "Fail a node: its workloads stop at once and are requeued from their last checkpoint"),
          ("return", "Return a node to service (409 while the backend holds it out)"))),
    Op("get", "/jobs", "Your jobs (admins: everyone's), filtered", JobsHandler, S.JobList, query=S.JobListQuery,
       errors=(400, 401, 403)),
    Op("post", "/jobs", "Submit a notebook job", JobsHandler, S.Job, 201, body=S.JobRequest, errors=(400, 401, 403, 503),
       example={"notebook_content": _NOTEBOOK, "parameters": {"lr": 0.1}, "gpus": 0.5, "name": "example"}),
    Op("get", "/jobs/{job_id}", "One job", JobHandler, S.Job, errors=(401, 403, 404)),
    Op("delete", "/jobs/{job_id}", "Cancel a job (a running one stops with the grace period)", JobHandler, S.Job,
       errors=(401, 403, 404)),
    Op("get", "/jobs/{job_id}/log", "The log (papermill's or the program's) from a byte offset", JobLogHandler,
       "text/plain",
       query=S.LogQuery,
       errors=(400, 401, 403, 404), headers={"X-Log-Offset": "the offset to ask for next"}),
    Op("get", "/jobs/{job_id}/output", "The executed notebook (404 until one exists)", JobOutputHandler,
       "application/x-ipynb+json",
       query=S.RankQuery, errors=(400, 401, 403, 404)),
    Op("post", "/jobs/{job_id}/metrics", "Log a metric of a job (its owner or the job's own token)", JobMetricsHandler,
       S.MetricOut,
       201, body=S.MetricRequest, errors=(400, 401, 403, 404), example={"name": "val_acc", "value": 0.91, "step": 3}),
    Op("get", "/workspaces", "Active workspaces (env only for their owner and admins)", WorkspacesHandler,
       S.WorkspaceList),
    *(op for suffix in ("/workspaces/{user}", "/workspaces/{user}/{server}") for op in (
        Op("get", suffix, "A workspace (its owner or an admin)", WorkspaceHandler, S.Workspace, errors=(401, 403, 404)),
        Op("post", suffix, "Ask for admission of a server (admin: the spawner); 201 new, 200 the same request",
           WorkspaceHandler, S.Workspace, 201, body=S.WorkspaceRequest, errors=(400, 401, 403, 503),
           example={"gpus": 1}),
        Op("delete", suffix, "Free a workspace's GPUs (admin: the spawner)", WorkspaceHandler, S.Workspace,
           errors=(401, 403, 404)),
    )),
    Op("get", "/usage", "GPU-hours allocated and used, grouped (yours; admins: everyone's or user's)", UsageHandler,
       S.Usage,
       query=S.UsageQuery, errors=(400, 401, 403), also=("text/csv",),
       headers={"Content-Disposition": "with format=csv: attachment; filename=gpupool-usage-by-<by>.csv"}),
    Op("get", "/usage/history", "Stored NVML readings per GPU (of one workload: its owner or an admin)",
       UsageHistoryHandler, S.UsageHistory, query=S.UsageHistoryQuery, errors=(400, 401, 403, 404)),
    Op("get", "/suspensions", "Workspaces suspended by an idle rule or their maximum run time (yours; admins: "
       "everyone's)", SuspensionsHandler, S.SuspensionList, query=S.SuspensionsQuery, errors=(400, 401, 403)),
    Op("post", "/suspensions/{suspension_id}/resume", "Start a suspended server again with the same options "
       "(its owner or an admin)", ResumeHandler, S.Suspension, 202, errors=(401, 403, 404, 409, 502)),
)
_PATH_PARAMS = {
    "job_id": {"type": "string", "pattern": C.JOB_ID_PATTERN, "description": "a job id such as j-000042"},
    "user": {"type": "string", "description": "a JupyterHub user name"},
    "server": {"type": "string", "description": "a named server ('' is the default server)"},
    "name": {"type": "string", "description": "a node's name (GET nodes)"},
    "suspension_id": {"type": "string", "pattern": rf"^[0-9]{{1,{C.ID_DIGITS}}}$",
                      "description": "a suspension's id (GET suspensions)"},
}


def _query_params(model: type[BaseModel]) -> list[dict]:
    schema = model.model_json_schema()
    out = []
    for name, prop in schema.get("properties", {}).items():
        prop = dict(prop)
        alts = [a for a in prop.pop("anyOf", []) if a.get("type") != "null"]
        if alts:
            prop.update(alts[0])
        prop.pop("default", None)
        prop.pop("title", None)
        out.append({"name": name, "in": "query", "required": name in schema.get("required", []),
                    "description": prop.pop("description", ""), "schema": prop})
    return out


def _only_queues(prop: dict, queues: tuple[str, ...]) -> None:
    """A ``queue`` property (optional) limited to this pool's leaf queues."""
    prop.pop("anyOf", None)
    prop["anyOf"] = [{"enum": list(queues), "type": "string"}, {"type": "null"}]
    prop["description"] = "a leaf queue of this pool you may use (default: your first)"


@functools.lru_cache(maxsize=None)
def _document(server: str, queues: tuple[str, ...]) -> dict:
    models = sorted({m for op in OPERATIONS for m in (op.answer, op.body) if isinstance(m, type)} | {S.Error},
                    key=lambda m: m.__name__)
    _, defs = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    schemas = defs.get("$defs", {})
    if queues:  # this deployment's queues (the service answers 400 for any other)
        for model in (S.JobRequest, S.WorkspaceRequest):
            _only_queues(schemas[model.__name__]["properties"]["queue"], queues)
    paths: dict[str, dict] = {}
    for op in OPERATIONS:
        params = [{"name": n, "in": "path", "required": True, "schema": _PATH_PARAMS[n]}
                  for n in _PATH_PARAMS if "{" + n + "}" in op.path]
        if op.query is not None:
            params += _query_params(op.query)
        if isinstance(op.answer, type):
            content = {"application/json": {"schema": {"$ref": REF.format(model=op.answer.__name__)}}}
        else:
            content = {op.answer: {"schema": {"type": "object"} if "json" in op.answer else {"type": "string"}}}
        content.update({media: {"schema": {"type": "string"}} for media in op.also})
        ok: dict[str, Any] = {"description": op.summary, "content": content}
        if op.headers:
            ok["headers"] = {h: {"description": d, "schema": {"type": "string"}} for h, d in op.headers.items()}
        responses = {str(op.status): ok}
        if op.method == "post" and op.status == 201 and op.path.startswith("/workspaces"):
            responses["200"] = {"description": "the same request existed already", "content": content}
        for code in op.errors:
            responses[str(code)] = {"description": _ERRORS[code],
                                    "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}}
        operation: dict[str, Any] = {"summary": op.summary, "operationId": f"{op.method}_{op.path}",
                                     "parameters": params, "responses": responses}
        if not op.auth:
            operation["security"] = []
        elif op.admin:  # OpenAPI 3.1: the roles a bearer token needs
            operation["security"] = [{"token": [ADMIN_SCOPE]}]
            operation["description"] = f"Needs the {ADMIN_SCOPE} scope."
        if op.body is not None:
            media: dict[str, Any] = {"schema": {"$ref": REF.format(model=op.body.__name__)}}
            if op.example:
                media["example"] = op.example
            optional = op.body in (S.WorkspaceRequest, S.NodeActionRequest)  # an empty body is fine
            operation["requestBody"] = {"required": op.method == "post" and not optional,
                                        "content": {"application/json": media}}
        paths.setdefault(op.path, {})[op.method] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpupool", "version": _version,
                 "description": "The gpupool service's REST API (docs/api.md). Every error answer is an "
                                "`Error`; a 400 names the field at fault."},
        "servers": [{"url": server}],
        "security": [{"token": []}],
        "components": {"schemas": schemas, "securitySchemes": {"token": {
            "type": "http", "scheme": "bearer",
            "description": "a JupyterHub API token with a custom:gpupool:* scope "
                           "(`Authorization: token <token>` works too)"}}},
        "paths": paths,
    }


def document(server: str = "/services/gpupool/api/v1", queues: tuple[str, ...] = ()) -> dict:
    """The OpenAPI document; ``server`` is the API's URL (path) where the service runs, ``queues``
    the pool's leaf queues (what ``queue`` may name in a request)."""
    return copy.deepcopy(_document(server, tuple(queues)))

