"""Model endpoints on the dashboard page (/services/gpupool/, docs/admin.md, docs/endpoints.md) in
headless Chromium on the shared client hub: a table of endpoints with owner, state, replicas, GPUs
and the URL as a link; admins see every endpoint, a user theirs and those shared with them; the
link, followed in the signed-in browser, reaches the server. Screenshot:
test-artifacts/dashboard-endpoints.png."""
from __future__ import annotations

import pytest

from browser_harness import ARTIFACTS, chromium, open_dashboard
from endpoint_server import SERVER

pytestmark = [pytest.mark.browser, pytest.mark.hub, pytest.mark.slow]


@pytest.fixture(scope="module")
def endpoints(hub):
    """alice's endpoints, ready: one for herself, one shared with bob (no GPUs: the other tests
    on this hub keep theirs)."""
    import gpupool

    (hub.home("alice") / "hello_server.py").write_text(SERVER)
    client = gpupool.Client(hub.hub_url, hub.token("alice"))
    mine = gpupool.serve("hello_server.py", name="ep-private", client=client)
    shared = gpupool.serve("hello_server.py", name="ep-shared", share_users=["bob"], client=client)
    from gpupool.client.serving import wait_ready

    for job in (mine, shared):
        wait_ready(job, 120)
    yield mine, shared
    for job in (mine, shared):
        job.cancel()
    for job in (mine, shared):
        hub.wait_job(client.token, job.id, {"cancelled"})


def _rows(page) -> dict[str, dict]:
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#endpoints tr[data-endpoint]')]
        .map(tr => [tr.dataset.endpoint, {cells: [...tr.cells].map(td => td.innerText.trim()),
                                          href: tr.querySelector('a.endpoint-url').href}]))""")


def test_the_dashboard_lists_endpoints_with_their_state_and_a_working_link(hub, endpoints):
    mine, shared = endpoints
    with chromium() as browser:
        admin = open_dashboard(browser, hub, "admin")
        rows = _rows(admin)
        assert {mine.id, shared.id} <= set(rows), admin.inner_text("#endpoints")
        cells = rows[mine.id]["cells"]
        # endpoint, owner, queue, state, replicas, GPUs per replica, on, restarts, shared with, URL
        assert cells[0] == f"{mine.id} ep-private" and cells[1] == "alice" and cells[3] == "ready"
        assert cells[4] == "1/1" and cells[5] == "0 GPUs (CPU only)" and cells[7] == "0" and cells[8] == ""
        url = hub.hub_url + f"services/gpupool/endpoints/{mine.id}/"
        assert rows[mine.id]["href"] == url and cells[9] == url  # the whole URL, to give curl
        assert rows[shared.id]["cells"][8] == "bob"

        bob = open_dashboard(browser, hub, "bob")
        rows = _rows(bob)
        assert set(rows) & {mine.id, shared.id} == {shared.id}, bob.inner_text("#endpoints")
        assert "yours and those shared with you" in bob.inner_text("#endpoints h2")

        alice = open_dashboard(browser, hub, "alice")
        assert {mine.id, shared.id} <= set(_rows(alice))
        alice.locator("#endpoints").scroll_into_view_if_needed()
        alice.screenshot(path=str(ARTIFACTS / "dashboard-endpoints.png"), full_page=True)
        # the link in alice's signed-in browser reaches her server (the hub's sign-in, no token)
        with alice.context.expect_page() as opened:
            alice.click(f'#endpoints tr[data-endpoint="{mine.id}"] a.endpoint-url')
        answer = opened.value
        answer.wait_for_load_state()
        assert '"user": "alice"' in answer.inner_text("body"), answer.content()[:2000]
        # and bob's, for the endpoint not shared with him, gets 403
        r = bob.request.get(hub.hub_url + f"services/gpupool/endpoints/{mine.id}/")
        assert r.status == 403, r.text()
