"""gpupool's JupyterHub integration: ``configure(c)`` in ``jupyterhub_config.py``.

::

    from gpupool.hub_ext import configure
    configure(c)
    c.GPUPool.queues = [{"name": "vision", "deserved": {"gpu": 2}, "users": ["alice"]}]
    c.GPUPool.nodes = [{"name": "box", "gpus": 4, "gpu_memory": "24Gi"}]

See docs/hub.md.
"""
from __future__ import annotations

import importlib
import logging
import os
import secrets
import socket
import sys
from typing import Any

from .config import GPUPool, GPUPoolConfigError, load, to_json
from .web.home import home_notices
from .web.scopes import ADMIN_SCOPE, SUBMIT_SCOPE

__all__ = ["configure", "add_idle_culler", "service_endpoint", "GPUPool", "GPUPoolConfigError", "SUBMIT_SCOPE",
           "ADMIN_SCOPE"]

SERVER_ROLE_SCOPES = ["users:activity!user", "access:servers!server"]  # JupyterHub's `server` role
SPAWNER_CLASS = "gpupool.spawner.LocalGPUSpawner"

log = logging.getLogger("gpupool")


def _merge_role(roles: list[dict], name: str, scopes: list[str], **members: list[str]) -> None:
    for role in roles:
        if role.get("name") == name:
            role["scopes"] = list(dict.fromkeys([*role.get("scopes", []), *scopes]))
            for key, names in members.items():
                role[key] = list(dict.fromkeys([*role.get(key, []), *names]))
            return
    roles.append({"name": name, "scopes": list(scopes), **{k: list(v) for k, v in members.items()}})


def _value(section: Any, key: str, default: Any) -> Any:
    """A config value, resolving traitlets' lazy ``c.X.y.append(...)`` containers."""
    if key not in section:
        return default
    value = section[key]
    get_value = getattr(value, "get_value", None)
    if get_value is not None:  # LazyConfigValue
        return get_value(default)
    return value


def _spawner_available() -> bool:
    try:
        mod = importlib.import_module("gpupool.spawner")
    except Exception:
        return False
    return hasattr(mod, "LocalGPUSpawner")


class _AtStart(str):
    """A callable environment value (JupyterHub calls it when it starts the service) that is also
    a string: JupyterHub stores each service's environment in its database as JSON, where a plain
    function is logged as "Non-jsonable data" at every start; this stores a note instead."""

    def __new__(cls, compute: Any) -> "_AtStart":
        obj = super().__new__(cls, "(computed by gpupool when JupyterHub starts the service)")
        obj.compute = compute
        return obj

    def __call__(self, spawner: Any = None) -> str:
        return self.compute(spawner)


def configure(c: Any, *, spawner: bool = True) -> None:
    """Register the gpupool service, its scopes and roles in a JupyterHub config ``c``.

    * ``c.JupyterHub.services``: the managed service ``gpupool`` (``python -m
      gpupool.hub_ext.app`` on ``127.0.0.1:c.GPUPool.port``), with ``oauth_no_confirm``;
    * ``c.JupyterHub.custom_scopes``: ``custom:gpupool:submit`` and ``custom:gpupool:admin``;
    * ``c.JupyterHub.load_roles``: every user gets ``submit`` (the ``user`` role); the service and
      the role ``gpupool-admin`` get ``admin``; JupyterHub admins act as gpupool admins with any
      token that carries a gpupool scope;
    * ``c.Spawner.server_token_scopes`` gains ``submit``, so a notebook's own
      ``$JUPYTERHUB_API_TOKEN`` can submit jobs;
    * ``c.JupyterHub.spawner_class`` becomes ``gpupool.spawner.LocalGPUSpawner`` when that class
      exists and no spawner class was chosen (``spawner=False`` leaves it alone).

    ``c.GPUPool.*`` may be set before or after this call (except ``port`` and ``service_name``,
    which must come first). Whatever is already set is validated now; the complete configuration
    is validated again when the hub starts the service, and a bad entry stops the hub with a
    message naming it.
    """
    if "queues" in c.GPUPool or "nodes" in c.GPUPool:
        # early check of what is already there (NVML discovery waits for the start-up check)
        load(c, discover=False)
    pool = GPUPool(config=c)
    name = pool.service_name
    port = pool.port
    token = pool.api_token or secrets.token_hex(32)
    c.GPUPool.api_token = token  # the spawner (in the hub) reads it through service_endpoint()
    url = f"http://127.0.0.1:{port}"

    def _compute(_spawner: Any = None) -> str:
        # Called by JupyterHub when it starts the service: the config file has run completely.
        if _value(c.GPUPool, "port", port) != port or _value(c.GPUPool, "service_name", name) != name:
            raise GPUPoolConfigError(
                "c.GPUPool.port / c.GPUPool.service_name changed after configure(c); set them before calling configure(c)")
        settings = load(c, cwd=os.getcwd())
        if port_in_use(port):  # a second hub's service would die while its proxy routes to the first's
            raise GPUPoolConfigError(port_taken_message(port))
        return to_json(settings)

    _service_config = _AtStart(_compute)

    services = list(_value(c.JupyterHub, "services", []))
    services = [s for s in services if s.get("name") != name]
    services.append({
        "name": name,
        "url": url,
        "command": [sys.executable, "-m", "gpupool.hub_ext.app"],
        "environment": {"GPUPOOL_CONFIG": _service_config},
        "api_token": token,
        "oauth_no_confirm": True,
        # the dashboard's sign-in token carries the user's gpupool scopes (admins see everything)
        "oauth_client_allowed_scopes": [SUBMIT_SCOPE, ADMIN_SCOPE],
        "display": True,  # the hub's Services menu links the dashboard (every user may sign in to it)
    })
    c.JupyterHub.services = services

    scopes = dict(_value(c.JupyterHub, "custom_scopes", {}))
    scopes[SUBMIT_SCOPE] = {
        "description": "Submit, list and cancel your own gpupool jobs; see queues, nodes and workspaces.",
    }
    scopes[ADMIN_SCOPE] = {
        "description": "Administer the gpupool GPU pool: every user's jobs and workspaces.",
        "subscopes": [SUBMIT_SCOPE],
    }
    c.JupyterHub.custom_scopes = scopes

    roles = [dict(r) for r in _value(c.JupyterHub, "load_roles", [])]
    if not any(r.get("name") == "user" for r in roles):
        roles.append({"name": "user", "scopes": ["self"]})
    # access:services: every user may sign in to the service's dashboard page (JupyterHub OAuth)
    _merge_role(roles, "user", [SUBMIT_SCOPE, f"access:services!service={name}"])
    _merge_role(roles, "gpupool-admin", [ADMIN_SCOPE])
    # list:users + read:servers: the service checks which servers the hub runs (workspace reconcile);
    # servers: it starts a suspended workspace's server again when its owner resumes it (web/suspensions.py)
    _merge_role(roles, f"{name}-service", [ADMIN_SCOPE, "read:users", "read:groups", "list:users", "read:servers",
                                            "servers"],
                services=[name])
    c.JupyterHub.load_roles = roles

    # the home page says when a server was suspended for idle GPUs, with a one-click resume
    # (templates/hub/home.html; after the admin's own template paths, so theirs win)
    templates = os.path.join(os.path.dirname(__file__), "templates", "hub")
    paths = list(_value(c.JupyterHub, "template_paths", []))
    c.JupyterHub.template_paths = [*[p for p in paths if p != templates], templates]
    c.JupyterHub.template_vars = {**dict(_value(c.JupyterHub, "template_vars", {})), "gpupool_notices": home_notices}

    current = _value(c.Spawner, "server_token_scopes", None)
    if callable(current):
        def _with_gpupool(spawner: Any, _inner: Any = current) -> list[str]:
            return list(dict.fromkeys([*_inner(spawner), SUBMIT_SCOPE]))
        c.Spawner.server_token_scopes = _with_gpupool
    else:
        base = list(current) if current else list(SERVER_ROLE_SCOPES)
        c.Spawner.server_token_scopes = list(dict.fromkeys([*base, SUBMIT_SCOPE]))

    if spawner and "spawner_class" not in c.JupyterHub:
        if _spawner_available():
            c.JupyterHub.spawner_class = SPAWNER_CLASS
        else:
            log.warning("gpupool: %s is not available; keeping JupyterHub's spawner", SPAWNER_CLASS)


def port_taken_message(port: int) -> str:
    return (f"c.GPUPool.port: 127.0.0.1:{port} is in use (another hub's gpupool service?); give each hub its "
            "own port: c.GPUPool.port = N before configure(c)")


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on (or holds) ``host:port`` now."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is free
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


CULLER = "idle-culler"


def add_idle_culler(c: Any, *, timeout: int = 3600, every: int = 0, max_age: int = 0, concurrency: int = 10,
                    users: bool = False, admin_users: bool = True, remove_named_servers: bool = False) -> None:
    """Stop notebook servers idle for ``timeout`` seconds (their GPUs go back to the pool):
    jupyterhub-idle-culler as a managed hub service with the role it needs. ``every``: seconds
    between checks (0: timeout / 2); ``max_age``: stop servers older than this even when busy
    (0: never); ``users``: also delete idle users; z2jh's ``cull`` values map one to one."""
    if timeout <= 0:
        raise GPUPoolConfigError(f"idle culler: timeout must be > 0 seconds, not {timeout!r}")
    every = every or max(1, timeout // 2)
    cmd = [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={int(timeout)}", f"--cull-every={int(every)}",
           f"--concurrency={int(concurrency)}", f"--max-age={int(max_age)}"]
    if users:
        cmd += ["--cull-users=true", f"--cull-admin-users={str(bool(admin_users)).lower()}"]
    if remove_named_servers:
        cmd.append("--remove-named-servers=true")
    services = [sv for sv in _value(c.JupyterHub, "services", []) if sv.get("name") != CULLER]
    services.append({"name": CULLER, "command": cmd, "display": False})
    c.JupyterHub.services = services
    scopes = ["list:users", "read:users:activity", "read:servers", "delete:servers"]
    if users:
        scopes.append("admin:users")
    roles = [dict(r) for r in _value(c.JupyterHub, "load_roles", [])]
    _merge_role(roles, CULLER, scopes, services=[CULLER])
    c.JupyterHub.load_roles = roles


def service_endpoint(config: Any) -> dict[str, str]:
    """Where in-hub code (the GPU-aware spawner) reaches the service, from the hub's config:
    ``{"url": "http://127.0.0.1:10101/services/gpupool/api/v1/", "token": "..."}``."""
    pool = GPUPool(config=config)
    return {
        "url": f"http://127.0.0.1:{pool.port}/services/{pool.service_name}/api/v1/",
        "token": pool.api_token,
    }
