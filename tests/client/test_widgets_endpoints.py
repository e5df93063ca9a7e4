"""Model endpoints in the widgets (docs/widgets.md, docs/endpoints.md): ``EndpointsView``, the
dashboard's "Your endpoints", and a job view of an endpoint show its state, replicas and URL.
Rendering from plain dicts, then the views against the shared client hub with a real endpoint."""
from __future__ import annotations

import threading

import pytest
import requests

from gpupool.widgets import render
from endpoint_server import SERVER  # a tiny HTTP server that answers who called it

ENDPOINT = {"id": "j-000042", "name": "serve", "user": "alice", "kind": "inference", "status": "running",
            "endpoint_state": "ready", "ready_replicas": 1, "pods": 2, "gpus": 0.5, "endpoint_restarts": 1,
            "endpoint": "/services/gpupool/endpoints/j-000042/", "reason": "running on box GPU 0 (0.5)",
            "url": "https://hub.example.org/services/gpupool/endpoints/j-000042/"}


def test_the_endpoints_table_says_state_replicas_gpus_and_links_the_url():
    starting = {**ENDPOINT, "id": "j-000043", "endpoint_state": "starting", "ready_replicas": 0, "pods": 1,
                "url": None, "endpoint": "/services/gpupool/endpoints/j-000043/"}
    queued = {**ENDPOINT, "id": "j-000044", "status": "queued", "endpoint_state": "starting", "ready_replicas": 3}
    html = render.endpoints_html([ENDPOINT, starting, queued])
    assert 'data-job="j-000042" data-state="ready"' in html and ">1/2<" in html and ">0.5 GPU<" in html
    assert ('<a class="gpupool-endpoint-url" href="https://hub.example.org/services/gpupool/endpoints/j-000042/"'
            in html)
    # without the client's hub, the path through it (still a working link in the notebook's own hub)
    assert 'href="/services/gpupool/endpoints/j-000043/"' in html and 'data-state="starting"' in html
    # a job not running says its status, and no replica of it answers
    assert 'data-job="j-000044" data-state="queued"' in html and ">0/2<" in html
    assert "no endpoints" in render.endpoints_html([]).lower()


def test_a_job_view_of_an_endpoint_shows_its_url_and_replicas_not_workers():
    html = render.job_html(ENDPOINT)
    assert 'class="gpupool-endpoint" data-state="ready"' in html and "1/2 replicas ready" in html
    assert 'href="https://hub.example.org/services/gpupool/endpoints/j-000042/"' in html
    assert "0.5 GPU per replica, 2 replicas" in html and "workers" not in html
    assert "gpupool-endpoint" not in render.job_html({**ENDPOINT, "kind": "train", "endpoint": None})


def test_endpoint_names_and_urls_are_escaped_once():
    evil = '<img src=x onerror="alert(1)">&'
    html = render.endpoints_html([{**ENDPOINT, "name": evil, "url": evil}]) + render.job_html({**ENDPOINT, "url": evil})
    assert "<img" not in html and "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;&amp;" in html
    assert "&amp;lt;" not in html


# -- against the shared client hub ---------------------------------------------------------------
@pytest.fixture(scope="module")
def endpoint(hub):
    """alice's endpoint (no GPU, so it takes nothing from the other tests on this hub), ready."""
    import gpupool

    (hub.home("alice") / "hello_server.py").write_text(SERVER)
    client = gpupool.Client(hub.hub_url, hub.token("alice"))
    job = gpupool.serve("hello_server.py", name="widget-endpoint", wait=True, timeout=120, client=client)
    yield job
    job.cancel()
    hub.wait_job(client.token, job.id, {"cancelled"})


def _threads():
    return {t.name for t in threading.enumerate() if t.name.startswith("gpupool-")}


@pytest.mark.hub
def test_endpoints_view_and_dashboard_show_the_users_endpoint_ready_with_its_url(hub, endpoint):
    import gpupool

    alice = endpoint.client
    url = hub.hub_url + f"services/gpupool/endpoints/{endpoint.id}/"
    before = _threads()
    view = gpupool.EndpointsView(client=alice, user="alice", interval=0.2)
    try:
        html = view.html.value
        assert f'data-job="{endpoint.id}" data-state="ready"' in html and ">widget-endpoint<" in html
        assert f'href="{url}"' in html and ">1/1<" in html and ">0 GPUs (CPU only)<" in html
        assert view.refresher.running
    finally:
        view.close()
    assert not view.refresher.running and _threads() <= before
    # the link works: alice's token reaches her server through the hub
    r = requests.get(url, headers={"Authorization": f"token {alice.token}"}, timeout=30)
    assert r.status_code == 200 and r.json()["user"] == "alice"
    # the dashboard widget lists it under "Your endpoints"; bob, who has none, sees no such part
    d = gpupool.dashboard(client=alice, user="alice", interval=0.2)
    try:
        assert "Your endpoints" in d.endpoints.value and f'href="{url}"' in d.endpoints.value
    finally:
        d.close()
    d = gpupool.dashboard(client=gpupool.Client(hub.hub_url, hub.token("bob")), user="bob", interval=0.2)
    try:
        assert d.endpoints.value == "" and endpoint.id not in d.jobs.html.value
    finally:
        d.close()
    # a job view of it: the endpoint line with its state and URL; ended, the line says cancelled
    job_view = gpupool.JobView(endpoint, interval=0.2, log_lines=0)
    try:
        assert 'class="gpupool-endpoint" data-state="ready"' in job_view.html.value
        assert f'href="{url}"' in job_view.html.value
    finally:
        job_view.close()
    assert 'class="gpupool-endpoint"' in endpoint._repr_html_() and f'href="{url}"' in endpoint._repr_html_()
