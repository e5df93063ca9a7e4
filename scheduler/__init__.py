"""gpupool scheduler core: pure, deterministic fair-share GPU scheduling.

``Scheduler(SchedulerConfig(...)).schedule(Snapshot(...)) -> CycleResult``; see model.py for the
interface and docs/scheduling.md for the promises.
"""
from .core import Scheduler
from .model import (Bind, CycleResult, Evict, NodeSpec, Phase, PodPlacement, QueueSpec, SchedulerConfig, Snapshot,
                    Workload)
from .spec import SpecError, parse_nodes, parse_queues, parse_workload

__all__ = ["Scheduler", "SchedulerConfig", "Snapshot", "Workload", "NodeSpec", "QueueSpec", "Phase", "PodPlacement",
           "Bind", "Evict", "CycleResult", "SpecError", "parse_nodes", "parse_queues", "parse_workload"]
