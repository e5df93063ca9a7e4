"""Node pools through a real hub: two pools (a build environment of small GPUs, a train
environment of big ones) with quotas per pool, a workspace through the real spawner and command
jobs through the API and the CLI, each placed in its pools; a per-pool limit holds a job back; GET
pools / queues show the pools; and ``gpupool report --by pool`` shows the split of GPU-hours."""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest

from hub_harness import Hub, hub_leak_check  # noqa: F401 (leak check fixture)
from gpupool_cli import run
from spawner_harness import spawner_config, start_server, stop_server, wait_server_ready, workspace_of

pytestmark = pytest.mark.hub

NODES = [{"name": "small", "gpus": 2, "gpu_memory": "24Gi", "gpu_model": "L4", "pool": "build"},
         {"name": "big", "gpus": 4, "gpu_memory": "80Gi", "gpu_model": "H100", "pool": "train"}]
QUEUES = [{"name": "vision", "users": ["alice"],
           "pools": {"build": {"deserved": {"gpu": 1}}, "train": {"deserved": {"gpu": 2}, "limit": {"gpu": 3}}}},
          {"name": "nlp", "users": ["bob"],
           "pools": {"build": {"deserved": {"gpu": 1}}, "train": {"deserved": {"gpu": 2}}}}]
SLEEP = ["python", "-c", "import time; time.sleep(6)"]


def _iso(t: str) -> float:
    return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()


def test_two_pools_with_quotas_through_the_spawner_and_jobs_and_the_report_by_pool(tmp_path):
    gp = {"nodes": NODES, "queues": QUEUES,
          "pool_preference": {"interactive": ["build", "train"], "train": ["train", "build"]}}
    with Hub(tmp_path, gpupool=gp, users=["alice", "bob"], admins=["admin"],
             extra_config=spawner_config(tmp_path)) as hub:
        alice = hub.token("alice")
        # a workspace through the real spawner: the build environment (its kind's preference)
        start_server(hub, "alice", {"gpus": 1, "queue": "vision"})
        wait_server_ready(hub, "alice")
        ws = workspace_of(hub, "alice")
        assert ws["pools"] == ["build", "train"] and [p["node"] for p in ws["allocation"]] == ["small"]
        # jobs: the train environment by default; a job naming the build pool; one through the CLI
        j1 = hub.api("POST", "jobs", alice, json={"command": SLEEP, "gpus": 2}).json()
        j2 = hub.api("POST", "jobs", alice, json={"command": SLEEP, "gpus": 1, "pools": ["build"]}).json()
        env = {"GPUPOOL_URL": hub.hub_url, "GPUPOOL_TOKEN": alice}
        res = run("submit", "--pool", "train", "-g", "1", "--json", "--command", *SLEEP, env=env)
        assert res.returncode == 0, res.stderr
        j3 = json.loads(res.stdout)
        assert (j1["pools"], j2["pools"], j3["pools"]) == (["train", "build"], ["build"], ["train"])
        res = run("describe", j1["id"], env=env)
        assert res.returncode == 0 and re.search(r"^pools:\s+train, build$", res.stdout, re.M), res.stdout
        # a pool no node is in: 400 naming the field
        bad = hub.api("POST", "jobs", alice, json={"command": SLEEP, "gpus": 1, "pools": ["gpu-farm"]})
        assert bad.status_code == 400 and bad.json()["field"] == "pools", bad.text
        assert "no node is in pool 'gpu-farm'" in bad.json()["message"]
        running = {j["id"]: hub.wait_job(alice, j["id"], {"running", "succeeded"}) for j in (j1, j2, j3)}
        node = {jid: {p["node"] for p in j["allocation"]} for jid, j in running.items()}
        assert node == {j1["id"]: {"big"}, j2["id"]: {"small"}, j3["id"]: {"big"}}, running
        # vision holds 3 GPUs of pool train, its limit there: a fourth train job waits, saying so
        j4 = hub.api("POST", "jobs", alice, json={"command": SLEEP, "gpus": 1, "pools": ["train"]}).json()

        def waits():
            j = hub.api("GET", f"jobs/{j4['id']}", alice).json()
            return j if j["status"] == "queued" and j["reason_code"] == "limit" else None
        waiting = hub.wait_for(waits, 20, 0.3, message="the fourth train job does not wait at vision's limit")
        assert "train" in waiting["reason"], waiting["reason"]
        pools = {p["name"]: p for p in hub.api("GET", "pools", alice).json()["pools"]}
        assert (pools["build"]["allocated"], pools["train"]["allocated"]) == (2.0, 3.0), pools
        assert pools["train"]["queued"] >= 1 and pools["train"]["gpu_models"] == ["H100"]
        vision = next(q for q in hub.api("GET", "queues", alice).json()["queues"] if q["name"] == "vision")
        assert vision["pools"]["train"]["limit"] == {"gpu": 3.0} and vision["pools"]["train"]["allocated"]["gpu"] == 3
        assert vision["usage"] is None  # fairness over time is off
        # everything ends: the waiting job runs once the others finish
        done = [hub.wait_job(alice, j["id"], {"succeeded"}, timeout=90) for j in (j1, j2, j3, j4)]
        assert done[3]["workers"][0]["node"] == "big"  # where it ran: its pool, train
        stop_server(hub, "alice")
        # the report by pool: each pool's GPU-hours are its jobs' (and the workspace's) GPUs x time
        since = (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%d")
        admin = {"GPUPOOL_URL": hub.hub_url, "GPUPOOL_TOKEN": hub.admin_token}
        res = run("report", "--since", since, "--by", "pool", env=admin)
        assert res.returncode == 0, res.stderr
        rows = [ln.split() for ln in res.stdout.splitlines()]
        header = next(i for i, r in enumerate(rows) if r[:2] == ["POOL", "ALLOCATED"])
        lines = {r[0]: r[1:] for r in rows[header + 1:header + 4]}
        assert set(lines) == {"build", "train", "total"}, res.stdout
        doc = hub.api("GET", f"usage?by=pool&since={since}", hub.admin_token).json()
        got = {r["pool"]: r["allocated_gpu_hours"] for r in doc["rows"]}
        expect = {"build": 0.0, "train": 0.0}
        for j in done:
            attempt = j["history"][-1]
            pool = "train" if attempt["placement"][0]["node"] == "big" else "build"
            expect[pool] += j["gpus"] * (_iso(attempt["ended_at"]) - _iso(attempt["started_at"])) / 3600
        assert got["train"] == pytest.approx(expect["train"], abs=2 / 3600)
        assert got["build"] > expect["build"]  # the build pool also held alice's workspace
        assert doc["total"]["allocated_gpu_hours"] == pytest.approx(got["build"] + got["train"], abs=1e-5)
        assert f"{got['train']:.2f}" == lines["train"][0] and f"{got['build']:.2f}" == lines["build"][0]
