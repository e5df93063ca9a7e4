"""The `gpupool` command, run as a subprocess against the real hub."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_client import _dead_port

GPUPOOL = str(Path(sys.executable).parent / "gpupool")


def run(*args, env=None, timeout=120):
    e = dict(os.environ)
    for k in ("GPUPOOL_URL", "GPUPOOL_TOKEN", "GPUPOOL_API_URL", "GPUPOOL_API_TOKEN", "JUPYTERHUB_API_URL",
              "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_PUBLIC_HUB_URL"):
        e.pop(k, None)
    e["GPUPOOL_CLIENT_CONFIG"] = "/nonexistent/gpupool.json"
    e.update(env or {})
    res = subprocess.run([GPUPOOL, *args], capture_output=True, text=True, env=e, timeout=timeout)
    assert "Traceback" not in res.stderr, res.stderr
    return res


@pytest.fixture(scope="module")
def env(hub):
    """alice's terminal: the hub URL and her token in the environment."""
    return {"GPUPOOL_URL": hub.hub_url, "GPUPOOL_TOKEN": hub.token("alice")}


def test_usage_errors_exit_2_without_traceback():
    res = run("submit")
    assert res.returncode == 2 and "notebook" in res.stderr
    res = run("submit", "train.ipynb", "-g", "lots")
    assert res.returncode == 2 and "'lots' is not a number of GPUs" in res.stderr
    res = run("submit", "train.ipynb", "-p", "lr", "--url", "http://127.0.0.1:1")
    assert res.returncode == 2 and "expected NAME=VALUE" in res.stderr
    res = run("sweep", "train.ipynb", "--objective", "acc", "--space", "lr=loguni(1,2)", "--url", "http://127.0.0.1:1")
    assert res.returncode == 2 and "unknown function 'loguni'" in res.stderr


def test_unreachable_service_and_missing_config_exit_1():
    port = _dead_port()
    res = run("queues", "--url", f"http://127.0.0.1:{port}")
    assert res.returncode == 1 and f"127.0.0.1:{port}" in res.stderr and "connection refused" in res.stderr
    res = run("list")
    assert res.returncode == 1 and "does not know where the service is" in res.stderr


@pytest.mark.hub
@pytest.mark.slow
def test_submit_list_describe_logs_delete(hub, env):
    res = run("submit", "tiny.ipynb", "-g", "0.5", "-q", "vision", "-p", "lr=0.5", "-p", "steps=2", "--wait", env=env)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.split()[1]
    assert res.stdout.startswith(f"submitted {job_id} (tiny) to queue vision") and f"{job_id} succeeded" in res.stdout

    res = run("describe", job_id, env=env)
    assert res.returncode == 0 and re.search(r"^status: +succeeded$", res.stdout, re.M) and '"lr": 0.5' in res.stdout
    assert "acc: 2 points, last 0.5 at step 1" in res.stdout
    desc = json.loads(run("describe", job_id, "--json", env=env).stdout)
    assert desc["id"] == job_id and desc["metrics"]["acc"][1]["value"] == 0.5
    res = run("logs", job_id, env=env)
    assert res.returncode == 0 and "trained with lr 0.5" in res.stdout
    res = run("logs", job_id, "-f", env=env)  # a finished job: prints it all and returns
    assert res.returncode == 0 and "trained with lr 0.5" in res.stdout

    res = run("submit", "sleepy.ipynb", "--gpu-memory", "8Gi", "--kind", "inference", "--json", env=env)
    sleeper = json.loads(res.stdout)
    assert sleeper["kind"] == "inference" and sleeper["gpu_memory"] in ("8Gi", 8 * 2**30)
    listed = run("list", env=env).stdout
    assert sleeper["id"] in listed and job_id not in listed  # finished ones need --all
    assert job_id in run("list", "--all", env=env).stdout
    ids = [j["id"] for j in json.loads(run("list", "--all", "--json", env=env).stdout)]
    assert {job_id, sleeper["id"]} <= set(ids)
    hub.wait_job(env["GPUPOOL_TOKEN"], sleeper["id"], {"running"}, timeout=60)
    top = run("top", env=env).stdout
    assert "box" in top and f"alice:{sleeper['id']}(" in top
    res = run("delete", sleeper["id"], env=env)
    assert res.returncode == 0 and sleeper["id"] in res.stdout
    hub.wait_job(env["GPUPOOL_TOKEN"], sleeper["id"], {"cancelled"}, timeout=60)


@pytest.mark.hub
def test_queues_nodes_top_and_service_errors(hub, env):
    res = run("queues", env=env)
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and lines[0].split()[:5] == ["QUEUE", "PARENT", "DESERVED", "FAIR-SHARE", "ALLOCATED"]
    vision = next(line for line in lines if line.startswith("vision")).split()
    assert vision[2] == "2" and vision[-1] == "yes"
    assert next(line for line in lines if line.startswith("nlp")).split()[-1] == "no"
    assert {q["name"] for q in json.loads(run("queues", "--json", env=env).stdout)} == {"vision", "nlp"}
    nodes = run("nodes", env=env).stdout
    assert "box " in nodes and "box2" in nodes
    top = run("top", env=env).stdout.splitlines()
    assert top[0].startswith("NODE") and sum(1 for line in top[1:] if "[" in line) == 3  # 3 GPUs

    res = run("submit", "tiny.ipynb", "-g", "0.5", "-q", "nope", env=env)
    assert res.returncode == 1 and "queue: unknown queue 'nope'" in res.stderr
    res = run("submit", "tiny.ipynb", "-q", "nlp", env=env)
    assert res.returncode == 1 and "nlp" in res.stderr
    res = run("describe", "j-999999", env=env)
    assert res.returncode == 1 and "j-999999" in res.stderr
    res = run("list", "--url", hub.hub_url, "--token", "wrong", env={})
    assert res.returncode == 1 and "token" in res.stderr.lower()


@pytest.mark.hub
@pytest.mark.slow
def test_sweep_command(hub, env, tmp_path):
    res = run("sweep", "quad.ipynb", "--space", "x=2,3", "--space", "steps=2", "--objective", "score",
              "--sampler", "grid", "--parallel", "2", "-g", "0.25", "--name", "cli-sweep",
              "--storage", str(tmp_path / "sweeps.db"), "--poll", "0.5", env=env, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sweep cli-sweep: started (2 trials, 2 at a time" in res.stdout
    assert 'best: score=10 trial' in res.stdout and '{"x": 3}' in res.stdout
    trials = json.loads(run("list", "--all", "--sweep", "cli-sweep", "--json", env=env).stdout)
    assert len(trials) == 2 and {t["kind"] for t in trials} == {"hpo-trial"}
    assert sorted(t["parameters"]["x"] for t in trials) == [2, 3]
    assert all(t["parameters"]["steps"] == 2 for t in trials)
