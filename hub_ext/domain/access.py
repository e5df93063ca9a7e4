"""Who may use which queue: a leaf queue with neither ``users`` nor ``groups`` is open to every
user; admins may use every leaf queue. Departments (queues with children) take no workloads."""
from __future__ import annotations

from typing import Any

from ...scheduler.fairshare import QueueTree
from .errors import APIError
from .identity import Identity


class QueueAccess:
    """``settings``: the service's (queues, access lists, ``pool.default_queue``)."""

    def __init__(self, settings: Any):
        self.settings = settings
        self.tree = QueueTree(settings.queues)
        self.queue_map = {q.name: q for q in settings.queues}
        self.leaves = [q.name for q in settings.queues if self.tree.is_leaf(q.name)]

    def may_use(self, ident: Identity, queue: str) -> bool:
        if queue not in self.leaves:
            return False
        if ident.admin:
            return True
        acc = self.settings.access.get(queue, {})
        users, groups = acc.get("users", []), acc.get("groups", [])
        if not users and not groups:
            return True
        return ident.name in users or any(g in groups for g in ident.groups)

    def default_queue(self, ident: Identity) -> str | None:
        pref = self.settings.pool.default_queue
        if pref and self.may_use(ident, pref):
            return pref
        return next((q for q in self.leaves if self.may_use(ident, q)), None)

    def choose(self, ident: Identity, queue: str | None) -> str:
        """The queue of a request (its default when it names none), or a 4xx naming ``queue``."""
        if queue is None or queue == "":
            queue = self.default_queue(ident)
            if queue is None:
                raise APIError(403, f"{ident.name} may not use any queue; ask an admin to add you to one in "
                                    "c.GPUPool.queues", "queue")
            return queue
        if queue not in self.queue_map:
            raise APIError(400, f"queue: unknown queue {queue!r} (queues: {', '.join(self.leaves)})", "queue")
        if queue not in self.leaves:
            raise APIError(400, f"queue: {queue!r} is a department (it has child queues); submit to one of its "
                                "leaf queues", "queue")
        if not self.may_use(ident, queue):
            raise APIError(403, f"queue: {ident.name} may not submit to queue {queue!r}", "queue")
        return queue
