"""The dashboard page (/services/gpupool/, hub_ext/web/dashboard.py) in headless Chromium on the shared
client hub: JupyterHub OAuth, admins see everything, users their own work and the queues; charts
drawn by the vendored Chart.js; CSV download. Screenshots: test-artifacts/dashboard-*.png."""
from __future__ import annotations

import os

import pytest

from browser_harness import ARTIFACTS, CHROMIUM, chromium, open_dashboard

pytestmark = [pytest.mark.browser, pytest.mark.hub, pytest.mark.slow]


@pytest.fixture(scope="module")
def workloads(hub):
    """alice holds both GPUs of box with one job and waits with a second one."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (run `make browser-deps` or apt-get install chromium)")
    tok = hub.token("alice")
    ids = []
    for name in ("dash-running", "dash-waiting"):
        r = hub.api("POST", "jobs", tok, json={"notebook": "sleepy.ipynb", "gpus": 2, "queue": "vision", "name": name,
                                               "parameters": {"seconds": 120}})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    hub.wait_job(tok, ids[0], {"running"})
    hub.wait_for(lambda: hub.api("GET", f"jobs/{ids[1]}", tok).json()["position"] == 1, 20)
    yield ids
    for j in ids:
        hub.api("DELETE", f"jobs/{j}", tok)
    for j in ids:
        hub.wait_job(tok, j, {"cancelled"}, 60)
    hub.wait_for(lambda: not hub.api("GET", f"jobs/{ids[0]}", tok).json()["allocation"], 30)


def test_dashboard_admin_sees_everything_users_their_own(hub, workloads):
    running, waiting = workloads
    with chromium() as browser:
        page = open_dashboard(browser, hub, "admin")
        assert "admin (admin: everything)" in page.inner_text("header")
        bars = page.evaluate("() => Chart.getChart(document.getElementById('queues-chart')).data")
        assert bars["labels"] == ["vision", "nlp"]
        assert [d["label"] for d in bars["datasets"]] == ["deserved", "fair share", "allocated"]
        assert bars["datasets"][0]["data"] == [2, 1] and bars["datasets"][2]["data"][0] >= 2
        line = page.evaluate("() => Chart.getChart(document.getElementById('timeline-chart')).data.datasets")
        assert 0 < line[0]["data"][-1] <= 2.0001  # alice's two GPUs in the current half hour
        assert all(v is None for v in line[1]["data"])  # declared GPUs: no NVML readings, nothing invented
        pending = page.inner_text("#pending")
        assert waiting in pending and "alice" in pending and "waiting" in pending
        assert running in page.inner_text("#running")
        assert "alice" in page.inner_text("#usage-user")
        page.screenshot(path=str(ARTIFACTS / "dashboard-admin.png"))
        csv = page.request.get(hub.hub_url + "services/gpupool/usage.csv?by=queue")
        assert csv.status == 200 and csv.headers["content-type"].startswith("text/csv")
        assert csv.text().startswith("queue,allocated_gpu_hours,used_gpu_hours") and "\nvision," in csv.text()

        bob = open_dashboard(browser, hub, "bob")
        assert "bob (your work and the queues)" in bob.inner_text("header")
        assert running not in bob.inner_text("#running") and waiting not in bob.inner_text("#pending")
        assert "alice" not in bob.inner_text("#usage-user")
        labels = bob.evaluate("() => Chart.getChart(document.getElementById('queues-chart')).data.labels")
        assert labels == ["vision", "nlp"]  # the queues are everyone's
        bob.screenshot(path=str(ARTIFACTS / "dashboard-user.png"))
        csv = bob.request.get(hub.hub_url + "services/gpupool/usage.csv?by=user")
        assert "alice" not in csv.text()
    # API clients asking the service's root still get JSON
    r = hub.session.get(hub.service_url, headers={"Authorization": f"token {hub.token('alice')}"})
    assert r.json()["api"] == "api/v1/"
