"""Taking in the reservations the last cycle returned, in runs.

A busy cycle carries thousands of reservations (workloads waiting for the capacity their victims
release). Each is taken in order (``SINCE``): dropped if it can no longer be honoured, else its
planned placement is taken in the future view, its capacity claimed for its queue, and whatever
of it is free now held in the now view. One by one, that was a quarter of a large cycle.

Here a run of reservations is judged at once, exactly as one by one: assume every reservation of
the run is taken, work out with prefix sums (per GPU, per node, in order) whether each still fits
the future view and whether each reclaimer is still entitled, and take the run up to the first
that would be dropped; that one goes through the one-by-one path (``Cycle._take_one``), which
drops it with its reason, and the next run starts after it. Up to the first drop, "every earlier
one was taken" is what happened, so the answers are those of the one-by-one path. A reservation
the run cannot judge (a duplicate, a timeout, a node gone, a non-preemptible holder whose
queue's deserved quota is taken: all rare)
also goes one by one. Holds follow from the same prefix sums: a reservation holds
``min(milli, max(0, free now - held by earlier ones))`` of a GPU, so the earlier ones together hold
``min(their sum, max(0, free now))``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .model import MILLI, Phase, Reservation, Workload
from .reasons import Code


def _prefix(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per entry, the sum of ``values`` over the entries up to it (itself included) with its key."""
    if not len(keys):
        return values.copy()
    order = np.argsort(keys, kind="stable")
    k, v = keys[order], values[order]
    total = np.cumsum(v)
    first = np.ones(len(k), dtype=bool)
    first[1:] = k[1:] != k[:-1]
    before = (total - v)[first]  # the sum before each key's first entry
    out = np.empty_like(total)
    out[order] = total - before[np.cumsum(first) - 1]
    return out


def _held(keys: np.ndarray, values: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Per entry, what it holds of ``free[key]`` after the earlier entries with its key took theirs."""
    upto = _prefix(keys, values)
    room = np.maximum(free, 0)
    return np.minimum(upto, room) - np.minimum(upto - values, room)


class _Entries:
    """The reservations' placements as flat arrays: one entry per (reservation, GPU) and one per
    (reservation, pod), in order; ``alone[j]``: reservation j is taken in one by one."""

    def __init__(self, ctx: Any, todo: list[tuple[Reservation, Workload]], timeout: float):
        fut = ctx.future
        width = fut.gpu_free.shape[1]
        index, sched, ngpus = fut.index, fut.schedulable.tolist(), fut.num_gpus.tolist()
        g_res, g_key, g_milli, p_res, p_node, p_cpu, p_mem = [], [], [], [], [], [], []
        self.g_start, self.p_start, self.alone = [], [], []
        seen: set[str] = set()
        pending = Phase.PENDING
        for j, (r, w) in enumerate(todo):
            self.g_start.append(len(g_key))
            self.p_start.append(len(p_node))
            alone = (w.id in seen or ctx.now_t - r.since > timeout
                     or (not w.preemptible and w.phase is pending and bool(ctx._nonpreemptible_blocked(w)))
                     or (ctx.limited[w.queue] and w.phase is pending and bool(ctx._limit_blocked(w))))
            seen.add(w.id)
            if not alone:
                cpu, mem = int(round(w.cpu * MILLI)), w.memory
                for p in r.placements:
                    n = index.get(p.node)
                    gpus = p.gpus
                    if n is None or not sched[n] or (gpus and max(gpus) >= ngpus[n]):
                        alone = True  # gone, or no such GPU: the one-by-one path says which
                        break
                    p_res.append(j)
                    p_node.append(n)
                    p_cpu.append(cpu)
                    p_mem.append(mem)
                    base, milli = n * width, p.milli
                    for g in gpus:
                        g_res.append(j)
                        g_key.append(base + g)
                        g_milli.append(milli)
                if alone:
                    del g_res[self.g_start[j]:], g_key[self.g_start[j]:], g_milli[self.g_start[j]:]
                    del p_res[self.p_start[j]:], p_node[self.p_start[j]:]
                    del p_cpu[self.p_start[j]:], p_mem[self.p_start[j]:]
            self.alone.append(alone)
        self.g_start.append(len(g_key))
        self.p_start.append(len(p_node))
        i64 = np.int64
        self.g_res, self.g_key, self.g_milli = (np.array(x, dtype=i64) for x in (g_res, g_key, g_milli))
        self.p_res, self.p_node = np.array(p_res, dtype=i64), np.array(p_node, dtype=i64)
        self.p_cpu, self.p_mem = np.array(p_cpu, dtype=i64), np.array(p_mem, dtype=i64)


def take_in(ctx: Any, todo: list[tuple[Reservation, Workload]], timeout: float) -> None:
    """Take in ``todo`` (reservations and their holders, in order) on ``ctx``, a ``Cycle``."""
    if not todo:
        return
    e = _Entries(ctx, todo, timeout)
    i, run = 0, 64
    while i < len(todo):
        if e.alone[i]:
            ctx._take_one(*todo[i], timeout)
            i += 1
            continue
        end = i + 1
        while end < len(todo) and end < i + run and not e.alone[end]:
            end += 1
        k = _take_run(ctx, todo, e, i, end)
        if k < end:  # the first that cannot be taken: dropped, with its reason, one by one
            ctx._take_one(*todo[k], timeout)
            i, run = k + 1, max(16, run // 2)
        else:
            i, run = end, min(4096, run * 2)


def _take_run(ctx: Any, todo: list[tuple[Reservation, Workload]], e: _Entries, i: int, end: int) -> int:
    """Take reservations ``i`` .. up to ``end`` (none of them alone) while each fits and is
    entitled; return the index of the first that is not (``end``: all were taken)."""
    fut, now = ctx.future, ctx.now
    g0, g1, p0, p1 = e.g_start[i], e.g_start[end], e.p_start[i], e.p_start[end]
    keys, milli, nodes = e.g_key[g0:g1], e.g_milli[g0:g1], e.p_node[p0:p1]
    cpu, mem = e.p_cpu[p0:p1], e.p_mem[p0:p1]
    fut_gpu = fut.gpu_free.reshape(-1)  # a view: writes go to the array
    # does each still fit the future view, all earlier ones of the run taken?
    bad = np.zeros(end - i, dtype=bool)
    bad[e.g_res[g0:g1][_prefix(keys, milli) > fut_gpu[keys]] - i] = True
    short = (_prefix(nodes, cpu) > fut.cpu_free[nodes]) | (_prefix(nodes, mem) > fut.mem_free[nodes])
    bad[e.p_res[p0:p1][short] - i] = True
    stop = i + int(np.argmax(bad)) if bad.any() else end
    # is each reclaimer still entitled, with the claims of the earlier ones?
    reserved: dict[str, float] = {}
    tree, amounts = ctx.tree, ctx.amounts
    for j in range(i, stop):
        r, w = todo[j]
        amt = amounts[w.id][0]
        if r.code == Code.RECLAIMING and w.phase is Phase.PENDING and ctx._unentitled(w, reserved.get(w.queue)):
            stop = j
            break
        for x in tree.path(w.queue):  # as ``_claim`` will add it, in the same order
            reserved[x] = reserved.get(x, ctx.reserved[x]) + amt
    if stop == i:
        return i
    # take them: the future view, the claims, the holds in the now view
    ga, pa = e.g_start[stop] - g0, e.p_start[stop] - p0
    keys, milli, nodes, cpu, mem = keys[:ga], milli[:ga], nodes[:pa], cpu[:pa], mem[:pa]
    np.subtract.at(fut_gpu, keys, milli)
    np.subtract.at(fut.cpu_free, nodes, cpu)
    np.subtract.at(fut.mem_free, nodes, mem)
    touched = nodes.tolist()
    fut.log.extend(touched)
    now_gpu = now.gpu_free.reshape(-1)
    gh = _held(keys, milli, now_gpu[keys])
    ch = _held(nodes, cpu, now.cpu_free[nodes])
    mh = _held(nodes, mem, now.mem_free[nodes])
    np.subtract.at(now_gpu, keys, gh)
    np.subtract.at(now.cpu_free, nodes, ch)
    np.subtract.at(now.mem_free, nodes, mh)
    now.log.extend(touched)
    gh, ch, mh = gh.tolist(), ch.tolist(), mh.tolist()
    # the claims: the sums the run was judged with are those ``Cycle._claim`` comes to, one by
    # one (the same additions in the same order); what is kept of the sums is dropped per queue
    ctx_reserved = ctx.reserved
    for x, v in reserved.items():
        ctx_reserved[x] = v
    queues: set[str] = set()
    holds_of, reservations = ctx.holds, ctx.reservations
    g, p = 0, 0
    for j in range(i, stop):
        r, w = todo[j]
        wid, q = w.id, w.queue
        queues.add(q)
        holds = []
        for pl in r.placements:
            k = len(pl.gpus)
            holds.append((touched[p], pl.gpus, tuple(gh[g:g + k]), ch[p], mh[p]))
            g += k
            p += 1
        holds_of[wid] = holds
        reservations[wid] = r
    ctx._note_starts((w for _, w in todo[i:stop]), +1)
    for q in queues:
        ctx._changing(q)
    ctx._held_all = None
    return stop
