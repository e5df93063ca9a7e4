"""Who is calling, once authenticated (web/auth.py finds out): a user, a service or a job's token."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Identity:
    name: str
    kind: str = "user"  # user | service | job
    admin: bool = False
    groups: list[str] = field(default_factory=list)
    job_id: int | None = None  # job tokens: the one job they may touch

    def owns(self, row: Any) -> bool:
        if self.kind == "job":
            return row.id == self.job_id
        return self.admin or row.user == self.name
