"""Accounting: the usage ledger, utilisation history and consumption reports (docs/admin.md).

A scenario with known GPU-hours is played through the real scheduling loop with an injected clock
(workspaces are admitted by ``SchedulerLoop.cycle`` and released the way ``DELETE workspaces``
releases them), NVML readings come through the real sampler from a stand-in, and the database it
leaves is then served by a real hub: ``GET usage`` and ``gpupool report`` must give the known
numbers, and every grouping must add up to the pool's total.
"""
from __future__ import annotations

import csv
import io
import types
from datetime import datetime, timezone

import pytest

from api_fuzzing import check_documented
from hub_harness import Hub, hub_leak_check  # noqa: F401 (leak check fixture)
from gpupool_cli import run

pytestmark = pytest.mark.hub

NODES = [{"name": "box", "gpus": 4, "gpu_model": "A100"}, {"name": "box2", "gpus": 2, "gpu_model": "L4"}]
QUEUES = [{"name": "research", "deserved": {"gpu": 4}},
          {"name": "vision", "parent": "research", "deserved": {"gpu": 2}, "users": ["alice"]},
          {"name": "nlp", "parent": "research", "deserved": {"gpu": 2}, "users": ["bob"]},
          {"name": "ops", "deserved": {"gpu": 2}, "users": ["carol"]}]
T0 = datetime(2026, 11, 2, 22, 0, tzinfo=timezone.utc).timestamp()  # two hours before midnight
H = 3600.0

# (user, queue, GPUs, start hour, end hour) from T0; alice's interval crosses midnight
SCENARIO = [("alice", "vision", 2, 0, 3), ("bob", "nlp", 1, 0, 1.5), ("carol", "ops", 0.5, 1, 5)]
KNOWN = {  # GPU-hours
    "user": {"alice": 6.0, "bob": 1.5, "carol": 2.0},
    "queue": {"vision": 6.0, "nlp": 1.5, "ops": 2.0},
    "department": {"research": 7.5, "ops": 2.0},
    "day": {"2026-11-02": 4.0 + 1.5 + 0.5, "2026-11-03": 2.0 + 1.5},
}
TOTAL = 9.5


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


async def play_scenario(tmp_path, monkeypatch) -> tuple[str, dict, dict]:
    """Run SCENARIO through the real loop and sampler; returns the database URL, the ledger and the
    Prometheus text scraped just before each event and at the end, by hour."""
    import time as real_time

    from gpupool.backends.local import LocalBackend
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.runtime import loop as loop_mod
    from gpupool.hub_ext.config import load
    from gpupool.hub_ext.store.ledger import UsageRecord
    from gpupool.hub_ext.runtime.metrics import Metrics
    from gpupool.hub_ext.runtime.sampling import Sampler

    clock = Clock(T0)
    monkeypatch.setattr(loop_mod, "time", types.SimpleNamespace(time=clock, perf_counter=real_time.perf_counter))
    url = f"sqlite:///{tmp_path / 'scenario.sqlite'}"
    settings = load({"nodes": NODES, "queues": QUEUES, "db_url": url, "job_root": str(tmp_path / "jobs"),
                     "work_dir": str(tmp_path), "run_as_user": False})
    sessions = D.make_sessionmaker(D.make_engine(url))
    loop = loop_mod.SchedulerLoop(settings, sessions, LocalBackend(), Metrics(clock=clock))
    loop.ledger.clock = clock
    await loop.recover()
    # box's GPUs read 40 % busy (an NVML stand-in answers through the sampler); box2 has no readings
    sampler = Sampler(sessions, lambda: {"box": {i: {"utilization": 40.0, "memory_used": 2**30} for i in range(4)}},
                      interval=600, raw_retention=H, rollup_seconds=1800, rollup_retention=90 * 86400, clock=clock)
    events = sorted([(start, "start", i) for i, (_, _, _, start, _) in enumerate(SCENARIO)]
                    + [(end, "end", i) for i, (*_, end) in enumerate(SCENARIO)])
    rows: dict[int, int] = {}
    t_sample = T0
    scrapes: dict[float, str] = {}
    for hour, what, i in events:
        while t_sample + 600 <= T0 + hour * H:  # readings every 10 minutes until this event
            t_sample += 600
            clock.t = t_sample
            sampler.sample()
        clock.t = T0 + hour * H
        scrapes[hour] = loop.metrics.render().decode()
        user, queue, gpus, *_ = SCENARIO[i]
        with sessions() as s:
            if what == "start":
                row = D.Workload(type=D.WORKSPACE, user=user, server="", name=user, queue=queue, kind="interactive",
                                 gpus=float(gpus), preemptible=False, parameters={}, status=D.QUEUED,
                                 submitted_at=clock.t)
                s.add(row)
                s.commit()
                rows[i] = row.id
            else:
                s.delete(s.get(D.Workload, rows[i]))  # what DELETE workspaces/{user} does
                s.commit()
        result = await loop.cycle()  # the release wakes the loop too
        if what == "start":
            assert [b.workload for b in result.binds] == [D.public_id(D.WORKSPACE, rows[i])]
    clock.t = T0 + 6 * H
    scrapes[6] = loop.metrics.render().decode()
    assert sampler.downsample()[0] > 0  # raw readings older than an hour merged into 30-minute rows
    with sessions() as s:
        ledger = {r.user: r for r in s.query(UsageRecord)}
    return url, ledger, scrapes


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    import asyncio

    mp = pytest.MonkeyPatch()
    try:
        return asyncio.run(play_scenario(tmp_path_factory.mktemp("usage"), mp))
    finally:
        mp.undo()


def test_ledger_records_each_interval(scenario):
    _, ledger, _ = scenario
    assert set(ledger) == {"alice", "bob", "carol"}
    for user, queue, gpus, start, end in SCENARIO:
        r = ledger[user]
        assert (r.queue, r.gpus, r.start, r.end) == (queue, gpus, T0 + start * H, T0 + end * H), user
        assert r.end_reason == "stopped" and r.kind == "interactive" and r.workload.startswith("w-")
        assert r.gpu_model == {"box": "A100", "box2": "L4"}[r.node]
        assert len(r.gpu_indices) == max(1, int(gpus)) and r.fraction == min(gpus, 1.0)
    assert ledger["alice"].queue_path == "research/vision" and ledger["alice"].department == "research"
    assert ledger["carol"].queue_path == "ops" and ledger["carol"].department == "ops"


def test_report_numbers_and_sums_agree(scenario):
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.domain.usage import report

    url, ledger, _ = scenario
    sessions = D.make_sessionmaker(D.make_engine(url))
    since, until, now = T0 - 86400, T0 + 86400, T0 + 86400
    with sessions() as s:
        docs = {by: report(s, since, until, by, now) for by in ("user", "queue", "department", "model", "node",
                                                                 "kind", "day", "week", "month")}
    for by, doc in docs.items():
        assert doc["total"]["allocated_gpu_hours"] == pytest.approx(TOTAL), by
        assert sum(r["allocated_gpu_hours"] for r in doc["rows"]) == pytest.approx(TOTAL), by
        assert sum(r["used_gpu_hours"] or 0 for r in doc["rows"]) == pytest.approx(doc["total"]["used_gpu_hours"])
    for by, known in KNOWN.items():
        assert {r[by]: r["allocated_gpu_hours"] for r in docs[by]["rows"]} == pytest.approx(known), by
    # used: 40 % of what ran on box (readings), unknown for box2 (none)
    on_box = sum(r.gpus * (r.end - r.start) / H for r in ledger.values() if r.node == "box")
    total = docs["user"]["total"]
    assert total["measured_gpu_hours"] == pytest.approx(on_box)
    assert total["used_gpu_hours"] == pytest.approx(0.4 * on_box)
    by_node = {r["node"]: r for r in docs["node"]["rows"]}
    if "box2" in by_node:
        assert by_node["box2"]["used_gpu_hours"] is None and by_node["box2"]["utilization"] is None
    assert by_node["box"]["utilization"] == pytest.approx(40.0)
    # the dashboard's timeline: mean GPUs allocated per hour
    from gpupool.hub_ext.domain.usage import timeline
    with sessions() as s:
        hours = timeline(s, T0, T0 + 6 * H, H, now)
    assert [h["allocated"] for h in hours] == pytest.approx([3.0, 3.0, 2.5, 0.5, 0.5, 0.0])
    assert hours[0]["t"] == "2026-11-02T22:00:00Z" and hours[5]["used"] is None
    # a range cuts intervals: only the first hour
    with sessions() as s:
        first = report(s, T0, T0 + H, "user", now)
    assert {r["user"]: r["allocated_gpu_hours"] for r in first["rows"]} == pytest.approx({"alice": 2.0, "bob": 1.0})


def test_prometheus_gpu_hours_allocated_agree_with_the_ledger(scenario):
    """``gpupool_gpu_hours_allocated_total`` exists at 0 for every leaf queue from the first cycle,
    counts a workspace from the cycle that admits it (as its ledger record does) and is current
    whenever it is scraped, also between cycles."""
    from prometheus_client.parser import text_string_to_metric_families

    *_, scrapes = scenario  # hour 0: the scrape after alice's cycle, before bob's (the later one is kept)
    for hour, text in scrapes.items():
        got = {s.labels["queue"]: s.value for f in text_string_to_metric_families(text)
               if f.name == "gpupool_gpu_hours_allocated" for s in f.samples if s.name.endswith("_total")}
        want = {q: sum(g * (min(end, hour) - min(start, hour)) for _, sq, g, start, end in SCENARIO if sq == q)
                 for q in ("vision", "nlp", "ops")}
        assert got == pytest.approx(want), (hour, got)  # leaves only: "research" is a department
    assert got == pytest.approx(KNOWN["queue"])


@pytest.fixture(scope="module")
def hub(scenario, tmp_path_factory):
    """A real hub serving the database the scenario left."""
    url, _, _ = scenario
    with Hub(tmp_path_factory.mktemp("usage-hub"), gpupool={"nodes": NODES, "queues": QUEUES, "db_url": url},
             users=["alice", "bob", "carol"], admins=["admin"], managed=False) as hub:
        yield hub


def test_usage_api_admins_see_all_users_their_own(hub):
    q = "usage?since=2026-11-01&until=2026-11-05&by="
    admin = hub.admin_token
    openapi = hub.api("GET", "openapi.json").json()
    for by, known in KNOWN.items():
        r = hub.api("GET", q + by, admin)
        check_documented(openapi, r)
        doc = r.json()
        assert {r[by]: r["allocated_gpu_hours"] for r in doc["rows"]} == pytest.approx(known), doc
        assert doc["total"]["allocated_gpu_hours"] == pytest.approx(TOTAL)
    alice = hub.token("alice")
    mine = hub.api("GET", q + "queue", alice).json()
    assert mine["user"] == "alice" and [(r["queue"], r["allocated_gpu_hours"]) for r in mine["rows"]] == [("vision", 6.0)]
    r = hub.api("GET", q + "user&user=bob", alice)
    assert r.status_code == 403 and r.json()["field"] == "user"
    bob_by_admin = hub.api("GET", q + "day&user=bob", admin).json()
    assert {r["day"]: r["allocated_gpu_hours"] for r in bob_by_admin["rows"]} == {"2026-11-02": 1.5}
    for bad, field in (("by=team", "by"), ("since=yesterday", "since"), ("since=2026-11-05&until=2026-11-01", "until"),
                       ("format=xml", "format"), ("colour=red", "colour")):
        r = hub.api("GET", "usage?" + bad, admin)
        assert r.status_code == 400 and r.json()["field"] == field, (bad, r.text)
    r = hub.api("GET", q + "user&format=csv", admin)
    assert r.headers["Content-Type"].startswith("text/csv")
    check_documented(openapi, r)
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert {t["user"]: float(t["allocated_gpu_hours"]) for t in table} == pytest.approx({**KNOWN["user"], "total": TOTAL})


def test_report_command(hub):
    env = {"GPUPOOL_URL": hub.hub_url, "GPUPOOL_TOKEN": hub.admin_token}
    res = run("report", "--since", "2026-11-01", "--until", "2026-11-05", "--by", "department", env=env)
    assert res.returncode == 0, res.stderr
    lines = {ln.split()[0]: ln.split()[1:] for ln in res.stdout.splitlines()[1:]}
    assert lines["research"][0] == "7.50" and lines["ops"][0] == "2.00" and lines["total"][0] == "9.50", res.stdout
    res = run("report", "--since", "2026-11-01", "--until", "2026-11-05", "--by", "day", "--csv", env=env)
    assert res.returncode == 0 and res.stdout.splitlines()[0].startswith("day,allocated_gpu_hours,used_gpu_hours")
    assert "2026-11-03,3.5," in res.stdout
    res = run("report", "--since", "someday", env=env)
    assert res.returncode == 1 and "since: 'someday' is not a date" in res.stderr
    from gpupool.client.report import default_since

    res = run("report", env=env)  # without --since: the last 7 days
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"GPU-hours from {default_since()[:10]}"), res.stdout


async def test_ledger_repairs_at_start_and_names_why_an_interval_ended(tmp_path):
    """An allocation without an open record (a database from before the ledger) gets one from its
    start; an open record of a workload that holds nothing is closed; a preempted workspace's
    interval ends 'preempted' with the workload's reason."""
    from gpupool.backends.local import LocalBackend
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.config import load
    from gpupool.hub_ext.store.ledger import TABLE, UsageRecord
    from gpupool.hub_ext.domain import lifecycle
    from gpupool.hub_ext.runtime.loop import SchedulerLoop

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    settings = load({"nodes": NODES, "queues": QUEUES, "db_url": url, "job_root": str(tmp_path / "jobs"),
                     "work_dir": str(tmp_path), "run_as_user": False})
    engine = D.make_engine(url)
    alloc = [{"pod": 0, "node": "box", "gpus": [0, 1], "fraction": 1.0}]
    with engine.begin() as conn:  # written without the ledger (an older version)
        conn.execute(D.Workload.__table__.insert(), [
            dict(type=D.WORKSPACE, user="alice", server="", name="a", queue="vision", kind="interactive", gpus=2.0,
                 gpu_memory=0, cpu=0, memory=0, priority=50, preemptible=True, checkpoint_on_signal=False,
                 parameters={}, status="running", reason="admitted", submitted_at=T0, started_at=T0 + 5,
                 allocation=alloc, preemptions=0, restarts=0, attempt=1)])
        conn.execute(TABLE.insert(), [dict(workload_id=99, workload="j-000099", type="job", user="bob", queue="nlp",
                                           queue_path="research/nlp", department="research", kind="train", node="box",
                                           gpu_indices=[3], gpu_model="A100", fraction=1.0, gpus=1.0, start=T0)])
    sessions = D.make_sessionmaker(engine)
    loop = SchedulerLoop(settings, sessions, LocalBackend())
    await loop.recover()
    with sessions() as s:
        opened = s.query(UsageRecord).filter_by(workload="w-000001").one()
        assert (opened.start, opened.end, opened.gpus, opened.gpu_indices) == (T0 + 5, None, 2.0, [0, 1])
        stale = s.query(UsageRecord).filter_by(workload="j-000099").one()
        assert stale.end is not None and stale.end_reason == "repaired"
        row = s.get(D.Workload, 1)
        row.stop_reason = "queue nlp reclaims its quota"
        lifecycle.workspace_released(row)
        s.commit()
    with sessions() as s:
        ended = s.query(UsageRecord).filter_by(workload="w-000001").one()
        assert ended.end_reason == "preempted" and "nlp reclaims its quota" in ended.end_detail
    await loop.backend.close()


@pytest.fixture(scope="module")
def nvml_hub(tmp_path_factory):
    """A real hub whose GPUs come from NVML: the pynvml stand-in (tests/support/nvml_standin.py) with two
    GPUs, read every 0.2 s."""
    import nvml_standin

    tmp = tmp_path_factory.mktemp("usage-nvml")
    gp = {"nodes": None, "nvml_module": "nvml_standin", "usage_sample_seconds": 0.2,
          "queues": [{"name": "vision", "deserved": {"gpu": 2}, "users": ["alice"]}]}
    carol_admin = ("for _r in c.JupyterHub.load_roles:\n"  # carol: a gpupool admin, not a JupyterHub admin
                   "    if _r['name'] == 'gpupool-admin':\n        _r['users'] = ['carol']\n")
    with nvml_standin.for_services(tmp / "nvml.json", [0.0, 0.0]) as readings, \
            Hub(tmp, gpupool=gp, users=["alice", "carol"], admins=["admin"], extra_config=carol_admin,
                managed=False) as hub:
        hub.readings = readings
        yield hub


def test_utilisation_is_sampled_and_weights_used_gpu_hours(nvml_hub):
    import nvml_standin

    hub = nvml_hub
    [node] = hub.api("GET", "nodes", hub.admin_token).json()["nodes"]
    assert node["gpu_model"] == "NVIDIA L4" and len(node["gpus"]) == 2
    r = hub.api("POST", "workspaces/alice", hub.service_token, json={"gpus": 1})
    assert r.status_code == 201, r.text
    ws = {}

    def running():
        nonlocal ws
        ws = hub.api("GET", "workspaces/alice", hub.service_token).json()
        return ws["status"] == "running"
    try:
        hub.wait_for(running, 20)
    except AssertionError:
        raise AssertionError(f"the workspace was not admitted: {ws}\n{hub.service_log()[-3000:]}") from None
    gpu = ws["allocation"][0]["gpus"][0]
    busy = [0.0, 0.0]
    busy[gpu] = 75.0
    nvml_standin.write(hub.readings, busy)
    alice = hub.token("alice")

    def live():
        gpus = hub.api("GET", "nodes", alice).json()["nodes"][0]["gpus"]
        return gpus[gpu]["utilization"] == 75.0 and gpus
    hub.wait_for(live, 10, message="GET nodes never showed the utilisation NVML reports")
    since = ws["started_at"]

    def used():
        doc = hub.api("GET", f"usage?since={since}&by=user", alice).json()
        row = doc["rows"][0] if doc["rows"] else {}
        return row.get("measured_gpu_hours", 0) * 3600 > 1.0 and row
    row = hub.wait_for(used, 20, message="no measured GPU-hours")
    # Prometheus: per-GPU utilisation, GPU-hours allocated and used by the queue holding it
    import re
    text = hub.api("GET", "metrics").text
    assert re.search(rf'gpupool_gpu_utilization{{gpu="{gpu}",node="[^"]+"}} 75.0', text), text
    values = {m[0]: float(m[1]) for m in re.findall(r'^(gpupool_gpu_hours_\w+_total){queue="vision"} (\S+)$', text, re.M)}
    assert values["gpupool_gpu_hours_allocated_total"] > 0 and values["gpupool_gpu_hours_used_total"] > 0, values
    # every reading during the allocation: 0 % until the test set 75 %, then 75 % (the report
    # rounds each figure to 6 decimals: allow for that rounding, 5e-7 per figure)
    assert 0 < row["used_gpu_hours"] <= 0.75 * row["measured_gpu_hours"] + 1e-6
    assert row["measured_gpu_hours"] <= row["allocated_gpu_hours"] + 1e-6
    # the history: this workspace's GPU only (75 % once set), and every GPU of the node
    openapi = hub.api("GET", "openapi.json").json()
    for answer in (hub.api("GET", f"usage?since={since}&by=user", alice),
                   hub.api("GET", f"usage/history?workload={ws['id']}", alice)):
        check_documented(openapi, answer)  # with real readings in them
    hist = hub.api("GET", f"usage/history?workload={ws['id']}", alice).json()["series"]
    assert [(h["gpu"]) for h in hist] == [gpu] and 75.0 in [p["utilization"] for p in hist[0]["points"]]
    both = hub.api("GET", f"usage/history?node={node['name']}&since={since}", alice).json()["series"]
    assert [h["gpu"] for h in both] == [0, 1] and all(p["utilization"] == 0.0 for p in both[1 - gpu]["points"])
    assert hub.api("GET", "usage/history?workload=j-999999", alice).status_code == 404
    assert hub.api("GET", "usage/history?gpu=first", alice).json()["field"] == "gpu"
    dashboard_with_readings(hub, ws["id"])
    hub.api("DELETE", "workspaces/alice", hub.service_token)
    import sqlite3
    db = sqlite3.connect(hub.settings["db_url"].removeprefix("sqlite:///"))
    samples = db.execute("SELECT gpu, utilization FROM gpu_samples WHERE resolution = 0 ORDER BY id").fetchall()
    db.close()
    assert {g for g, _ in samples} == {0, 1} and (gpu, 75.0) in samples and (1 - gpu, 0.0) in samples
    assert "Traceback" not in hub.service_log()


def dashboard_with_readings(hub, workspace: str) -> None:
    """The dashboard as carol (a gpupool admin through the gpupool-admin role, not a JupyterHub
    admin): everything, and a "used" line drawn from NVML readings."""
    import os

    from browser_harness import ARTIFACTS, CHROMIUM, chromium, open_dashboard

    if not os.path.exists(CHROMIUM):
        return  # the browser part is skipped without Chromium (test_dashboard says so)
    with chromium() as browser:
        page = open_dashboard(browser, hub, "carol")
        assert "carol (admin: everything)" in page.inner_text("header")
        assert workspace in page.inner_text("#running") and "alice" in page.inner_text("#usage-user")
        used = page.evaluate("() => Chart.getChart(document.getElementById('timeline-chart')).data.datasets[1].data")
        assert used[-1] is not None and used[-1] > 0, used[-3:]
        page.screenshot(path=str(ARTIFACTS / "dashboard-nvml.png"))
