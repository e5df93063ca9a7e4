"""Node pools through a real hub: two pools (a build environment of small GPUs, a train
environment of big ones) with quotas per pool, a workspace through the real spawner and command
jobs through the API and the CLI, each placed in its pools; a per-pool limit holds a job back; GET
pools / queues show the pools; and ``gpupool report --by pool`` shows the split of GPU-hours.
Fairness over time in a real hub: a queue's past usage lowers its share, and the API, `gpupool
queues` and the dashboard (Chromium) show the share without past usage beside it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

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
        assert vision["usage"] is None and vision["fair_share_plain"] is None  # fairness over time is off
        assert vision["pools"]["train"]["fair_share_plain"] is None
        res = run("queues", env=env)  # nothing of fairness over time: no USAGE, no WITHOUT-USAGE column
        assert res.returncode == 0 and "FAIR-SHARE" in res.stdout and "USAGE" not in res.stdout, res.stdout
        # the welcome notebook's cell that lists the queues, as written: vision's quota is per pool
        out = subprocess.run([sys.executable, "-c", _demo_cell("for q in gpupool.queues():")], env={**os.environ, **env},
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "vision     deserved 3 GPUs, using 5" in out.stdout, out.stdout + out.stderr
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


def _demo_cell(marker: str) -> str:
    """The source of the cell of examples/demo.ipynb that contains ``marker``."""
    nb = json.loads((Path(__file__).resolve().parents[2] / "examples" / "demo.ipynb").read_text())
    return next("".join(c["source"]) for c in nb["cells"] if marker in "".join(c["source"]))


FAIR_NODES = [{"name": "t", "gpus": 4}]
FAIR_QUEUES = [{"name": "a", "users": ["alice"], "deserved": {"gpu": 0}},
               {"name": "b", "users": ["bob"], "deserved": {"gpu": 0}}]


def test_fairness_over_time_shows_the_share_without_past_usage_in_the_api_cli_and_dashboard(tmp_path):
    """Queue a holds the 4 GPUs for a few seconds; then a and b each want all 4. a's past usage
    lowers its share below b's: GET queues, `gpupool queues` and the dashboard show each queue's
    share and, beside it, the share without past usage (2 GPUs each: equal weights)."""
    from browser_harness import chromium, open_dashboard
    from shared_hub import PASSWORD

    gp = {"nodes": FAIR_NODES, "queues": FAIR_QUEUES, "fairness": {"window": "1m", "k": 4}}
    with Hub(tmp_path, gpupool=gp, users=["alice", "bob"], admins=["admin"],
             extra_config=f"c.DummyAuthenticator.password = {PASSWORD!r}\n") as hub:
        alice, bob = hub.token("alice"), hub.token("bob")
        first = hub.api("POST", "jobs", alice, json={"command": ["python", "-c", "import time; time.sleep(4)"],
                                                     "gpus": 4, "queue": "a"}).json()
        hub.wait_job(alice, first["id"], {"succeeded"})
        long = ["python", "-c", "import time; time.sleep(120)"]
        jobs = [(t, hub.api("POST", "jobs", t, json={"command": long, "gpus": 2, "queue": q}).json())
                for t, q in ((alice, "a"), (bob, "b"), (alice, "a"), (bob, "b"))]

        def both_want():
            qs = {q["name"]: q for q in hub.api("GET", "queues", alice).json()["queues"]}
            wanting = all(qs[q]["running"] + qs[q]["pending"] == 2 for q in "ab")  # the cycle saw all four
            return qs if wanting and qs["a"]["fair_share_plain"] is not None else None
        qs = hub.wait_for(both_want, 20, 0.3, message="no share without past usage once both queues want GPUs")
        a, b = qs["a"], qs["b"]
        assert a["usage"] > 0 and a["usage"] > b["usage"], (a, b)
        # equal weights, both wanting the 4 GPUs: 2 each without past usage; a used more, so it gets less
        assert a["fair_share_plain"] == b["fair_share_plain"] == {"gpu": 2.0}, (a, b)
        assert a["fair_share"]["gpu"] < 2.0 < b["fair_share"]["gpu"], (a, b)
        assert a["fair_share"]["gpu"] + b["fair_share"]["gpu"] == pytest.approx(4.0)
        assert a["pools"]["default"]["fair_share_plain"] == {"gpu": 2.0}
        # gpupool queues (the real CLI): WITHOUT-USAGE right after FAIR-SHARE, and what it means
        res = run("queues", env={"GPUPOOL_URL": hub.hub_url, "GPUPOOL_TOKEN": alice})
        assert res.returncode == 0, res.stderr
        rows = [ln.split() for ln in res.stdout.splitlines()]
        header = rows[0]
        assert header[header.index("FAIR-SHARE") + 1] == "WITHOUT-USAGE" and "USAGE" in header, res.stdout
        cells = {r[0]: dict(zip(header, r)) for r in rows[1:3]}
        assert cells["a"]["WITHOUT-USAGE"] == cells["b"]["WITHOUT-USAGE"] == "2", res.stdout
        assert float(cells["a"]["FAIR-SHARE"]) < 2 < float(cells["b"]["FAIR-SHARE"]), res.stdout
        assert "WITHOUT-USAGE: the fair share it would have without past usage" in res.stdout
        # the dashboard: the column and the chart's dataset
        with chromium() as browser:
            page = open_dashboard(browser, hub, "admin")
            assert page.locator("#queue-pools th", has_text="without past usage").count() == 1
            cell = page.locator('#queue-pools td.plain-share[data-queue="a"]').inner_text()
            assert cell == "2.00", page.content()[:3000]
            labels = page.evaluate("() => Chart.getChart(document.getElementById('queues-chart'))"
                                   ".data.datasets.map(d => d.label)")
            assert "fair share without past usage" in labels, labels
        for t, j in jobs:
            hub.api("DELETE", f"jobs/{j['id']}", t)
