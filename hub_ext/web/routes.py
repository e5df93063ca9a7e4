"""Every URL of the service, under its JupyterHub prefix (``/services/gpupool/``)."""
from __future__ import annotations

from . import dashboard, endpoints
from .cluster import HealthHandler, MetricsHandler, NotFoundHandler, QueuesHandler, RootHandler
from .jobs import JobHandler, JobLogHandler, JobMetricsHandler, JobOutputHandler, JobsHandler
from .nodes import NodeActionHandler, NodesHandler
from .openapi import OpenAPIHandler
from .policies import EffectivePoliciesHandler
from .pools import PoolsHandler
from .suspensions import ResumeHandler, SuspensionsHandler
from .usage import UsageHandler, UsageHistoryHandler
from .workspaces import WorkspaceHandler, WorkspacesHandler


def api_routes(prefix: str) -> list[tuple]:
    """The REST API (``<prefix>api/v1/...``), the service's root and the 404 of any other path."""
    api = prefix.rstrip("/") + "/api/v1"
    return [
        (rf"{api}/usage/?", UsageHandler),
        (rf"{api}/usage/history/?", UsageHistoryHandler),
        (rf"{api}/suspensions/?", SuspensionsHandler),
        (rf"{api}/suspensions/([^/]+)/resume/?", ResumeHandler),
        (rf"{api}/health/?", HealthHandler),
        (rf"{api}/openapi.json", OpenAPIHandler),
        (rf"{api}/metrics/?", MetricsHandler),
        (rf"{api}/queues/?", QueuesHandler),
        (rf"{api}/policies/effective/?", EffectivePoliciesHandler),
        (rf"{api}/pools/?", PoolsHandler),
        (rf"{api}/nodes/?", NodesHandler),
        (rf"{api}/nodes/([^/]+)/([^/]+)/?", NodeActionHandler),
        (rf"{api}/jobs/?", JobsHandler),
        (rf"{api}/jobs/([^/]+)/?", JobHandler),
        (rf"{api}/jobs/([^/]+)/log/?", JobLogHandler),
        (rf"{api}/jobs/([^/]+)/output/?", JobOutputHandler),
        (rf"{api}/jobs/([^/]+)/metrics/?", JobMetricsHandler),
        (rf"{api}/workspaces/?", WorkspacesHandler),
        (rf"{api}/workspaces/([^/]+)/?", WorkspaceHandler),
        (rf"{api}/workspaces/([^/]+)/([^/]*)/?", WorkspaceHandler),
        (rf"{prefix.rstrip('/')}/?", RootHandler),
        (r".*", NotFoundHandler),
    ]


def routes(prefix: str, service_name: str) -> list[tuple]:
    """Everything: the dashboard's pages first (it answers the service's root for browsers)."""
    return dashboard.routes(prefix, service_name) + endpoints.routes(prefix, service_name) + api_routes(prefix)
