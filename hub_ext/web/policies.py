"""``GET policies/effective?queue=``: the workload policy (domain/policies.py) a leaf queue's
workloads get, per kind, with where each value is set; its request and answer models (in the
OpenAPI document through openapi.py)."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field

from ... import contract as C
from ..domain import policies as P
from ..domain.errors import APIError
from .base import BaseHandler
from .schemas import Answer, Name, Query
from .scopes import SUBMIT, needs_scope


class EffectivePolicyQuery(Query):
    queue: Optional[Name] = Field(None, description="a leaf queue (default: every leaf queue)")


class PolicyValue(Answer):
    value: Any = Field(description="GPUs, cores, bytes, pods, seconds (run_time, idle_time), true/false "
                                   "(preemptible) or kind names (kinds)")
    set_by: str = Field(description="where it is set: 'queue vision' or 'department research'")


class KindPolicy(Answer):
    allowed: bool = Field(description="whether the queue takes this kind")
    refused_by: Optional[str] = Field(None, description="the department or queue whose kinds limit refuses it")
    defaults: dict[Literal[P.DEFAULT_FIELDS], PolicyValue]  # type: ignore[valid-type]
    limits: dict[Literal[P.LIMIT_FIELDS], PolicyValue]  # type: ignore[valid-type]


class EffectivePolicy(Answer):
    queue: str
    kinds: dict[Literal[C.KINDS], KindPolicy]  # type: ignore[valid-type]


class EffectivePolicyList(Answer):
    policies: list[EffectivePolicy]


def effective(settings: Any, queue: str) -> dict[str, Any]:
    """The answer for one leaf queue (a queue without any policy: every kind allowed, nothing set)."""
    kinds = settings.policies.get(queue, {})
    return {"queue": queue, "kinds": {k: P.view(kinds[k]) if k in kinds else P.view(P.KindPolicy())
                                      for k in C.KINDS}}


class EffectivePoliciesHandler(BaseHandler):
    @needs_scope(SUBMIT)
    def get(self) -> None:
        args = self.query(EffectivePolicyQuery)
        access = self.svc.access
        if args.queue is None:
            names = list(access.leaves)
        elif args.queue not in access.queue_map:
            raise APIError(400, f"queue: unknown queue {args.queue!r} (queues: {', '.join(access.leaves)})", "queue")
        elif args.queue not in access.leaves:
            raise APIError(400, f"queue: {args.queue!r} is a department: its policy applies through its leaf "
                                "queues; ask for one of them", "queue")
        else:
            names = [args.queue]
        self.send({"policies": [effective(self.svc.settings, q) for q in names]})
