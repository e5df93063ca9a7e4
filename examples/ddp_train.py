"""A small distributed (DDP) training script for gpupool: every worker runs it.

    gpupool submit --pods 2 --gpus 1 examples/ddp_train.py --steps 50
    gpupool.submit("examples/ddp_train.py", pods=2, gpus=1, args=["--steps", "50"])

* ``gpupool.distributed.init_torch()`` joins the workers (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
  RANK... are set by gpupool as torchrun sets them; NCCL with GPUs, gloo on the CPU);
* an all-reduce checks that every worker is there (the sum of 1..WORLD_SIZE);
* every rank restores the newest checkpoint; rank 0 saves one after every step;
* ``gpupool.distributed.should_stop()`` is True on every rank at the same step once the job is
  asked to stop (preempted or cancelled): they leave together and the job resumes later;
* with ``--record DIR`` each rank appends ``attempt=A rank=R step=S`` for every step it ran to
  ``DIR/steps-rankR.txt``, so you can check that no step ran twice.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn

from gpupool import checkpoint
from gpupool import distributed as gd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--record", default="", help="directory for the per-rank step records")
    args = p.parse_args()

    dist = gd.init_torch()
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{gd.local_rank() % torch.cuda.device_count()}" if torch.cuda.is_available() else "cpu")
    total = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(total)
    expected = world * (world + 1) / 2
    assert total.item() == expected, (total.item(), expected)
    print(f"rank {rank}/{world}: all-reduce {total.item():g} == {expected:g}", flush=True)

    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    state = checkpoint.load(default=None)  # every rank restores the same checkpoint
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        print(f"rank {rank}: attempt {os.environ.get('GPUPOOL_ATTEMPT')}: resumed at step {start}", flush=True)
    ddp = nn.parallel.DistributedDataParallel(model)
    target = torch.tensor([[1.0], [-2.0], [0.5], [3.0]], device=device)
    attempt = os.environ.get("GPUPOOL_ATTEMPT", "0")
    for step in range(start, args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)  # each rank its own shard of the data
        x = torch.randn(8, 4, generator=g).to(device)
        loss = ((ddp(x) - x @ target) ** 2).mean()
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients
        opt.step()
        if gd.is_main():
            checkpoint.save({"step": step + 1, "model": model.state_dict(), "opt": opt.state_dict()}, step=step + 1)
        if args.record:
            with open(os.path.join(args.record, f"steps-rank{rank}.txt"), "a") as f:
                f.write(f"attempt={attempt} rank={rank} step={step} loss={loss.item():.6f}\n")
        if gd.should_stop():  # every rank agrees: leave at the same step (rank 0 has just saved)
            print(f"rank {rank}: asked to stop ({checkpoint.stop_reason()}) after step {step}", flush=True)
            break
        time.sleep(args.step_seconds)
    else:
        weights = ",".join(f"{v:.6f}" for v in model.weight.detach().flatten().tolist())
        print(f"rank {rank}: finished {args.steps} steps; weights {weights}", flush=True)
    # every rank done with its collectives before any tears its process group down: a rank that
    # exits first closes the connections another may still be using (gloo then aborts it)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
