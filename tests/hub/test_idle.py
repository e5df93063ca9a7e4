"""Idle GPUs (hub_ext/runtime/idle.py, hub_ext/domain/idle_rules.py): rules per queue and class, a workspace suspended by the utilisation
a test sets through the pynvml stand-in, then resumed with the same options, on a real hub with
the GPU-aware spawner."""
from __future__ import annotations

import sqlite3
import time

import pytest

from api_fuzzing import check_documented
from hub_harness import Hub, hub_leak_check  # noqa: F401 (leak check fixture)

QUEUES = [{"name": "research", "deserved": {"gpu": 2}},
          {"name": "vision", "parent": "research", "deserved": {"gpu": 2}, "users": ["alice"]},
          {"name": "ops", "deserved": {"gpu": 0}}]


def load(rules):
    from gpupool.hub_ext.config import load as load_config

    return load_config({"nodes": [], "queues": QUEUES, "idle_rules": rules}, discover=False).idle_rules


def test_rules_are_inherited_and_a_child_may_only_tighten():
    from gpupool.hub_ext.config import GPUPoolConfigError

    rules = load({"*": {"interactive": {"after": "2h"}, "train": {"after": "1h"}},
                  "research": {"interactive": {"after": "90m"}},
                  "vision": {"train": {"after": 600, "action": "requeue"}}})
    assert rules[("ops", "interactive")].after == 7200 and rules[("ops", "interactive")].action == "suspend"
    assert rules[("vision", "interactive")].after == 5400  # from research
    assert rules[("vision", "interactive-preemptible")].after == 5400  # falls back to interactive
    assert (rules[("vision", "train")].after, rules[("vision", "train")].action) == (600, "requeue")
    assert (rules[("research", "train")].after, rules[("research", "train")].action) == (3600, "flag")
    assert ("vision", "inference") not in rules
    assert "queue vision's rule for train jobs" == rules[("vision", "train")].source
    for bad, words in (
            ({"*": {"interactive": {"after": "1h"}}, "vision": {"interactive": {"after": "2h"}}},
             "['vision']['interactive'].after: 7200 s is looser than the 3600 s of the pool's rule"),
            ({"research": {"train": {"after": 60, "action": "requeue"}}, "vision": {"train": {"after": 30}}},
             "['vision']['train'].action: 'flag' is weaker than 'requeue' of queue research's rule"),
            ({"*": {"interactive": {"after": 60, "action": "requeue"}}}, "must be one of suspend, flag"),
            ({"*": {"gpu-hog": {"after": 60}}}, "unknown class"),
            ({"*": {"train": {"after": "soon"}}}, "'soon' is not a duration"),
            ({"nowhere": {}}, "['nowhere']: unknown queue")):
        with pytest.raises(GPUPoolConfigError) as e:
            load(bad)
        assert words in str(e.value), (bad, str(e.value))
    from gpupool.hub_ext.config import load as load_config

    with pytest.raises(GPUPoolConfigError) as e:
        load_config({"nodes": [], "queues": QUEUES, "max_runtime": {"*": {"train": "1h"}, "vision": {"train": "2h"}}},
                    discover=False)
    assert "max_runtime['vision']['train']: 7200 s is looser than the 3600 s of the pool's maximum run time" in str(e.value)


def resume_from_home_page(hub, user: str, reason: str) -> None:
    """Log in as ``user`` in headless Chromium, check the home page's notice, click Resume."""
    from browser_harness import ARTIFACTS, chromium, login

    with chromium() as browser:
        page = login(browser, hub, user)
        page.goto(hub.hub_url + "hub/home")
        notice = page.locator(".gpupool-suspended")
        notice.wait_for(timeout=10_000)
        text = notice.inner_text()
        assert "Your server was suspended at" in text and reason in text, text
        page.screenshot(path=str(ARTIFACTS / "idle-suspended-home.png"))
        page.click(".gpupool-resume")
        page.wait_for_url("**/user/" + user + "/**", timeout=60_000)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    import nvml_standin
    from spawner_harness import spawner_config

    tmp = tmp_path_factory.mktemp("idle")
    gp = {"nodes": None, "nvml_module": "nvml_standin", "usage_sample_seconds": 0.2, "idle_window_seconds": 0.5,
          "queues": QUEUES, "idle_rules": {"*": {"interactive": {"after": 3}}}}
    with nvml_standin.for_services(tmp / "nvml.json", [50.0, 50.0]) as readings, \
            Hub(tmp, gpupool=gp, users=["alice"], admins=["admin"], extra_config=spawner_config(tmp), managed=False) as h:
        h.readings = readings
        yield h


def test_idle_workspace_is_suspended_and_resumed_with_the_same_options(hub):
    import nvml_standin
    from spawner_harness import start_server, user_server, wait_server_ready

    alice = hub.token("alice")
    start_server(hub, "alice", {"gpus": 1, "queue": "vision"})
    wait_server_ready(hub, "alice")
    ws = hub.api("GET", "workspaces/alice", alice).json()
    assert ws["status"] == "running" and ws["gpus"] == 1
    time.sleep(4)  # longer than the rule, but the GPU is busy (50 %): nothing happens
    assert hub.api("GET", "workspaces/alice", alice).json()["status"] == "running"
    assert hub.api("GET", "suspensions", alice).json() == {"suspensions": []}

    nvml_standin.write(hub.readings, [0.0, 0.0], used=0)  # nobody touches the GPUs any more (nor holds memory)
    sus = hub.wait_for(lambda: hub.api("GET", "suspensions", alice).json()["suspensions"], 20,
                       message="the idle workspace was not suspended")[0]
    assert sus["user"] == "alice" and sus["options"] == {"gpus": 1.0, "queue": "vision", "preemptible": False}
    assert sus["reason"].startswith("suspended: its GPU stayed idle (0 % utilisation) for 3 s (the pool's rule for "
                                    "interactive workspaces)"), sus
    # its GPU is back at once, and the spawner stops the server (its files stay)
    gpus = hub.api("GET", "nodes", hub.admin_token).json()["nodes"][0]["gpus"]
    assert all(g["allocated"] == 0 for g in gpus), gpus
    hub.wait_for(lambda: user_server(hub, "alice") is None, 20, message="the suspended server kept running")
    db = sqlite3.connect(hub.settings["db_url"].removeprefix("sqlite:///"))
    [(reason, end)] = db.execute("SELECT end_reason, \"end\" FROM usage WHERE workload = ?", (ws["id"],)).fetchall()
    db.close()
    assert reason == "suspended" and end is not None
    metrics = hub.api("GET", "metrics").text
    assert 'gpupool_idle_actions_total{action="suspended",queue="vision"} 1.0' in metrics

    # the hub's home page says why, and resumes it with the same options in one click (Chromium)
    nvml_standin.write(hub.readings, [50.0, 50.0])
    resume_from_home_page(hub, "alice", sus["reason"])
    wait_server_ready(hub, "alice")
    ws2 = hub.api("GET", "workspaces/alice", alice).json()
    assert (ws2["status"], ws2["gpus"], ws2["queue"], ws2["preemptible"]) == ("running", 1, "vision", False)
    assert ws2["id"] != ws["id"]
    done = hub.api("GET", "suspensions?all=1", alice).json()["suspensions"]
    assert done[0]["resumed_at"] and done[0]["resumed_by"] == "alice"
    again = hub.api("POST", f"suspensions/{sus['id']}/resume", alice)
    assert again.status_code == 409 and "already resumed" in again.json()["message"]

    # idle again: suspended again, and this time resumed through the API (an admin for alice)
    nvml_standin.write(hub.readings, [0.0, 0.0])
    sus2 = hub.wait_for(lambda: hub.api("GET", "suspensions", alice).json()["suspensions"], 20)[0]
    hub.wait_for(lambda: user_server(hub, "alice") is None, 20, message="the suspended server kept running")
    nvml_standin.write(hub.readings, [50.0, 50.0])
    r = hub.api("POST", f"suspensions/{sus2['id']}/resume", hub.token("admin"))
    assert r.status_code == 202, r.text
    wait_server_ready(hub, "alice")
    ws3 = hub.api("GET", "workspaces/alice", alice).json()
    assert (ws3["status"], ws3["gpus"], ws3["queue"]) == ("running", 1, "vision")
    listed = hub.api("GET", "suspensions?all=1", alice)
    assert listed.json()["suspensions"][1]["resumed_by"] == "admin"
    unknown = hub.api("POST", "suspensions/999/resume", alice)
    assert unknown.status_code == 404
    # the answers with real suspensions in them are the ones the OpenAPI document describes
    doc = hub.api("GET", "openapi.json").json()
    for resp in (listed, again, r, unknown):
        check_documented(doc, resp)
    assert "Traceback" not in hub.service_log()


async def test_maximum_run_time_warns_then_requeues_a_job_and_suspends_a_workspace(tmp_path, monkeypatch):
    """In-process with an injected clock: the real loop, idle checker and local backend."""
    from gpupool import checkpoint
    from gpupool.backends.local import LocalBackend
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.config import load as load_config
    from gpupool.hub_ext.runtime.idle import IdleChecker
    from gpupool.hub_ext.store import Suspension
    from gpupool.hub_ext.store.ledger import UsageRecord
    from gpupool.hub_ext.runtime.loop import SchedulerLoop

    t0 = 1_800_000_000.0
    now = [t0]
    settings = load_config({"nodes": [{"name": "box", "gpus": 2}], "queues": QUEUES,
                            "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}", "job_root": str(tmp_path / "jobs"),
                            "work_dir": str(tmp_path), "run_as_user": False,
                            "max_runtime": {"*": {"train": "1h", "interactive": "2h"}, "vision": {"train": "30m"}}},
                           discover=False)
    sessions = D.make_sessionmaker(D.make_engine(settings.pool.db_url))
    loop = SchedulerLoop(settings, sessions, LocalBackend())
    common = dict(user="alice", queue="vision", gpus=1.0, submitted_at=t0, started_at=t0, parameters={},
                  status="running", preemptible=False, attempt=1, reason="running on box")
    with sessions() as s:
        s.add(D.Workload(type=D.WORKSPACE, kind="interactive", server="",
                         allocation=[{"pod": 0, "node": "box", "gpus": [0], "fraction": 1.0}], **common))
        s.add(D.Workload(type=D.JOB, kind="train", handle={"pid": 0, "run_id": "none"},
                         allocation=[{"pod": 0, "node": "box", "gpus": [1], "fraction": 1.0}], **common))
        s.commit()
    from gpupool.hub_ext.runtime.metrics import Metrics
    metrics = Metrics()
    checker = IdleChecker(loop, sessions, {}, 30, clock=lambda: now[0], limits=settings.max_runtime, warning=600,
                          metrics=metrics)

    def rows():
        with sessions() as s:
            return s.get(D.Workload, 1), s.get(D.Workload, 2)

    now[0] = t0 + 1000
    assert await checker.tick() == []
    assert rows()[1].reason == "running on box"
    now[0] = t0 + 1300  # 10 minutes before the job's 30 minutes
    await checker.tick()
    ws, job = rows()
    assert job.reason.endswith("; warning: reaches its maximum run time of 30 min at 2027-01-15 08:30 UTC "
                               "(queue vision's maximum run time for train jobs); it will then be asked to "
                               "checkpoint and requeued"), job.reason
    assert ws.reason == "running on box"
    monkeypatch.setenv("GPUPOOL_STOP_FILE", str(tmp_path / "jobs" / "j-000002" / "control" / "stop"))
    assert checkpoint.warning().startswith("reaches its maximum run time of 30 min") and not checkpoint.should_stop()

    now[0] = t0 + 1800
    assert await checker.tick() == ["j-000002"]
    job = rows()[1]
    assert job.status == "preempting" and job.reason.startswith(
        "requeued: it ran for its maximum run time of 30 min (queue vision's maximum run time for train jobs)")
    assert checkpoint.should_stop() and "maximum run time" in checkpoint.stop_reason()
    assert metrics.registry.get_sample_value("gpupool_evictions_total", {"cause": "max-runtime"}) == 1

    now[0] = t0 + 6700
    await checker.tick()
    assert "reaches its maximum run time of 2 h" in rows()[0].reason and "it will then be suspended" in rows()[0].reason
    now[0] = t0 + 7200
    assert await checker.tick() == ["w-000001"]
    ws = rows()[0]
    assert ws.status == "cancelled" and ws.allocation is None and ws.reason.startswith(
        "suspended: it ran for its maximum run time of 2 h (the pool's maximum run time for interactive workspaces)")
    with sessions() as s:
        assert s.query(Suspension).one().options == {"gpus": 1.0, "queue": "vision", "preemptible": False}
        assert s.query(UsageRecord).filter_by(workload="w-000001").one().end_reason == "suspended"
    await loop.backend.close()


async def test_idle_job_is_flagged_and_counted_while_its_gpu_reads_zero(tmp_path):
    """Idle means every 30 s window of the rule's time had readings, all 0 %; one busy reading ends it."""
    from gpupool.backends.local import LocalBackend
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.config import load as load_config
    from gpupool.hub_ext.runtime.idle import IdleChecker
    from gpupool.hub_ext.runtime.loop import SchedulerLoop
    from gpupool.hub_ext.runtime.metrics import Metrics
    from gpupool.hub_ext.runtime.sampling import Sampler

    t0 = 1_800_000_000.0
    now = [t0]
    settings = load_config({"nodes": [{"name": "box", "gpus": 2}], "queues": QUEUES,
                            "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}", "job_root": str(tmp_path / "jobs"),
                            "work_dir": str(tmp_path), "run_as_user": False,
                            "idle_rules": {"vision": {"train": {"after": 90}}}}, discover=False)
    sessions = D.make_sessionmaker(D.make_engine(settings.pool.db_url))
    loop = SchedulerLoop(settings, sessions, LocalBackend())
    with sessions() as s:
        s.add(D.Workload(type=D.JOB, kind="train", user="bob", queue="vision", gpus=1.0, submitted_at=t0,
                         started_at=t0, parameters={}, status="running", attempt=1, reason="running on box GPU 1",
                         handle={"pid": 0}, allocation=[{"pod": 0, "node": "box", "gpus": [1], "fraction": 1.0}]))
        s.commit()
    util = {1: 0.0}
    sampler = Sampler(sessions, lambda: {"box": {1: {"utilization": util[1], "memory_used": 0}}}, 10, 86400, 300,
                      86400, clock=lambda: now[0])
    metrics = Metrics()
    checker = IdleChecker(loop, sessions, settings.idle_rules, 30, metrics=metrics, clock=lambda: now[0])

    def advance(seconds):
        for _ in range(int(seconds // 10)):
            now[0] += 10
            sampler.sample()

    def reason():
        with sessions() as s:
            return s.get(D.Workload, 1).reason

    advance(60)
    await checker.tick()  # held 60 s of the 90: not yet
    assert reason() == "running on box GPU 1"
    advance(40)
    assert await checker.tick() == []  # flagged, not stopped
    assert reason() == ("running on box GPU 1; idle: its GPU stayed idle (0 % utilisation) for 1 min 30 s "
                        "(queue vision's rule for train jobs)"), reason()
    assert "j-000001" in checker.idle
    assert metrics.registry.get_sample_value("gpupool_idle_gpus", {"queue": "vision"}) == 1.0
    assert metrics.registry.get_sample_value("gpupool_idle_actions_total", {"queue": "vision", "action": "flagged"}) == 1
    util[1] = 3.0  # a kernel touches the GPU: active again
    advance(10)
    await checker.tick()
    assert checker.idle == {} and metrics.registry.get_sample_value("gpupool_idle_gpus", {"queue": "vision"}) == 0.0
    await loop.backend.close()
