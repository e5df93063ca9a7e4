"""The GPU utilisation history's table: NVML readings per GPU (runtime/sampling.py writes them),
downsampled; and which queue holds which GPU now."""
from __future__ import annotations

from typing import Any

from sqlalchemy import Float, Index, Integer, String, select
from sqlalchemy.orm import Mapped, mapped_column

from ...contract import decode_allocation
from .tables import Base, Workload


class GpuSample(Base):
    __tablename__ = "gpu_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String(255))
    gpu: Mapped[int] = mapped_column(Integer)
    t: Mapped[float] = mapped_column(Float)           # start of the period
    seconds: Mapped[float] = mapped_column(Float)     # length of the period
    utilization: Mapped[float | None] = mapped_column(Float, nullable=True)  # percent, mean over the period
    memory_used: Mapped[float | None] = mapped_column(Float, nullable=True)  # bytes, mean over the period
    resolution: Mapped[int] = mapped_column(Integer, default=0)  # 0 = raw reading, else the rollup period

    __table_args__ = (Index("ix_gpu_samples_gpu_t", "node", "gpu", "t"), Index("ix_gpu_samples_res_t", "resolution", "t"))


TABLE = GpuSample.__table__


def holders(s: Any) -> dict[tuple[str, int], list[tuple[str, float]]]:
    """(node, GPU index) -> [(queue, fraction)] of the workloads holding GPUs now."""
    out: dict[tuple[str, int], list[tuple[str, float]]] = {}
    for queue, allocation in s.execute(select(Workload.queue, Workload.allocation)
                                       .where(Workload.allocation.is_not(None))):
        for p in decode_allocation(allocation):
            for g in p.gpus:
                out.setdefault((p.node, g), []).append((queue, p.fraction))
    return out
