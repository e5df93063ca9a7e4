"""Nodes an admin took out of service (``POST nodes/{name}/drain|fail``): one row per node that is
out, deleted when it returns. What a backend finds by itself (a GPU NVML no longer lists, a
Kubernetes node cordoned or NotReady) is not stored: it is found again after a restart."""
from __future__ import annotations

from sqlalchemy import Float, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from .tables import Base


class NodeOut(Base):
    __tablename__ = "nodes_out"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    action: Mapped[str] = mapped_column(String(16))  # "drain" or "fail" (contract.NODE_ACTIONS)
    note: Mapped[str] = mapped_column(Text, default="")  # the admin's words (why), may be empty
    by: Mapped[str] = mapped_column(String(255), default="")  # who took it out
    since: Mapped[float] = mapped_column(Float)
