"""The gpupool scopes and the one declaration of what each handler needs.

Every handler method says what its caller needs, once, with :func:`needs_scope` (as JupyterHub's
``@needs_scope``)::

    class JobsHandler(BaseHandler):
        @needs_scope(SUBMIT)
        def get(self): ...

``BaseHandler.prepare`` (web/base.py) enforces it before the method runs, and the OpenAPI
document (web/openapi.py) reads it for each operation's ``security``.

* :data:`PUBLIC`: no token;
* :data:`JOB`: ``custom:gpupool:submit`` (or admin), or the job's own token (``gpj_...``);
* :data:`SUBMIT`: ``custom:gpupool:submit`` (or admin); a job token is refused;
* :data:`ADMIN`: ``custom:gpupool:admin`` (a JupyterHub admin counts as one);
* :data:`METRICS`: no token, unless ``c.GPUPool.metrics_require_auth``, then as SUBMIT.

gpupool scopes take no filters. ``custom:gpupool:admin!group=cv`` would read as "admin of group
cv's users", which the service cannot honour (a queue, a workspace or a job is not a JupyterHub
resource the filter could name), so a role that grants a filtered gpupool scope stops the hub at
start (:func:`role_errors`, run by the configuration check), and a token that carries one anyway
(asked for through the hub's API) gets nothing from it beyond the submit scope: a filter never
makes a caller an admin.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

SUBMIT_SCOPE = "custom:gpupool:submit"
ADMIN_SCOPE = "custom:gpupool:admin"
GPUPOOL_SCOPES = (SUBMIT_SCOPE, ADMIN_SCOPE)


@dataclass(frozen=True)
class Need:
    """What a handler method needs of its caller."""

    scope: str | None  # None: no token
    job_token: bool = False  # a job's own token is accepted too
    unless: str = ""  # a c.GPUPool knob: the scope is needed only when it is True


PUBLIC = Need(None)
JOB = Need(SUBMIT_SCOPE, job_token=True)
SUBMIT = Need(SUBMIT_SCOPE)
ADMIN = Need(ADMIN_SCOPE)
METRICS = Need(SUBMIT_SCOPE, job_token=True, unless="metrics_require_auth")

_ATTR = "_gpupool_needs"


def needs_scope(need: Need) -> Callable[[Callable], Callable]:
    """Declare what a handler method needs (see the module's docstring)."""
    def mark(method: Callable) -> Callable:
        setattr(method, _ATTR, need)
        return method
    return mark


def need_of(handler: Any, method: str) -> Need | None:
    """The declaration of ``handler``'s (class or instance) ``method`` (``"get"``); None: none."""
    return getattr(getattr(handler, method.lower(), None), _ATTR, None)


def has_scope(scopes: Iterable[str], scope: str) -> bool:
    """Whether ``scopes`` (a token's, as the hub reports them) grant ``scope``. Only the scope
    itself does: a filtered form (``scope!group=cv``) does not grant it; the submit scope is also
    granted by a filtered gpupool scope (it gives only what is the caller's own)."""
    scopes = list(scopes)
    if scope in scopes:
        return True
    return scope == SUBMIT_SCOPE and any(s.split("!", 1)[0] in GPUPOOL_SCOPES for s in scopes)


def unfiltered(scopes: Iterable[str]) -> bool:
    """Whether ``scopes`` hold a gpupool scope without a filter."""
    return any(s in GPUPOOL_SCOPES for s in scopes)


def role_errors(roles: Iterable[Any]) -> list[str]:
    """The roles (``c.JupyterHub.load_roles``) that grant a gpupool scope with a filter."""
    out = []
    for i, role in enumerate(roles or []):
        if not isinstance(role, dict):
            continue
        for scope in role.get("scopes") or []:
            base, _, filt = str(scope).partition("!")
            if base in GPUPOOL_SCOPES and filt:
                out.append(f"c.JupyterHub.load_roles[{i}] ({role.get('name', '?')}): {scope!r}: gpupool scopes take "
                           f"no filter (the service cannot limit them to {filt!r}); grant {base!r} to the role's "
                           "members, or leave them out of it")
    return out
