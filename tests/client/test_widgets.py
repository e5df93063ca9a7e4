"""Widgets: rendering is a pure function of the service's data; views refresh live and stop cleanly."""
from __future__ import annotations

import re
import threading
import time

import markupsafe
import pytest

from gpupool.widgets import render

QUEUES = [
    {"name": "vision", "parent": None, "deserved": {"gpu": 2}, "limit": {"gpu": 4}, "over_quota_weight": 1,
     "priority": 0, "fair_share": {"gpu": 2.5}, "allocated": {"gpu": 3}, "running": 2, "pending": 1,
     "users": ["alice"], "groups": [], "may_submit": True},
    {"name": "nlp", "parent": None, "deserved": {"gpu": 2}, "limit": None, "fair_share": {"gpu": 1.5},
     "allocated": {"gpu": 0.5}, "running": 1, "pending": 0, "users": ["bob"], "may_submit": False},
]
NODES = [{"name": "box", "gpu_model": "A100", "gpu_memory": 24 * 2**30, "schedulable": True, "gpus": [
    {"index": 0, "uuid": "GPU-0", "allocated": 0.75, "utilization": 37.0, "memory_used": 2**30,
     "memory_total": 24 * 2**30, "allocations": [
         {"workload": "j-000001", "kind": "train", "user": "alice", "fraction": 0.5},
         {"workload": "j-000002", "kind": "hpo-trial", "user": "bob", "fraction": 0.25}]},
    {"index": 1, "uuid": "GPU-1", "allocated": 0, "utilization": None, "memory_used": None,
     "memory_total": None, "allocations": []}]}]
JOBS = [{"id": "j-000001", "name": "train", "user": "alice", "queue": "vision", "status": "running",
         "reason": "running on box GPU 0 (0.5)", "gpus": 0.5},
        {"id": "j-000003", "name": "train", "user": "alice", "queue": "vision", "status": "queued",
         "reason": "queued in vision: position 1, waiting for 1 GPU", "gpus": 1}]


def _width(html: str, cls: str, attr: str, key: str) -> float:
    m = re.search(rf'class="{cls}"[^>]*{attr}="{re.escape(key)}"[^>]*width:([0-9.]+)%', html)
    assert m, (cls, key)
    return float(m.group(1))


def test_queue_rows_and_bars_are_a_function_of_the_data():
    rows = {r["name"]: r for r in render.queue_rows(QUEUES, JOBS, "alice")}
    assert rows["vision"]["allocated"] == 3 and rows["vision"]["deserved"] == 2 and rows["vision"]["fair_share"] == 2.5
    assert (rows["vision"]["my_running"], rows["vision"]["my_queued"]) == (1, 1)
    assert (rows["nlp"]["my_running"], rows["nlp"]["my_queued"]) == (0, 0)
    html = render.queues_html(QUEUES, JOBS, "alice")
    # scale = the largest number drawn (the vision limit, 4 GPUs): allocated 3 -> 75 %, deserved 2 -> 50 %
    assert 'data-queue="vision"' in html and "75.0%" in html
    assert re.search(r'gpupool-bar-deserved" data-value="2".*?left:50.0%', html)
    assert re.search(r'gpupool-bar-fairshare" data-value="2.5".*?left:62.5%', html)
    assert "1 pending" in html and 'data-own="vision"' in html and "you: 1 running, 1 queued" in html
    assert 'data-own="nlp"' not in html
    assert render.queues_html(QUEUES, JOBS, "alice") == html  # pure


def test_the_share_without_past_usage_is_shown_only_when_given():
    """Fairness over time: beside the fair share (and per pool), the share without past usage;
    nothing of it when the service gives none (``fair_share_plain`` null)."""
    assert "without past usage" not in render.queues_html(QUEUES)
    moved = [dict(QUEUES[0], usage=0.41, over_quota_weight=2, fair_share={"gpu": 3}, fair_share_plain={"gpu": 5},
                  pools={"h100": {"allocated": {"gpu": 1}, "deserved": {"gpu": 1}, "fair_share": {"gpu": 1.5},
                                  "fair_share_plain": {"gpu": 2.5}, "usage": 0.2},
                         "a100": {"allocated": {"gpu": 2}, "deserved": {"gpu": 1}, "fair_share": {"gpu": 1.5},
                                  "fair_share_plain": None, "usage": 0.6}})]
    (row,) = render.queue_rows(moved)
    assert row["fair_share_plain"] == 5.0 and [p["fair_share_plain"] for p in row["pools"]] == [2.5, None]
    html = render.queues_html(moved)
    text = re.sub(r"<[^>]+>", "", html)
    assert "fair share 3.00 (5.00 without past usage) · limit 4 · weight 2, past usage 41%" in text
    assert 'data-plain="5.000"' in html
    assert "h100: 1 / 1, share 1.50 (2.50 without past usage), usage 20%" in text
    assert "a100: 2 / 1, share 1.50, usage 60%" in text


def test_gpu_bars_show_fractions_by_user_and_live_readings():
    html = render.gpus_html(NODES, user="alice")
    assert _width(html, "gpupool-alloc", "data-workload", "j-000001") == 50.0
    assert _width(html, "gpupool-alloc", "data-workload", "j-000002") == 25.0
    assert re.search(r'data-workload="j-000001" data-user="alice" data-fraction="0.5" data-own="true"', html)
    assert re.search(r'data-workload="j-000002" data-user="bob" data-fraction="0.25" data-own="false"', html)
    assert 'class="gpupool-free" data-fraction="0.25"' in html and 'data-fraction="1"' in html  # GPU 1 idle
    assert "37%" in html and "1Gi/24Gi" in html and "A100" in html


def test_job_and_sweep_rendering():
    job = {**JOBS[1], "metrics": {"val_acc": [{"step": 1, "value": 0.5}, {"step": 2, "value": 0.7}]}}
    html = render.job_html(job, log_tail="Executing cell 1")
    assert 'data-status="queued"' in html and "position 1, waiting for 1 GPU" in html
    assert 'data-metric="val_acc"' in html and "<polyline" in html and "Executing cell 1" in html
    # the request in the client's words: a memory slice is 8Gi, not a count of bytes
    sliced = {**JOBS[1], "gpus": 0, "gpu_memory": 8 * 2**30}
    assert "8Gi of one GPU" in render.job_html(sliced) and "8Gi of one GPU" in render.jobs_html([sliced])
    assert "8589934592" not in render.job_html(sliced) + render.jobs_html([sliced])
    summary = {"name": "lr", "status": "running", "objective": "val_acc", "direction": "maximize", "total": 4,
               "done": 2, "counts": {"complete": 1, "pruned": 1, "failed": 0, "running": 1},
               "best": {"number": 0, "value": 0.9, "params": {"lr": 0.01}, "job_id": "j-000010"},
               "trials": [{"number": 0, "state": "complete", "value": 0.9, "params": {"lr": 0.01}, "job_id": "j-000010",
                           "status": "succeeded", "reason": "", "curve": [(0, 0.5), (1, 0.9)]},
                          {"number": 1, "state": "pruned", "value": 0.1, "params": {"lr": 0.1}, "job_id": "j-000011",
                           "status": "cancelled", "reason": "pruned at step 0", "curve": [(0, 0.1)]},
                          {"number": 2, "state": "running", "value": None, "params": {"lr": 0.001},
                           "job_id": "j-000012", "status": "queued", "reason": "queued in vision: position 1",
                           "curve": []}],
               "error": None, "problem": None}
    html = render.sweep_html(summary)
    assert 'data-done="2" data-total="4"' in html and "val_acc = 0.9" in html
    assert 'data-trial="2" data-state="queued"' in html and "queued in vision: position 1" in html
    assert html.count("<polyline") == 2 and 'data-series="0"' in html


def test_every_value_is_escaped_once():
    evil = '<img src=x onerror="alert(1)">&'
    job = {**JOBS[1], "name": evil, "reason": evil, "metrics": {evil: [{"step": 0, "value": 1.0}]}}
    node = {**NODES[0], "name": evil, "gpu_model": evil}
    queue = {**QUEUES[0], "name": evil, "parent": evil}
    for html in (render.job_html(job, log_tail=evil), render.jobs_html([job]), render.gpus_html([node]),
                 render.queues_html([queue], [job], "alice"), render.status_line(evil)):
        assert "<img" not in html and "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;&amp;" in html, html
        assert "&amp;lt;" not in html and "&amp;amp;" not in html


def test_refresher_thread_stops_on_close():
    from gpupool.widgets import Refresher
    calls = []
    r = Refresher(lambda: calls.append(1), interval=0.05).start()
    time.sleep(0.3)
    assert r.running and len(calls) >= 2
    r.stop()
    assert not r.running and r.name not in {t.name for t in threading.enumerate()}


def test_refresher_survives_errors_and_reports_them():
    from gpupool.widgets import Refresher
    errors = []

    def boom():
        raise RuntimeError("hub down")
    r = Refresher(boom, interval=0.02, on_error=errors.append).start()
    deadline = time.time() + 5
    while not errors and time.time() < deadline:
        time.sleep(0.02)
    r.stop()
    assert errors and "hub down" in str(errors[0]) and not r.running


# -- views built from the real service -----------------------------------------------------------

import gpupool  # noqa: E402
from gpupool.client import api  # noqa: E402


@pytest.fixture(scope="module")
def alice(hub):
    return api.Client(hub.hub_url, hub.token("alice"))


@pytest.fixture(scope="module")
def running_job(hub, alice):
    job = gpupool.submit("sleepy.ipynb", gpus=0.5, queue="vision", client=alice)
    hub.wait_job(alice.token, job.id, {"running"}, timeout=60)
    yield job.refresh()
    job.cancel()


def _threads():
    return {t.name for t in threading.enumerate() if t.name.startswith("gpupool-")}


@pytest.mark.hub
def test_views_show_the_services_data_and_stop_on_close(alice, running_job):
    before = _threads()
    q = gpupool.QueueView(client=alice, user="alice", interval=0.2)
    g = gpupool.GPUView(client=alice, user="alice", interval=0.2)
    j = gpupool.JobView(running_job, interval=0.2)
    try:
        # drawn at once, from the service's data
        assert 'data-queue="vision"' in q.html.value and 'data-queue="nlp"' in q.html.value
        assert 'data-own="vision"' in q.html.value and "you: 1 running" in q.html.value
        node, gpu = running_job.allocation[0]["node"], running_job.allocation[0]["gpus"][0]
        row = re.search(rf'<tr class="gpupool-gpu" data-node="{node}" data-gpu="{gpu}">.*?</tr>', g.html.value).group(0)
        assert (f'data-workload="{running_job.id}" data-user="alice" data-fraction="0.5" data-own="true"' in row
                and "width:50.0%" in row)
        assert g.html.value.count('class="gpupool-gpu-bar"') == 3
        assert f'data-job="{running_job.id}"' in j.html.value and 'data-status="running"' in j.html.value
        state = q.html.get_state()  # what the front end receives
        assert "vision" in state["value"]
        # live: each refresher keeps polling in its own thread
        assert {q.refresher.name, g.refresher.name, j.refresher.name} <= _threads()
        stamp = q.status_line.value
        deadline = time.time() + 10
        while q.status_line.value == stamp and time.time() < deadline:
            time.sleep(0.1)
        assert q.status_line.value != stamp or "updated" in q.status_line.value
    finally:
        for v in (q, g, j):
            v.close()
    assert not (q.refresher.running or g.refresher.running or j.refresher.running)
    assert _threads() <= before


@pytest.mark.hub
def test_job_view_stops_refreshing_when_the_job_ends_and_dashboard_closes(alice, hub):
    job = gpupool.submit("sleepy.ipynb", gpus=0.25, parameters={"seconds": 300}, client=alice)
    view = gpupool.JobView(job, interval=0.2)
    try:
        view._cancel()  # the Cancel button's action
        hub.wait_for(lambda: not view.refresher.running, 60, message="JobView kept refreshing a finished job")
        assert 'data-status="cancelled"' in view.html.value and view.cancel_button.disabled
    finally:
        view.close()
    # alice's own server, as the spawner asked for it: the dashboard shows it with its reason (where a
    # warning of its maximum run time or idle GPUs appears, docs/admin.md)
    r = hub.api("POST", "workspaces/alice", hub.service_token, json={"gpus": 0.25, "queue": "vision"})
    assert r.status_code in (200, 201), r.text
    hub.wait_for(lambda: hub.api("GET", "workspaces/alice", hub.service_token).json()["status"] == "running", 20)
    d = gpupool.dashboard(client=alice, user="alice", interval=0.2)
    d2 = None
    try:
        assert "vision" in d.queues.html.value and "box2" in d.gpus.html.value and job.id in d.jobs.html.value
        reason = hub.api("GET", "workspaces/alice", hub.service_token).json()["reason"]
        assert 'class="gpupool-workspace" data-status="running"' in d.server.value and "0.25 GPU in vision" in d.server.value
        assert str(markupsafe.escape(reason)) in d.server.value  # escaped once, as the template does
        assert d.refresher.running
        d2 = gpupool.dashboard(client=alice, interval=0.2)  # re-running the cell freezes the older one
        hub.wait_for(lambda: not d.refresher.running, 10)
        assert "replaced" in d.status_line.value and d2.refresher.running
    finally:
        d.close()
        if d2 is not None:
            d2.close()
        hub.api("DELETE", "workspaces/alice", hub.service_token)
    assert not d2.refresher.running and d2.refresher.name not in _threads()


@pytest.mark.hub
@pytest.mark.slow
def test_sweep_view(alice, tmp_path):
    s = gpupool.sweep("quad.ipynb", space={"x": [2.0, 3.0]}, objective="score", trials=2, parallel=2, gpus=0.25,
                      sampler="grid", parameters={"steps": 2}, name="view-me", storage=tmp_path / "s.db", poll=0.3,
                      client=alice)
    v = gpupool.SweepView(s, interval=0.3)
    try:
        assert 'data-sweep="view-me"' in v.html.value and 'data-total="2"' in v.html.value
        s.wait(timeout=180, progress=False)
        deadline = time.time() + 20
        while v.refresher.running and time.time() < deadline:
            time.sleep(0.1)
        assert not v.refresher.running  # stops by itself once the sweep is done
        assert 'data-done="2" data-total="2"' in v.html.value and "score = 10" in v.html.value
        assert v.html.value.count("<polyline") == 2 and v.stop_button.disabled
    finally:
        v.close()
