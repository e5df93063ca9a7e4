"""Local backend end to end: borrowing, reclaim with checkpoint/resume, GPU environment, cancel."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from hub_harness import Hub, hub_leak_check, notebook  # noqa: F401 (leak check fixtures)

pytestmark = pytest.mark.hub

ROOT = Path(__file__).resolve().parents[2]
QUEUES = [
    {"name": "vision", "deserved": {"gpu": 1}, "users": ["alice"]},
    {"name": "nlp", "deserved": {"gpu": 1}, "users": ["bob"]},
]
NODES = [{"name": "box", "gpus": 2, "gpu_memory": "16Gi"}]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("jobs"), gpupool={"queues": QUEUES, "nodes": NODES, "preemption_grace": 10})
    with h:
        for user in ("alice", "bob"):
            shutil.copy(ROOT / "examples" / "train_checkpoint.ipynb", h.home(user) / "train_checkpoint.ipynb")
        yield h


def steps_of(path: Path) -> list[tuple[int, int]]:
    """(attempt, step) for every step a job executed, in order."""
    out = []
    for line in path.read_text().splitlines():
        m = re.search(r"attempt=(\d+) step=(\d+)", line)
        out.append((int(m.group(1)), int(m.group(2))))
    return out


def test_borrow_then_reclaim_checkpoints_requeues_and_resumes(hub):
    alice, bob = hub.token("alice"), hub.token("bob")
    jobs = []
    for i in range(2):
        r = hub.api("POST", "jobs", bob, json={
            "notebook": "train_checkpoint.ipynb", "gpus": 1, "name": f"bob-{i}",
            "parameters": {"steps": 30, "step_seconds": 0.25, "steps_file": f"steps-{i}.txt"}})
        assert r.status_code == 201, r.text
        jobs.append(r.json()["id"])
    running = [hub.wait_job(bob, j, {"running"}, 60) for j in jobs]
    # nlp deserves 1 GPU: one of bob's jobs runs on alice's idle GPU (borrowing)
    assert {r["allocation"][0]["gpus"][0] for r in running} == {0, 1}
    assert any("borrow" in r["reason"] or "over" in r["reason"] for r in running), [r["reason"] for r in running]
    hub.wait_for(lambda: all((hub.home("bob") / f"steps-{i}.txt").exists()
                             and len(steps_of(hub.home("bob") / f"steps-{i}.txt")) >= 3 for i in range(2)), 60)

    r = hub.api("POST", "jobs", alice, json={"notebook_content": notebook("import time; time.sleep(1)"), "gpus": 1})
    mine = r.json()["id"]

    victim = hub.wait_preempted(bob, jobs)
    assert "reclaim" in victim["reason"] or "vision" in victim["reason"], victim["reason"]
    assert hub.wait_job(alice, mine, {"succeeded", "failed"}, 90)["status"] == "succeeded"
    finals = [hub.wait_job(bob, j, {"succeeded", "failed"}, 120) for j in jobs]
    assert [f["status"] for f in finals] == ["succeeded", "succeeded"], finals

    v = next(f for f in finals if f["id"] == victim["id"])
    other = next(f for f in finals if f["id"] != victim["id"])
    assert v["preemptions"] == 1 and v["attempts"] == 2, v
    assert other["preemptions"] == 0 and other["attempts"] == 1
    assert v["checkpoint"]["latest"].endswith("ckpt-000030.pkl")
    # from the job's own record: every step ran exactly once; attempt 2 began where attempt 1 saved
    i = jobs.index(v["id"])
    record = steps_of(hub.home("bob") / f"steps-{i}.txt")
    assert [s for _, s in record] == list(range(30)), record
    first = [s for a, s in record if a == 1]
    second = [s for a, s in record if a == 2]
    assert first and second and second[0] == first[-1] + 1
    log = hub.api("GET", f"jobs/{v['id']}/log", bob).text
    assert f"asked to stop (preempted" in log  # it learned of the stop request and saved on its own
    assert f"attempt 2: starting at step {second[0]} (resumed from ckpt-{second[0]:06d}.pkl)" in log
    out = json.dumps(hub.api("GET", f"jobs/{v['id']}/output", bob).json())
    assert f"attempt 2: starting at step {second[0]}" in out and "finished 30 steps" in out


ENV_DUMP = """
import os, json, sys
keys = ["CUDA_VISIBLE_DEVICES", "GPUPOOL_GPU_FRACTION", "GPUPOOL_GPU_MEMORY_LIMIT", "XLA_PYTHON_CLIENT_MEM_FRACTION",
        "XLA_PYTHON_CLIENT_PREALLOCATE", "GPUPOOL_CHECKPOINT_DIR", "GPUPOOL_JOB_ID", "GPUPOOL_API_URL",
        "JUPYTERHUB_API_TOKEN", "XLA_CLIENT_MEM_FRACTION", "GPUPOOL_GPU_MEMORY_FRACTION"]
env = {k: os.environ.get(k) for k in keys}
env["hook"] = "gpupool_caps" in sys.modules  # the start-up hook ran in the kernel
print("ENV=" + json.dumps(env), flush=True)
print("CWD=" + os.getcwd(), flush=True)
"""


def _submit_env(hub, token, body):
    return hub.api("POST", "jobs", token, json={"notebook_content": notebook(ENV_DUMP), **body}).json()["id"]


def _env_of(hub, token, job_id):
    job = hub.wait_job(token, job_id, {"succeeded", "failed"}, 90)
    assert job["status"] == "succeeded", job
    log = hub.api("GET", f"jobs/{job['id']}/log", token).text
    env = json.loads(re.search(r"ENV=(\{.*\})", log).group(1))
    cwd = re.search(r"CWD=(.*)", log).group(1).strip()
    return job, env, cwd


def test_job_environment_gpu_share_cpu_only_and_working_dir(hub):
    alice = hub.token("alice")
    shared = _submit_env(hub, alice, {"gpu_memory": "4Gi", "kind": "inference"})
    cpu_only = _submit_env(hub, alice, {})
    job, env, cwd = _env_of(hub, alice, shared)
    # the driver keeps 3 % of each 16Gi GPU (c.GPUPool.gpu_memory_reserve): 4Gi is 0.258 of what is left
    assert env["GPUPOOL_GPU_FRACTION"] == "0.258" and env["GPUPOOL_GPU_MEMORY_LIMIT"] == str(4 * 2**30)
    # the frameworks are told the cap as a share of the whole GPU: 4Gi of 16Gi (tests/local/test_gpu_caps.py)
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.250" == env["XLA_CLIENT_MEM_FRACTION"]
    assert env["GPUPOOL_GPU_MEMORY_FRACTION"] == "0.250" and env["hook"] is True
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    assert env["GPUPOOL_JOB_ID"] == job["id"] and env["GPUPOOL_API_URL"].endswith("/services/gpupool/api/v1/")
    assert env["GPUPOOL_CHECKPOINT_DIR"].endswith(f"{job['id']}/checkpoints")
    assert env["JUPYTERHUB_API_TOKEN"] is None  # the service's own token never leaks into jobs
    assert cwd == str(hub.home("alice"))
    _, env, _ = _env_of(hub, alice, cpu_only)  # CPU only: no GPU visible
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["GPUPOOL_GPU_FRACTION"] == "0"


def test_cancel_running_job_asks_it_to_stop_and_frees_the_gpu(hub):
    bob = hub.token("bob")
    r = hub.api("POST", "jobs", bob, json={"notebook": "train_checkpoint.ipynb", "gpus": 1, "kind": "inference",
                                           "parameters": {"steps": 400, "step_seconds": 0.1,
                                                          "steps_file": "cancel-steps.txt"}})
    jid = r.json()["id"]
    hub.wait_job(bob, jid, {"running"}, 60)
    hub.wait_for(lambda: (hub.home("bob") / "cancel-steps.txt").exists(), 60)
    c = hub.api("DELETE", f"jobs/{jid}", bob).json()
    assert c["status"] == "cancelled" and "cancelled by bob" in c["reason"]

    def released():
        j = hub.api("GET", f"jobs/{jid}", bob).json()
        return j if j["allocation"] == [] and j["finished_at"] else None

    j = hub.wait_for(released, 30)
    assert j["status"] == "cancelled" and j["reason"] == "cancelled by bob"
    assert "asked to stop (cancelled by bob)" in hub.api("GET", f"jobs/{jid}/log", bob).text
    assert not [p for p in hub.job_pids()], "job processes left after cancel"


async def test_gpu_memory_enforcement_reports_then_stops(tmp_path):
    """A fractional job over its GPU memory share, as NVML reports it per process. No GPU here:
    NVML is the vendor library's stand-in from nvml_standin.py behind the real gpupool.backends.nvml
    code; the loop, the backend and the job (papermill) are real."""
    import asyncio

    from nvml_standin import memory_loop

    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.domain.identity import Identity

    sessions, fake, backend, loop, svc = memory_loop(tmp_path)
    nb = notebook("import time\nwhile True:\n    time.sleep(0.1)")
    job = await svc.new_job(Identity(name="alice"), {"notebook_content": nb, "gpus": 0.5})

    def row():
        with sessions() as s:
            return s.get(D.Workload, job.id)

    try:
        await loop.cycle()
        assert row().status == "running"
        handle = row().handle
        for _ in range(100):  # until the kernel is up
            if len(backend.pids(handle)) >= 3:
                break
            await asyncio.sleep(0.1)
        fake.devices[0]["procs"] = [(pid, 3 * 2**30) for pid in backend.pids(handle)]  # >= 9Gi of an 8Gi share
        await loop.cycle()
        r = row()
        assert r.status == "running" and "warning: using" in r.reason and "more than its share of 8Gi" in r.reason
        loop.pool.memory_enforcement = "stop"
        await loop.cycle()
        assert row().stop_cause == "memory"
        for _ in range(100):
            await loop.cycle()
            if row().status == "failed":
                break
            await asyncio.sleep(0.2)
        r = row()
        assert r.status == "failed" and "more than its share of 8Gi" in r.reason and "memory_enforcement" in r.reason
        assert r.allocation is None and not backend.pids(handle)
    finally:
        for pid in backend.pids(row().handle or {"run_id": f"{job.public_id}.1.{loop.instance}"}):
            import os
            import signal
            os.kill(pid, signal.SIGKILL)
