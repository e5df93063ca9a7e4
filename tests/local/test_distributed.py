"""Script and command jobs, and distributed jobs (gangs of workers) through the real hub on the
local backend: validation, the torch.distributed contract, failure as a unit, per-rank logs, and
a two-process torch.distributed (gloo, CPU) DDP job preempted and resumed from its checkpoint."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hub_harness import Hub, hub_leak_check, notebook  # noqa: F401 (leak check fixture)

pytestmark = pytest.mark.hub

ROOT = Path(__file__).resolve().parents[2]
GPUPOOL = str(Path(sys.executable).parent / "gpupool")
QUEUES = [
    {"name": "vision", "deserved": {"gpu": 1}, "users": ["alice"]},
    {"name": "nlp", "deserved": {"gpu": 1}, "users": ["bob"]},
]
NODES = [{"name": "box", "gpus": 2, "gpu_memory": "16Gi"}]

SCRIPT = """
import json, os, sys
import gpupool
from gpupool import checkpoint
state = checkpoint.load(default={"n": 0})
checkpoint.save({"n": state["n"] + 1}, step=1)
gpupool.log_metric("loss", 0.5, step=0)
print("ARGS=" + json.dumps(sys.argv[1:]), flush=True)
print("CWD=" + json.dumps(os.getcwd()), flush=True)
print("EXE=" + json.dumps(sys.executable), flush=True)
print("ENV=" + json.dumps({k: os.environ.get(k) for k in ("GPUPOOL_JOB_ID", "GPUPOOL_CHECKPOINT_DIR", "CUDA_VISIBLE_DEVICES", "RANK")}), flush=True)
"""

# every worker prints the torch.distributed contract and its GPUs; rank 1 may fail or die
WORKER = """
import json, os, signal, sys, time
keys = ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
        "CUDA_VISIBLE_DEVICES", "GPUPOOL_GPUS", "GPUPOOL_ATTEMPT"]
print("ENV=" + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if os.environ["RANK"] == "1" and mode == "fail":
    raise RuntimeError("rank 1 gives up: bad shard")
if os.environ["RANK"] == "1" and mode == "die" and os.environ["GPUPOOL_ATTEMPT"] == "1":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
print("done rank", os.environ["RANK"], flush=True)
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("dist"), gpupool={"queues": QUEUES, "nodes": NODES, "preemption_grace": 20,
                                                      "max_pods": 8})
    with h:
        for user in ("alice", "bob"):
            home = h.home(user)
            (home / "job.py").write_text(SCRIPT)
            (home / "worker.py").write_text(WORKER)
            (home / "mypkg").mkdir()
            (home / "mypkg" / "__init__.py").write_text("")
            (home / "mypkg" / "train.py").write_text(SCRIPT)
            shutil.copy(ROOT / "examples" / "ddp_train.py", home / "ddp_train.py")
        yield h


def _log(hub, token, job_id, rank=None):
    return hub.api("GET", f"jobs/{job_id}/log" + (f"?rank={rank}" if rank is not None else ""), token).text


def _out(pattern, text):
    m = re.search(pattern, text)
    assert m, text[-3000:]
    return json.loads(m.group(1))


def test_script_and_command_jobs_run_like_notebook_jobs(hub):
    alice = hub.token("alice")
    r = hub.api("POST", "jobs", alice, json={"script": "job.py", "args": ["--lr", 3e-4, "x y"], "gpus": 1})
    assert r.status_code == 201, r.text
    script = r.json()
    assert script["name"] == "job" and script["script"] == "job.py" and script["args"] == ["--lr", "0.0003", "x y"]
    r = hub.api("POST", "jobs", alice, json={"command": ["python", "-m", "mypkg.train", "--lr", "3e-4"]})
    assert r.status_code == 201, r.text
    command = r.json()
    assert command["name"] == "mypkg.train" and command["pods"] == 1
    for view in (script, command):
        done = hub.wait_job(alice, view["id"], {"succeeded", "failed"}, 90)
        assert done["status"] == "succeeded", (done, _log(hub, alice, view["id"]))
        assert done["reason"] == "succeeded: the program exited with status 0"
        assert done["metrics"]["loss"][0]["value"] == 0.5  # metrics, as from a notebook
        assert done["checkpoint"]["latest"].endswith("ckpt-000001.pkl")  # the checkpoint protocol too
        log = _log(hub, alice, view["id"])
        assert _out(r"CWD=(.*)", log) == str(hub.home("alice"))
        assert Path(_out(r"EXE=(.*)", log)).parent == Path(sys.executable).parent  # the job interpreter
        env = _out(r"ENV=(\{.*\})", log)
        assert env["GPUPOOL_JOB_ID"] == view["id"] and env["GPUPOOL_CHECKPOINT_DIR"].endswith(f"{view['id']}/checkpoints")
        assert env["RANK"] is None  # a single-worker job sets no rendezvous variables
    assert _out(r"ARGS=(\[.*\])", _log(hub, alice, script["id"])) == ["--lr", "0.0003", "x y"]
    assert _out(r"ARGS=(\[.*\])", _log(hub, alice, command["id"])) == ["--lr", "3e-4"]
    assert _out(r"ENV=(\{.*\})", _log(hub, alice, script["id"]))["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    out = hub.api("GET", f"jobs/{script['id']}/output", alice)
    assert out.status_code == 404 and "script job" in out.json()["message"]

    r = hub.api("POST", "jobs", alice, json={"command": ["python", "-c", "raise KeyError('no such column: lr')"]})
    failed = hub.wait_job(alice, r.json()["id"], {"succeeded", "failed"}, 60)
    assert failed["status"] == "failed" and "KeyError: 'no such column: lr'" in failed["reason"], failed


@pytest.mark.parametrize("body, field, words", [
    ({"script": "missing.py"}, "script", "no such file"),
    ({"script": "/etc/passwd.py"}, "script", "relative"),
    ({"script": "../bob/job.py"}, "script", "inside your working directory"),
    ({"script": "run.sh"}, "script", "not a Python file"),
    ({"script": "job.py", "args": "--lr 1"}, "args", "list of strings"),
    ({"script": "job.py", "args": [{"a": 1}]}, "args", "args[0]"),
    ({"script": "job.py", "parameters": {"lr": 1}}, "parameters", "notebook jobs"),
    ({"notebook_content": notebook("1"), "args": ["x"]}, "args", "only a script job"),
    ({"command": []}, "command", "must not be empty"),
    ({"command": "python train.py"}, "command", "list of strings"),
    ({"command": ["python", None]}, "command", "command[1]"),
    ({"command": ["python"], "script": "job.py"}, "command", "exactly one"),
    ({"command": ["python"], "args": ["x"]}, "args", "in command"),
    ({"script": "job.py", "pods": 0}, "pods", ">= 1"),
    ({"script": "job.py", "pods": 1.5}, "pods", "integer"),
    ({"script": "job.py", "pods": 9}, "pods", "at most 8"),
    ({"script": "job.py", "pods": 3, "gpus": 1}, "pods", "do not fit"),
    ({"script": "job.py", "pods": 2, "gpus": 2}, "pods", "do not fit"),
    ({"script": "job.py", "pods": 5, "gpus": 0.5}, "pods", "do not fit"),
])
def test_submission_errors_name_the_field(hub, body, field, words):
    r = hub.api("POST", "jobs", hub.token("alice"), json=body)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field and words in r.json()["message"], r.json()


def test_gang_gets_the_torch_distributed_contract_and_per_rank_logs(hub):
    alice = hub.token("alice")
    r = hub.api("POST", "jobs", alice, json={"script": "worker.py", "args": ["ok", "2"], "pods": 2, "gpus": 0.5})
    assert r.status_code == 201, r.text
    workers = hub.wait_job(alice, r.json()["id"], {"running"}, 60)["workers"]
    job = hub.wait_job(alice, r.json()["id"], {"succeeded", "failed"}, 90)
    assert job["status"] == "succeeded" and job["reason"] == "succeeded: the program exited with status 0 in all 2 workers"
    assert job["pods"] == 2 and [w["rank"] for w in job["workers"]] == [0, 1]
    envs = [_out(r"ENV=(\{.*\})", _log(hub, alice, job["id"], rank)) for rank in (0, 1)]
    for rank, env in enumerate(envs):
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == str(rank)
        assert env["LOCAL_WORLD_SIZE"] == "2" and env["NODE_RANK"] == "0" and env["MASTER_ADDR"] == "127.0.0.1"
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"] and int(envs[0]["MASTER_PORT"]) > 0
    for w, env in zip(workers, envs):  # each worker sees only its own pod's GPU share
        assert w["node"] == "box" and w["fraction"] == 0.5
        assert env["CUDA_VISIBLE_DEVICES"] == env["GPUPOOL_GPUS"] == str(w["gpus"][0])
    assert "done rank 1" in _log(hub, alice, job["id"], 1) and "done rank 1" not in _log(hub, alice, job["id"])
    bad = hub.api("GET", f"jobs/{job['id']}/log?rank=2", alice)
    assert bad.status_code == 400 and bad.json()["field"] == "rank" and "0 to 1" in bad.json()["message"]


def test_a_failing_worker_fails_the_gang_and_stops_the_others(hub):
    alice = hub.token("alice")
    r = hub.api("POST", "jobs", alice, json={"script": "worker.py", "args": ["fail", "300"], "pods": 2, "gpus": 1})
    job = hub.wait_job(alice, r.json()["id"], {"succeeded", "failed"}, 90)
    assert job["status"] == "failed", job
    assert "worker 1" in job["reason"] and "rank 1 gives up: bad shard" in job["reason"], job["reason"]
    assert job["allocation"] == [] and not hub.job_pids()  # rank 0 (sleeping 300 s) was stopped with it


def test_a_dying_worker_requeues_the_whole_gang(hub):
    alice = hub.token("alice")
    r = hub.api("POST", "jobs", alice, json={"script": "worker.py", "args": ["die", "1"], "pods": 2, "gpus": 1})
    job = hub.wait_job(alice, r.json()["id"], {"succeeded", "failed"}, 120)
    assert job["status"] == "succeeded" and job["restarts"] == 1 and job["attempts"] == 2, job
    log1 = _log(hub, alice, job["id"], 1)
    assert "=== gpupool: attempt 2" in log1 and "done rank 1" in log1
    assert "=== gpupool: attempt 2" in _log(hub, alice, job["id"])  # rank 0 was restarted with it


def test_cli_submits_workers_and_reads_per_rank_logs(hub):
    env = dict(os.environ, GPUPOOL_URL=hub.hub_url, GPUPOOL_TOKEN=hub.token("alice"),
               GPUPOOL_CLIENT_CONFIG="/nonexistent/gpupool.json")
    for k in ("GPUPOOL_API_URL", "GPUPOOL_API_TOKEN", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL"):
        env.pop(k, None)

    def run(*args):
        res = subprocess.run([GPUPOOL, *args], capture_output=True, text=True, env=env, timeout=120)
        assert "Traceback" not in res.stderr, res.stderr
        return res

    res = run("submit", "--workers", "2", "--gpus", "1", "--json", "--command", "python", "worker.py", "ok", "0")
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)
    assert job["command"] == ["python", "worker.py", "ok", "0"] and job["pods"] == 2
    hub.wait_job(env["GPUPOOL_TOKEN"], job["id"], {"succeeded"}, 90)
    res = run("logs", job["id"], "--rank", "1")
    assert res.returncode == 0 and '"RANK": "1"' in res.stdout
    res = run("describe", job["id"])
    assert re.search(rf"{job['id']}\s+worker\s.*succeeded\s+2x1\s", run("list", "--all").stdout)
    assert job["name"] == "worker" and re.search(rf"^  rank 1: box GPUs \d  \(gpupool logs {job['id']} --rank 1\)$",
                                                 res.stdout, re.M), res.stdout  # where it ran
    res = run("submit", "--pods", "2", "worker.py", "ok", "0", "--gpus", "1")  # after the script: its own args
    assert res.returncode == 0, res.stderr
    jid = res.stdout.split()[1]
    assert hub.api("GET", f"jobs/{jid}", env["GPUPOOL_TOKEN"]).json()["args"] == ["ok", "0", "--gpus", "1"]
    res = run("submit", "--pods", "0", "worker.py")
    assert res.returncode == 2 and "--pods" in res.stderr


def steps_of(path: Path) -> list[tuple[int, int]]:
    """(attempt, step) for every step a rank executed, in order."""
    return [tuple(map(int, re.search(r"attempt=(\d+) rank=\d+ step=(\d+)", line).groups()))
            for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_torch_ddp_gang_is_preempted_as_a_unit_and_every_rank_resumes(hub):
    """THE test of distributed jobs: two torch.distributed workers (gloo, CPU) through the real hub:
    an all-reduce checked, DDP steps with a checkpoint after each (rank 0 saves), a preemption in
    the middle (alice reclaims the GPU bob's gang borrowed), and a resume in which every rank
    continues from the saved step."""
    alice, bob = hub.token("alice"), hub.token("bob")
    record = hub.home("bob") / "ddp-record"
    record.mkdir()
    r = hub.api("POST", "jobs", bob, json={"script": "ddp_train.py", "pods": 2, "gpus": 1,
                                           "args": ["--steps", "16", "--step-seconds", "0.3", "--record", str(record)]})
    assert r.status_code == 201, r.text
    gang = r.json()["id"]
    running = hub.wait_job(bob, gang, {"running"}, 60)
    assert sorted(p["gpus"][0] for p in running["allocation"]) == [0, 1]  # both workers, started together
    assert [(w["rank"], w["node"], len(w["gpus"])) for w in running["workers"]] == [(0, "box", 1), (1, "box", 1)]
    hub.wait_for(lambda: all((record / f"steps-rank{k}.txt").exists() and len(steps_of(record / f"steps-rank{k}.txt")) >= 3
                             for k in (0, 1)), 120, message="the DDP workers did not train")

    mine = hub.api("POST", "jobs", alice, json={"notebook_content": notebook("import time; time.sleep(1)"),
                                                "gpus": 1}).json()["id"]
    victim = hub.wait_preempted(bob, [gang], 60)
    assert "reclaim" in victim["reason"] or "vision" in victim["reason"], victim["reason"]
    assert hub.wait_job(alice, mine, {"succeeded", "failed"}, 120)["status"] == "succeeded"
    final = hub.wait_job(bob, gang, {"succeeded", "failed"}, 240)
    logs = [_log(hub, bob, gang, k) for k in (0, 1)]
    assert final["status"] == "succeeded", (final, logs)
    assert final["preemptions"] == 1 and final["attempts"] == 2, final

    for k, log in enumerate(logs):
        assert f"rank {k}/2: all-reduce 3 == 3" in log  # the all-reduce's result, checked in every attempt
        assert f"rank {k}: asked to stop (preempted" in log  # the preemption reached every worker
        steps = steps_of(record / f"steps-rank{k}.txt")
        assert [s for _, s in steps] == list(range(16)), steps  # every step exactly once across attempts
        first = [s for a, s in steps if a == 1]
        second = [s for a, s in steps if a == 2]
        assert first and second and second[0] == first[-1] + 1, steps
        assert f"rank {k}: attempt 2: resumed at step {second[0]}" in log  # every rank restored the checkpoint
    weights = [re.search(r"finished 16 steps; weights (\S+)", log).group(1) for log in logs]
    assert weights[0] == weights[1]  # DDP kept the replicas identical through the resume
    assert final["checkpoint"]["latest"].endswith("ckpt-000016.pkl")


RANK_NB = notebook("import os, gpupool\nrank = int(os.environ['RANK'])\nprint('notebook rank', rank, 'of', os.environ['WORLD_SIZE'])\n"
                   "if rank == 0:\n    gpupool.log_metric('score', 10 - (x - 3) ** 2, step=0)",
                   parameters="x = 0.0")


def test_python_client_notebook_workers_job_view_and_sweep_trials_with_workers(hub, tmp_path):
    """From a notebook cell: gpupool.submit(script, args=, pods=), a notebook run by papermill in
    every rank (an output notebook per rank), the job view with its workers and their logs, and a
    sweep whose trials have two workers each."""
    import nbformat

    import gpupool
    from gpupool.client.api import Client
    from gpupool.widgets import render

    alice = Client(hub.hub_url, hub.token("alice"))
    job = gpupool.submit("worker.py", args=["ok", "0"], pods=2, gpus=1, client=alice)
    assert job.data["pods"] == 2 and job.data["args"] == ["ok", "0"]
    job.wait(timeout=90, progress=False)
    assert job.status == "succeeded" and '"RANK": "1"' in job.logs(rank=1) and '"RANK": "0"' in job.logs()
    cmd = gpupool.submit(["python", "worker.py", "ok", "0"], pods=2, gpus=0.5, client=alice).wait(90, progress=False)
    assert cmd.status == "succeeded" and cmd.data["command"][:2] == ["python", "worker.py"]
    with pytest.raises(gpupool.BadRequest) as e:
        gpupool.submit("worker.py", pods=3, gpus=1, client=alice)
    assert e.value.field == "pods"

    nbformat.write(nbformat.from_dict(RANK_NB), str(hub.home("alice") / "rank.ipynb"))
    nb = gpupool.submit("rank.ipynb", pods=2, gpus=0.5, client=alice, parameters={"x": 2.0})
    running = hub.wait_job(hub.token("alice"), nb.id, {"running", "succeeded"}, 60)
    html = render.job_html(running, "rank 0 says hi", {1: "rank 1 says hi"})
    assert "2 workers" in html and "log (rank 1)" in html and "rank 1 says hi" in html
    view = gpupool.JobView(nb, autorefresh=False, client=alice)
    try:
        nb.wait(timeout=90, progress=False)
        data = view.fetch()
        assert "notebook rank 1 of 2" in data["rank_logs"][1] and "notebook rank 0 of 2" in data["log"]
        assert "log (rank 1)" in view.render(data)
    finally:
        view.close()
    assert nb.status == "succeeded", nb.reason
    out1 = nbformat.reads(alice.request("GET", f"jobs/{nb.id}/output", params={"rank": 1}, raw=True).text, 4)
    assert "notebook rank 1 of 2" in json.dumps(out1.cells[-1].outputs)
    assert "notebook rank 0 of 2" in json.dumps(nb.output().cells[-1].outputs)

    s = gpupool.sweep("rank.ipynb", space={"x": [2.0, 3.0]}, objective="score", trials=2, parallel=2, gpus=0.5,
                      pods=2, sampler="grid", pruner=None, name="gang-sweep", storage=tmp_path / "s.db", poll=0.5,
                      client=alice)
    s.wait(timeout=180, progress=False)
    assert s.status == "finished", s.error
    trials = alice.jobs(sweep="gang-sweep")
    assert len(trials) == 2 and all(t["pods"] == 2 and t["status"] == "succeeded" for t in trials)
    assert s.best.params == {"x": 3.0} and s.best.value == pytest.approx(10.0)


def test_service_restart_readopts_every_worker_of_a_gang(tmp_path):
    """SIGKILL the service while a gang runs, even with its handle lost (as if the service died
    between writing "starting" and the handle): the restarted service finds every worker again by
    its run id; nothing is restarted and the job finishes in its first attempt."""
    import signal
    import sqlite3

    with Hub(tmp_path, gpupool={"nodes": [{"name": "box", "gpus": 2}]}, users=["alice"], managed=False) as hub:
        (hub.home("alice") / "worker.py").write_text(WORKER)
        tok = hub.token("alice")
        jid = hub.api("POST", "jobs", tok, json={"script": "worker.py", "args": ["ok", "6"], "pods": 2,
                                                 "gpus": 1}).json()["id"]
        hub.wait_job(tok, jid, {"running"}, 60)
        hub.wait_for(lambda: "ENV=" in _log(hub, tok, jid, 1) and "ENV=" in _log(hub, tok, jid), 30)
        hub.kill_service(signal.SIGKILL)
        db = sqlite3.connect(hub.settings["db_url"].removeprefix("sqlite:///"))
        db.execute("UPDATE workloads SET status='starting', handle=NULL WHERE id=?", (int(jid[2:]),))
        db.commit()
        db.close()
        hub.start_service()
        job = hub.wait_job(tok, jid, {"running", "succeeded"}, 30)
        assert job["attempts"] == 1 and job["restarts"] == 0, job
        job = hub.wait_job(tok, jid, {"succeeded", "failed"}, 60)
        assert job["status"] == "succeeded" and job["attempts"] == 1, job
        for rank in (0, 1):  # the same processes ran on: each worker started once
            log = _log(hub, tok, jid, rank)
            assert f"done rank {rank}" in log and log.count("ENV=") == 1 and "attempt 2" not in log, log


def test_a_database_from_before_distributed_jobs_gains_the_new_columns(tmp_path):
    """An upgraded service opens its old database: the job columns added since are added in
    place (old jobs are single-worker notebook jobs), nothing else changes."""
    import sqlalchemy as sa

    from gpupool.hub_ext import store as D

    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    engine = D.make_engine(url)
    with engine.begin() as conn:
        for col in ("pods", "script", "args", "command"):
            conn.execute(sa.text(f'ALTER TABLE workloads DROP COLUMN "{col}"'))
        conn.execute(sa.text("INSERT INTO workloads (type, user, server, name, queue, kind, gpus, gpu_memory, cpu, "
                             "memory, priority, preemptible, checkpoint_on_signal, parameters, status, reason, "
                             "submitted_at, preemptions, restarts, attempt) VALUES ('job', 'alice', '', 'old', 'q', "
                             "'train', 1, 0, 0, 0, 50, 1, 0, '{}', 'queued', '', 1.0, 0, 0, 0)"))
    engine.dispose()
    engine = D.make_engine(url)
    with D.make_sessionmaker(engine)() as s:
        row = s.scalars(sa.select(D.Workload)).one()
        assert (row.name, row.pods, row.script, row.args, row.command) == ("old", 1, None, None, None)
    engine.dispose()


def test_the_contract_from_placements_and_the_helpers():
    """Pure: RANK is the pod index; LOCAL_RANK / LOCAL_WORLD_SIZE / NODE_RANK from which workers
    share a node; the JAX and torchrun arguments come from the same variables."""
    from gpupool import distributed as gd

    placements = [{"pod": 2, "node": "b", "gpus": [0]}, {"pod": 0, "node": "a", "gpus": [0]},
                  {"pod": 1, "node": "a", "gpus": [1]}, {"pod": 3, "node": "b", "gpus": [1]}]
    envs = [gd.worker_env(placements, r, "10.0.0.1", 29400) for r in range(4)]
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["NODE_RANK"]) for e in envs] == [
        ("0", "0", "2", "0"), ("1", "1", "2", "0"), ("2", "0", "2", "1"), ("3", "1", "2", "1")]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"} and set(gd.CONTRACT) <= set(envs[0])
    old = dict(os.environ)
    try:
        os.environ.update(envs[3])
        assert (gd.rank(), gd.world_size(), gd.local_rank(), gd.is_main(), gd.is_distributed()) == (3, 4, 1, False, True)
        assert gd.jax_initialize_args() == {"coordinator_address": "10.0.0.1:29400", "num_processes": 4, "process_id": 3}
        assert gd.torchrun_args(2) == ["--nnodes=4", "--node-rank=3", "--nproc-per-node=2", "--master-addr=10.0.0.1",
                                       "--master-port=29400"]
        os.environ.pop("GPUPOOL_STOP_FILE", None)
        assert gd.should_stop() is False  # no stop file, torch.distributed not initialised: the local answer
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert (gd.rank(), gd.world_size(), gd.is_main()) == (0, 1, True)  # outside a distributed job


async def test_gpu_memory_share_of_a_gang_is_held_per_gpu(tmp_path):
    """A gang of two half-GPU workers gets a GPU each (a distributed job's ranks never share a
    device), and NVML memory accounting holds what is used on a GPU against the share on that GPU.
    NVML is nvml_standin's FakeNVML; loop, backend and the worker processes are real."""
    import asyncio
    import signal

    from nvml_standin import memory_loop

    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.domain.identity import Identity

    sessions, fake, backend, loop, svc = memory_loop(tmp_path, gpus=2)
    job = await svc.new_job(Identity(name="alice"), {"command": ["python", "-c", "import time; time.sleep(60)"],
                                                    "pods": 2, "gpus": 0.5})

    def row():
        with sessions() as s:
            return s.get(D.Workload, job.id)

    try:
        await loop.cycle()
        r = row()
        assert r.status == "running" and sorted(p["gpus"] for p in r.allocation) == [[0], [1]]
        for _ in range(50):
            if len(backend.pids(r.handle)) >= 4:  # two runners, two programs
                break
            await asyncio.sleep(0.1)
        pids = sorted(backend.pids(r.handle))
        fake.devices[0]["procs"] = [(pid, 6 * 2**30 // len(pids)) for pid in pids]  # 6Gi on GPU 0: within its 8Gi
        await loop.cycle()
        assert "warning" not in row().reason, row().reason
        fake.devices[0]["procs"] = [(pid, 10 * 2**30 // len(pids)) for pid in pids]  # 10Gi > GPU 0's 8Gi
        await loop.cycle()
        assert "more than its share of 8Gi" in row().reason, row().reason
    finally:
        for pid in backend.pids(row().handle or {"run_id": "none"}):
            os.kill(pid, signal.SIGKILL)
