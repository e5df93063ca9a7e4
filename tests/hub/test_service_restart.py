"""SIGKILL the gpupool service mid-run and restart it: nothing lost, no GPU handed out twice,
running jobs re-adopted (even one whose handle never reached the database), vanished ones requeued."""
from __future__ import annotations

import json
import re
import shutil
import signal
import sqlite3
from pathlib import Path

import pytest

from gpupool.scheduler.reasons import Code

from hub_harness import Hub, _environ, hub_leak_check, ledger  # noqa: F401 (leak check fixtures)

pytestmark = pytest.mark.hub

ROOT = Path(__file__).resolve().parents[2]


def pids_of(hub: Hub, job_id: str) -> list[int]:
    tag = f"GPUPOOL_JOB_ID={job_id}\0".encode()
    return [p for p in hub.job_pids() if tag in _environ(p)]


def runner_pid(hub: Hub, job_id: str) -> int:
    from gpupool.backends.local import _is_runner

    pids = pids_of(hub, job_id)
    leaders = [p for p in pids if _is_runner(p)]
    assert len(leaders) == 1, (job_id, pids)
    return leaders[0]


def check_no_double_allocation(hub: Hub, token: str) -> None:
    for node in hub.api("GET", "nodes", token).json()["nodes"]:
        for gpu in node["gpus"]:
            assert gpu["allocated"] <= 1.0 + 1e-9, gpu
            assert len(gpu["allocations"]) <= 1, gpu  # whole-GPU jobs only in this test


def steps(path: Path) -> list[tuple[int, int]]:
    return [(int(a), int(s)) for a, s in re.findall(r"attempt=(\d+) step=(\d+)", path.read_text())]


def test_sigkill_and_restart_loses_nothing(tmp_path):
    with Hub(tmp_path, gpupool={"nodes": [{"name": "box", "gpus": 2}]}, users=["alice"], managed=False) as hub:
        shutil.copy(ROOT / "examples" / "train_checkpoint.ipynb", hub.home("alice") / "train.ipynb")
        tok = hub.token("alice")
        ids = []
        for name in ("a", "b", "c"):
            r = hub.api("POST", "jobs", tok, json={"notebook": "train.ipynb", "gpus": 1, "name": name, "parameters": {
                "steps": 30, "step_seconds": 0.15, "steps_file": f"steps-{name}.txt"}})
            assert r.status_code == 201
            ids.append(r.json()["id"])
        a, b, c = ids
        hub.wait_job(tok, a, {"running"}, 60)
        hub.wait_job(tok, b, {"running"}, 60)
        home = hub.home("alice")
        hub.wait_for(lambda: all((home / f"steps-{n}.txt").exists() and len(steps(home / f"steps-{n}.txt")) >= 3
                                 for n in "ab"), 60)
        queued_c = hub.api("GET", f"jobs/{c}", tok).json()
        assert queued_c["status"] == "queued" and queued_c["position"] == 1
        a_runner = runner_pid(hub, a)
        [a_open] = ledger(hub, a)  # written with the bind: open while it runs
        assert a_open["end"] is None and a_open["gpus"] == 1 and a_open["user"] == "alice"

        hub.kill_service(signal.SIGKILL)
        # While the service is down: b's processes die (a node problem, an OOM kill...), and a's row
        # looks as if the service died between writing "starting" and writing the handle.
        for pid in pids_of(hub, b):
            try:
                import os
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        db = sqlite3.connect(hub.settings["db_url"].removeprefix("sqlite:///"))
        db.execute("UPDATE workloads SET status='starting', handle=NULL WHERE id=?", (int(a[2:]),))
        db.commit()
        db.close()
        hub.start_service()

        ja = hub.api("GET", f"jobs/{a}", tok).json()
        assert ja["status"] == "running" and ja["attempts"] == 1 and ja["restarts"] == 0, ja
        assert runner_pid(hub, a) == a_runner  # the same process, adopted without a handle
        jb = hub.api("GET", f"jobs/{b}", tok).json()
        assert jb["restarts"] == 1 and jb["attempts"] in (1, 2), json.dumps(jb)  # requeued (maybe started again)
        if jb["status"] == "queued":
            assert "gpupool service restarted" in jb["reason"], jb
        check_no_double_allocation(hub, tok)
        # the usage ledger: a's interval continues (adopted), b's first one was closed as lost
        assert ledger(hub, a) == [a_open]
        b_first = ledger(hub, b)[0]
        assert b_first["end_reason"] == "lost" and b_first["end"] >= b_first["start"], b_first
        assert "gpupool service restarted" in b_first["end_detail"]

        # everything finishes; GPUs are never double-booked on the way
        def all_done():
            check_no_double_allocation(hub, tok)
            views = [hub.api("GET", f"jobs/{j}", tok).json() for j in ids]
            return views if all(v["status"] in ("succeeded", "failed", "cancelled") for v in views) else None

        va, vb, vc = hub.wait_for(all_done, 150, 0.5, message="jobs did not all finish after the restart")
        assert [v["status"] for v in (va, vb, vc)] == ["succeeded"] * 3, (va, vb, vc)
        assert va["attempts"] == 1 and va["restarts"] == 0  # never restarted: adopted
        assert vb["attempts"] == 2 and vb["restarts"] == 1 and vb["preemptions"] == 0
        assert vc["attempts"] == 1
        # a: one uninterrupted run; b: resumed from its last save (at most the step in flight repeats)
        assert [s for _, s in steps(home / "steps-a.txt")] == list(range(30))
        rb = steps(home / "steps-b.txt")
        assert sorted({s for _, s in rb}) == list(range(30))
        first = [s for att, s in rb if att == 1]
        second = [s for att, s in rb if att == 2]
        assert second[0] >= first[-1] and len(rb) - 30 <= 1, rb
        assert "resumed from ckpt-" in hub.api("GET", f"jobs/{b}/log", tok).text
        # one record per allocation interval, every one closed: a one, b two (lost, then succeeded), c one
        la, lb, lc = ledger(hub, a), ledger(hub, b), ledger(hub, c)
        assert [r["end_reason"] for r in la] == ["succeeded"] and la[0]["start"] == a_open["start"]
        assert [r["end_reason"] for r in lb] == ["lost", "succeeded"] and lb[1]["start"] >= lb[0]["end"]
        assert [r["end_reason"] for r in lc] == ["succeeded"] and lc[0]["start"] >= b_first["end"]
        assert [r["attempt"] for r in lb] == [1, 2]
        assert not hub.job_pids()

        # SIGTERM: the service exits promptly (kill_service waits at most 10 s)
        hub.kill_service(signal.SIGTERM, timeout=10)
        assert "stopping (running jobs keep running" in hub.service_log()
        assert "Traceback" not in hub.service_log()


async def test_queue_removed_from_config_keeps_its_gpus_booked(tmp_path):
    """Quota changes apply at restart without losing anything: a workspace still holding a GPU in a
    queue that no longer exists keeps it (no double allocation); a job waiting in it says why."""
    import time

    from gpupool.backends.local import LocalBackend
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.config import load
    from gpupool.hub_ext.runtime.loop import SchedulerLoop

    settings = load({"nodes": [{"name": "box", "gpus": 1}], "queues": [{"name": "new", "deserved": {"gpu": 1}}],
                     "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}", "job_root": str(tmp_path / "jobs"),
                     "work_dir": str(tmp_path), "run_as_user": False})
    sessions = D.make_sessionmaker(D.make_engine(settings.pool.db_url))
    now = time.time()
    common = dict(user="alice", gpus=1.0, submitted_at=now, parameters={})
    with sessions() as s:  # state left by the previous configuration
        s.add(D.Workload(type=D.WORKSPACE, queue="old", kind="interactive", status="running", preemptible=False,
                         allocation=[{"pod": 0, "node": "box", "gpus": [0], "fraction": 1.0}], started_at=now, **common))
        s.add(D.Workload(type=D.JOB, queue="old", kind="train", status="queued", **common))
        s.add(D.Workload(type=D.JOB, queue="new", kind="train", status="queued", **common))
        s.commit()
    loop = SchedulerLoop(settings, sessions, LocalBackend())
    await loop.recover()
    result = await loop.cycle()
    assert not result.binds and not result.evictions  # the one GPU is still the workspace's
    assert loop.state.pending["j-000002"].code == Code.NO_QUEUE
    assert "j-000003" in loop.state.pending
    with sessions() as s:
        ws = s.get(D.Workload, 1)
        assert ws.status == "running" and ws.allocation
        assert "does not exist" in s.get(D.Workload, 2).reason


def test_reservation_in_motion_survives_a_sigkill(tmp_path):
    """A reclaim whose victim is still checkpointing when the service is SIGKILLed goes on after
    the restart (reservations are stored, hub_ext/store/tables.py): the job it was made for gets the victim's
    GPU, though a higher-priority job of the same queue came later and would be planned first
    afresh; the victim stays the only one evicted."""
    queues = [{"name": "lo", "deserved": {"gpu": 0}}, {"name": "hi", "deserved": {"gpu": 1}}]
    cfg = {"nodes": [{"name": "box", "gpus": 2}], "queues": queues, "preemption_grace": 15}
    with Hub(tmp_path, gpupool=cfg, users=["alice"], managed=False) as hub:
        tok = hub.token("alice")
        sleeper = {"command": ["python", "-c", "import time; time.sleep(600)"], "gpus": 1}  # ignores a stop request
        lo = [hub.api("POST", "jobs", tok, json={**sleeper, "queue": "lo"}).json()["id"] for _ in range(2)]
        for j in lo:
            hub.wait_job(tok, j, {"running"})
        a = hub.api("POST", "jobs", tok, json={**sleeper, "queue": "hi", "name": "a"}).json()["id"]
        victim = hub.wait_preempted(tok, lo)
        [other] = [j for j in lo if j != victim["id"]]
        hub.wait_for(lambda: hub.api("GET", f"jobs/{a}", tok).json()["reason_code"] == "reclaiming", 10)
        b = hub.api("POST", "jobs", tok, json={**sleeper, "queue": "hi", "name": "b", "priority": 90}).json()["id"]
        hub.wait_for(lambda: hub.api("GET", f"jobs/{b}", tok).json()["reason_code"] is not None, 10)

        hub.kill_service(signal.SIGKILL)
        hub.start_service()
        assert f"reservations of plans in motion taken up again: {a}" in hub.service_log()
        assert hub.api("GET", f"jobs/{victim['id']}", tok).json()["status"] == "preempting"  # still releasing
        # the victim is terminated at the end of its grace period; a takes its GPU, b still waits
        ja = hub.wait_job(tok, a, {"running"}, 60)
        assert [(p["node"], p["gpus"]) for p in ja["allocation"]] == \
            [(p["node"], p["gpus"]) for p in victim["allocation"]]
        jb = hub.api("GET", f"jobs/{b}", tok).json()
        assert jb["status"] == "queued", jb
        jo = hub.api("GET", f"jobs/{other}", tok).json()
        assert jo["status"] == "running" and jo["preemptions"] == 0 and jo["attempts"] == 1, jo
        jv = hub.api("GET", f"jobs/{victim['id']}", tok).json()
        assert jv["status"] == "queued" and jv["preemptions"] == 1, jv
        check_no_double_allocation(hub, tok)
