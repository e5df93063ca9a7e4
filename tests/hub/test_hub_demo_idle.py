"""The demo's idle rules at work through the real hub: the demo's own gpupool settings (declared
GPUs with simulated readings, its pools and idle rules, with short times) suspend a workspace whose
server shows no activity, keep one that the hub sees active, and resume it; a running job's GPU reads
busy; the readings say they are simulated on ``GET nodes``, the dashboard (Chromium) and in the
suspension's reason."""
from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from hub_harness import Hub, hub_leak_check  # noqa: F401 (leak check fixture)

IDLE_AFTER = 3  # seconds without activity before the rule suspends a workspace (the demo's: 30 min)
ACTIVE_FOR = 2  # seconds a server's GPUs read busy after its last activity (the demo's: 10 min)


def demo_settings(tmp) -> dict:
    """The c.GPUPool settings `gpupool hub --demo` writes (declared GPUs), with short times."""
    from traitlets.config.loader import PyFileConfigLoader

    from gpupool.hub_ext import demo_config

    path = demo_config.write_demo(tmp / ".gpupool-demo", demo_config.DemoOptions(
        idle_after=f"{IDLE_AFTER}s", simulated_activity=ACTIVE_FOR))
    cfg = PyFileConfigLoader(path.name, path=str(path.parent)).load_config().GPUPool
    out = {k: cfg[k] for k in ("nodes", "queues", "pool_preference", "idle_rules", "simulated_gpu_readings",
                               "simulated_activity_seconds")}
    assert out["simulated_gpu_readings"] is True and out["idle_rules"]["*"]["interactive"] == {"after": "3s"}
    return {**out, "usage_sample_seconds": 0.2, "idle_window_seconds": 0.5, "workspace_reconcile_seconds": 0.5}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    from shared_hub import PASSWORD
    from spawner_harness import spawner_config as _extra

    tmp = tmp_path_factory.mktemp("demo-idle")
    with Hub(tmp, gpupool=demo_settings(tmp), users=["alice"], admins=["admin"],
             extra_config=_extra(tmp) + f"c.DummyAuthenticator.password = {PASSWORD!r}\n") as h:
        yield h


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def gpus_of(hub, node: str) -> tuple[str | None, list[dict]]:
    [n] = [n for n in hub.api("GET", "nodes", hub.admin_token).json()["nodes"] if n["name"] == node]
    return n["readings"], n["gpus"]


def test_the_demo_suspends_an_idle_workspace_keeps_an_active_one_and_resumes_it(hub):
    from spawner_harness import start_server as _start, user_server as _server, wait_server_ready as _wait_ready

    alice = hub.token("alice")
    readings, gpus = gpus_of(hub, "build-node")
    assert readings == "simulated" and [g["utilization"] for g in gpus] == [0.0] * 4  # nobody holds them

    # a running job's GPU reads busy
    job = hub.api("POST", "jobs", alice, json={"command": ["sleep", "30"], "gpus": 1, "queue": "vision"}).json()
    hub.wait_job(alice, job["id"], ["running"])
    [where] = hub.api("GET", f"jobs/{job['id']}", alice).json()["allocation"]
    hub.wait_for(lambda: gpus_of(hub, where["node"])[1][where["gpus"][0]]["utilization"] == 100.0, 10,
                 message="the running job's GPU does not read busy")
    hub.api("DELETE", f"jobs/{job['id']}", alice)

    # a workspace the hub sees active is kept: its server reports activity (as jupyterhub-singleuser does)
    _start(hub, "alice", {"gpus": 1, "queue": "vision"})
    _wait_ready(hub, "alice")
    ws = hub.api("GET", "workspaces/alice", alice).json()
    assert ws["status"] == "running" and ws["pools"][0] == "build"  # the demo's build environment first
    node, gpu = ws["allocation"][0]["node"], ws["allocation"][0]["gpus"][0]
    deadline = time.monotonic() + IDLE_AFTER + ACTIVE_FOR + 3
    while time.monotonic() < deadline:
        r = hub.hub_api("POST", "users/alice/activity", hub.admin_token,
                        json={"servers": {"": {"last_activity": now_iso()}}})
        assert r.status_code == 200, r.text
        time.sleep(0.5)
    assert hub.api("GET", "workspaces/alice", alice).json()["status"] == "running"
    assert hub.api("GET", "suspensions", alice).json() == {"suspensions": []}
    assert gpus_of(hub, node)[1][gpu]["utilization"] == 100.0

    # no more activity: after ACTIVE_FOR its GPU reads 0 %, after IDLE_AFTER more it is suspended
    sus = hub.wait_for(lambda: hub.api("GET", "suspensions", alice).json()["suspensions"], 30,
                       message="the idle workspace was not suspended")[0]
    assert sus["reason"].startswith("suspended: its GPU stayed idle (0 % simulated utilisation: no activity seen) "
                                    "for 3 s (the pool's rule for interactive workspaces)"), sus
    hub.wait_for(lambda: _server(hub, "alice") is None, 20, message="the suspended server kept running")
    assert gpus_of(hub, node)[1][gpu]["allocated"] == 0

    # the dashboard says the readings are simulated, next to the chart and the idle table (Chromium)
    from browser_harness import ARTIFACTS, chromium, open_dashboard

    with chromium() as browser:
        page = open_dashboard(browser, hub, "admin")
        assert page.inner_text(".gpupool-simulated >> nth=0").startswith("simulated GPU readings")
        assert "GPU readings are simulated" in page.inner_text("#idle")
        line = page.evaluate("() => Chart.getChart(document.getElementById('timeline-chart')).data.datasets")
        assert line[1]["label"].startswith("used (SIMULATED readings")
        page.screenshot(path=str(ARTIFACTS / "dashboard-simulated-readings.png"))

    # resumed with the same options, it runs again
    r = hub.api("POST", f"suspensions/{sus['id']}/resume", alice)
    assert r.status_code == 202, r.text
    _wait_ready(hub, "alice")
    ws2 = hub.api("GET", "workspaces/alice", alice).json()
    assert (ws2["status"], ws2["gpus"], ws2["queue"]) == ("running", 1, "vision") and ws2["id"] != ws["id"]
    assert "Traceback" not in hub.service_log()
