"""Distributed jobs: the torch.distributed contract gpupool sets for every worker, and helpers.

A job submitted with ``pods: N`` runs N *workers* (processes on the local backend, pods on
Kubernetes) that the scheduler starts together (a gang). Every worker gets the environment that
``torchrun`` gives its processes, so ``torch.distributed.init_process_group()`` with the default
``env://`` rendezvous works as is:

============================  ==================================================================
``MASTER_ADDR``               where rank 0 listens (local: ``127.0.0.1``; Kubernetes: rank 0's pod
                              name in the job's headless Service)
``MASTER_PORT``               its port (local: a free port picked at start; Kubernetes: fixed)
``WORLD_SIZE``                number of workers (``pods``)
``RANK``                      this worker's index, 0 .. WORLD_SIZE-1 (the scheduler's pod index)
``LOCAL_RANK``                index among the job's workers on the same node
``LOCAL_WORLD_SIZE``          number of the job's workers on this node
``NODE_RANK`` / ``GROUP_RANK``  index of this worker's node among the job's nodes (first seen first)
``GPUPOOL_NODE``              the node (as everywhere in gpupool)
============================  ==================================================================

Each worker sees only its own GPUs (``CUDA_VISIBLE_DEVICES`` from its pod's placement), so
``torch.cuda.set_device(0)`` / ``"cuda:0"`` is right in every worker.

Inside a worker::

    from gpupool import distributed as gd, checkpoint
    gd.init_torch()                           # init_process_group: nccl with whole GPUs, else gloo
    state = checkpoint.load(default={...})    # every rank restores the newest checkpoint
    ...
    if gd.is_main():
        checkpoint.save(state, step=step)     # rank 0 saves (the checkpoint directory is shared)
    if gd.should_stop():                      # all ranks agree (an all-reduce): stop at the same step
        break

Standard library only (torch is imported by the functions that need it).
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from .protocol import Env

__all__ = ["worker_env", "rank", "world_size", "local_rank", "is_main", "is_distributed", "init_torch",
           "should_stop", "jax_initialize_args", "torchrun_args", "CONTRACT"]

# The variables of the contract (torchrun's names); defined once here, read by backends and tests.
CONTRACT = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
            "GROUP_RANK")


def worker_env(placements: Sequence[Mapping[str, Any]], rank: int, master_addr: str,
               master_port: int) -> dict[str, str]:
    """The contract's variables for worker ``rank`` of a gang placed as ``placements`` (the
    scheduler's pods, ``[{"pod": 0, "node": "n1", ...}, ...]``, in pod order)."""
    ordered = sorted(placements, key=lambda p: int(p.get("pod", 0)))
    nodes: list[str] = []
    for p in ordered:
        if p["node"] not in nodes:
            nodes.append(p["node"])
    me = ordered[rank]
    same = [int(p.get("pod", 0)) for p in ordered if p["node"] == me["node"]]
    node_rank = nodes.index(me["node"])
    return {
        "MASTER_ADDR": str(master_addr), "MASTER_PORT": str(int(master_port)),
        "WORLD_SIZE": str(len(ordered)), "RANK": str(rank),
        "LOCAL_RANK": str(same.index(int(me.get("pod", rank)))), "LOCAL_WORLD_SIZE": str(len(same)),
        "NODE_RANK": str(node_rank), "GROUP_RANK": str(node_rank),
    }


def _int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def rank() -> int:
    """This worker's rank (0 outside a distributed job)."""
    return _int("RANK", 0)


def world_size() -> int:
    """Number of workers (1 outside a distributed job)."""
    return _int("WORLD_SIZE", 1)


def local_rank() -> int:
    return _int("LOCAL_RANK", 0)


def is_main() -> bool:
    """True in rank 0 (and outside a distributed job): the worker that saves checkpoints."""
    return rank() == 0


def is_distributed() -> bool:
    return world_size() > 1


def init_torch(backend: str | None = None, **kwargs: Any) -> Any:
    """``torch.distributed.init_process_group`` from the contract (``env://``); ``backend``
    defaults to ``nccl`` when CUDA is available and the worker has whole GPUs, else ``gloo`` (CPU
    workers, and workers with a fraction of a GPU: NCCL refuses two ranks on one GPU, which
    fractional workers may share). Returns ``torch.distributed``. Does nothing (but return the
    module) when already initialised."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        if backend is None:
            shared = float(os.environ.get(Env.GPU_FRACTION) or 1.0) < 1.0
            backend = "nccl" if torch.cuda.is_available() and not shared else "gloo"
        kwargs.setdefault("rank", rank())
        kwargs.setdefault("world_size", world_size())
        dist.init_process_group(backend=backend, init_method="env://", **kwargs)
    return dist


def should_stop() -> bool:
    """``gpupool.checkpoint.should_stop()`` agreed by every rank: True on all ranks as soon as
    one rank sees the stop request (a MAX all-reduce when torch.distributed is initialised), so
    the workers leave their loop at the same step instead of one waiting forever in a collective.
    Call it at the same point of every rank's loop."""
    from . import checkpoint

    mine = checkpoint.should_stop()
    try:
        import sys

        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_initialized() or dist.get_world_size() < 2:
            return mine
        import torch

        device = "cpu"
        if dist.get_backend() == "nccl":
            device = f"cuda:{torch.cuda.current_device()}"
        flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
    except ImportError:
        return mine


def jax_initialize_args() -> dict[str, Any]:
    """Keyword arguments for ``jax.distributed.initialize(**gd.jax_initialize_args())``:
    ``coordinator_address`` (MASTER_ADDR:MASTER_PORT), ``num_processes``, ``process_id``."""
    return {"coordinator_address": f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '29500')}",
            "num_processes": world_size(), "process_id": rank()}


def torchrun_args(nproc_per_node: int | str = "gpu") -> list[str]:
    """Arguments for running ``torchrun`` inside each worker (one process per GPU of the worker):
    ``["torchrun", *gd.torchrun_args(), "train.py"]``; each worker is then one torchrun node."""
    return [f"--nnodes={world_size()}", f"--node-rank={rank()}", f"--nproc-per-node={nproc_per_node}",
            f"--master-addr={os.environ.get('MASTER_ADDR', '127.0.0.1')}",
            f"--master-port={os.environ.get('MASTER_PORT', '29500')}"]
