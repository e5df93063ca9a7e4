"""The GPU-aware spawner.

Part 1 (fast, no processes): the options form and user_options validation.
Part 2 (marker ``hub``): a real JupyterHub + configurable-http-proxy + the gpupool service
(tests/support/hub_harness.py) with LocalGPUSpawner starting real jupyterhub-singleuser processes, driven
through the hub's REST API like a browser or a script would.
"""
from __future__ import annotations

import pytest

from gpupool.spawner.form import GPURequest, OptionError, options_from_form, parse_user_options, render_form

GiB = 2**30


# ---------------------------------------------------------------------------------------------
# Part 1: form and validation
# ---------------------------------------------------------------------------------------------

def parse(opts, **kw):
    kw.setdefault("queues", ["vision", "shared"])
    kw.setdefault("max_gpus", 4)
    kw.setdefault("max_gpu_memory", 24 * GiB)
    return parse_user_options(opts, **kw)


def test_valid_requests():
    assert parse({}) == GPURequest(gpus=0, queue="vision", preemptible=False)
    assert parse({"gpus": 0.5}) == GPURequest(gpus=0.5, queue="vision")
    assert parse({"gpus": 0.3}).gpus == 0.3  # any fraction, as for jobs (hub_ext/domain/gpus.py); the menu offers some
    assert parse({"gpus": "2", "queue": "shared", "preemptible": "on"}) == GPURequest(2, 0, "shared", True)
    r = parse({"gpu_memory": "20Gi", "preemptible": False})
    assert (r.gpus, r.gpu_memory, r.wants_gpu) == (0, 20 * GiB, True)
    assert r.body("dev") == {"server": "dev", "preemptible": False, "gpu_memory": 20 * GiB, "queue": "vision"}
    assert parse({"gpus": 1}).body() == {"server": "", "preemptible": False, "gpus": 1.0, "queue": "vision"}
    assert parse({}, default_gpus=1, default_preemptible=True) == GPURequest(1, 0, "vision", True)
    assert parse({"gpus": 1}, queues=None).queue is None  # queue list unknown: the service decides


@pytest.mark.parametrize("opts, field, words", [
    ({"gpus": -1}, "gpus", "must be >= 0 (0 means no GPU)"),
    ({"gpus": 1.5}, "gpus", "whole number"),
    ({"gpus": 5}, "gpus", "at most 4"),
    ({"gpus": "lots"}, "gpus", "not a number"),
    ({"gpus": True}, "gpus", "number of GPUs"),
    ({"gpu_memory": "20Gi", "gpus": 1}, "gpu_memory", "either gpus or gpu_memory"),
    ({"gpu_memory": "80Gi"}, "gpu_memory", "more than one GPU has (24Gi)"),
    ({"gpu_memory": "twenty"}, "gpu_memory", "not a quantity"),
    ({"gpu_memory": 0}, "gpu_memory", "more than 0"),
    ({"queue": "nlp"}, "queue", "you may not use queue 'nlp' (yours: vision, shared)"),
    ({"queue": 3}, "queue", "queue name"),
    ({"preemptible": "maybe"}, "preemptible", "true or false"),
    ({"image": "x"}, "image", "unknown option"),
])
def test_invalid_requests_name_the_field(opts, field, words):
    with pytest.raises(OptionError) as e:
        parse(opts)
    assert e.value.field == field
    assert words in e.value.message


def test_no_queue_at_all():
    with pytest.raises(OptionError, match="you have no queue, ask your admin"):
        parse({"gpus": 1, "queue": "vision"}, queues=[])
    assert parse({"gpus": 0}, queues=[]).queue is None


def test_pool_without_gpus():
    assert parse({}, max_gpus=0, default_gpus=1).gpus == 0
    with pytest.raises(OptionError, match="this hub has no GPUs"):
        parse({"gpus": 0.5}, max_gpus=0)
    with pytest.raises(OptionError, match="this hub has no GPUs"):
        parse({"gpu_memory": "1Gi"}, max_gpus=0)
    html = render_form(queues=[], max_gpus=0)
    assert 'value="0.25"' not in html and 'value="1"' not in html


def test_extra_fields_allowed_when_declared():
    assert parse({"gpus": 1, "image": "x"}, extra_fields=["image"]).gpus == 1
    with pytest.raises(OptionError):
        parse(["gpus"])


def test_options_from_form():
    assert options_from_form({"gpus": ["0.5"], "queue": ["vision"], "gpu_memory": [""]}) == {
        "gpus": "0.5", "queue": "vision", "preemptible": False}
    assert options_from_form({"gpus": ["1"], "gpu_memory": ["8Gi"], "preemptible": ["on"]}) == {
        "gpu_memory": "8Gi", "preemptible": True}
    # what the form produces always validates into the intended request
    assert parse(options_from_form({"gpus": ["0.25"], "queue": ["shared"]})) == GPURequest(0.25, 0, "shared")


def test_render_form():
    queues = [{"name": "vision", "deserved": {"gpu": 4}, "allocated": {"gpu": 1.5}, "pending": 2},
              {"name": "<b>x</b>", "deserved": {"gpu": 1}, "allocated": {}, "pending": 0}]
    html = render_form(queues=queues, max_gpus=3, gpu_memory=24 * GiB, gpu_model="A10",
                       defaults={"gpus": "2", "queue": "vision", "preemptible": True}, note="Ask #gpu")
    assert 'name="gpus"' in html and 'name="gpu_memory"' in html and 'name="preemptible"' in html
    assert '<option value="0.25" data-gpus="0.25">' in html and '<option value="0.5" data-gpus="0.5">' in html
    assert '<option value="2" data-gpus="2" selected>2 GPUs</option>' in html
    assert '<option value="4"' not in html
    assert ' selected>vision: 1.5 of 4 deserved GPUs in use, 2 waiting' in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html  # escaped
    assert " checked" in html and "24Gi (A10)" in html and "Ask #gpu" in html
    empty = render_form(queues=[], max_gpus=1)
    assert "You may not use any GPU queue" in empty and 'name="queue"' not in empty


# ---------------------------------------------------------------------------------------------
# Part 2: a real hub
# ---------------------------------------------------------------------------------------------
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

from hub_harness import hub_leak_check  # noqa: E402,F401 (leak check fixtures)
from spawner_harness import (spawner_config, start_server, stop_server, user_server,  # noqa: E402
                             wait_server_ready, workspace_of)

@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    from hub_harness import Hub

    tmp = tmp_path_factory.mktemp("spawner")
    extra = spawner_config(tmp) + """
c.Spawner.group_overrides = {"impatient": {"groups": ["impatient"],
                                           "spawner_override": {"admission_timeout": 2}},
                             "broken": {"groups": ["broken"],
                                        "spawner_override": {"cmd": ["/nonexistent/jupyterhub-singleuser"]}}}
"""
    gp = {"nodes": [{"name": "box", "gpus": 2, "gpu_memory": "24Gi", "gpu_model": "L4"}],
          "queues": [{"name": "vision", "deserved": {"gpu": 1}, "users": ["alice", "dave"], "groups": ["impatient", "broken"]},
                     {"name": "nlp", "deserved": {"gpu": 1}, "users": ["bob", "frank"]}]}
    with Hub(tmp, gpupool=gp, users=["alice", "bob", "dave", "erin", "frank", "gina"], admins=["admin"],
             groups={"impatient": ["erin"], "broken": ["gina"]}, extra_config=extra) as h:
        yield h


def _server_env(hub, user) -> dict:
    """The environment of the user's running jupyterhub-singleuser process (read from /proc)."""
    api = f"JUPYTERHUB_API_URL={hub.hub_api_url}".encode()
    who = f"JUPYTERHUB_USER={user}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if b"jupyterhub-singleuser" in cmd and api in env.split(b"\0") and who in env.split(b"\0"):
            return dict(kv.split("=", 1) for kv in env.decode().split("\0") if "=" in kv)
    raise AssertionError(f"no server process for {user}")


def _progress_events(hub, user, until, timeout=30):
    """Read the spawn progress event stream until ``until(events)`` is true or it ends."""
    import requests

    events = []
    deadline = time.monotonic() + timeout
    with requests.get(f"{hub.hub_api_url}/users/{user}/server/progress", stream=True, timeout=timeout,
                      headers={"Authorization": f"token {hub.admin_token}"}) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                events.append(json.loads(line[5:]))
                if until(events):
                    break
            if time.monotonic() > deadline:
                break
    return events


def _login(hub, user):
    import requests

    s = requests.Session()
    s.get(hub.hub_url + "hub/login")
    r = s.post(hub.hub_url + "hub/login",
               data={"username": user, "password": "x", "_xsrf": s.cookies.get("_xsrf", path="/hub/")})
    assert r.status_code == 200, r.text[:500]
    return s


@pytest.mark.hub
def test_fraction_and_whole_gpu_start_with_their_gpus(hub):
    # alice through the spawn form (a preemptible half GPU), bob through the REST API (a whole GPU)
    s = _login(hub, "alice")
    s.get(hub.hub_url + "hub/spawn")
    xsrf = s.cookies.get("_xsrf", path="/hub/")  # the logged-in session's token
    r = s.post(hub.hub_url + "hub/spawn", data={"gpus": "0.5", "queue": "vision", "preemptible": "on",
                                                 "gpu_memory": "", "_xsrf": xsrf}, allow_redirects=False)
    assert r.status_code == 302, r.text[:500]
    start_server(hub, "bob", {"gpus": 1, "queue": "nlp"})
    wait_server_ready(hub, "alice")
    wait_server_ready(hub, "bob")
    a_env, b_env = _server_env(hub, "alice"), _server_env(hub, "bob")
    a_ws, b_ws = workspace_of(hub, "alice"), workspace_of(hub, "bob")
    assert a_ws["status"] == "running" and a_ws["queue"] == "vision" and a_ws["preemptible"] is True
    assert b_ws["preemptible"] is False  # workspaces are non-preemptible unless asked
    [a_alloc] = a_ws["allocation"]
    [b_alloc] = b_ws["allocation"]
    assert a_alloc["fraction"] == 0.5 and len(a_alloc["gpus"]) == 1
    assert b_alloc["fraction"] == 1.0 and len(b_alloc["gpus"]) == 1
    assert a_env["CUDA_VISIBLE_DEVICES"] == str(a_alloc["gpus"][0])
    assert b_env["CUDA_VISIBLE_DEVICES"] == str(b_alloc["gpus"][0])
    assert a_env["CUDA_VISIBLE_DEVICES"] != b_env["CUDA_VISIBLE_DEVICES"]
    assert float(a_env["GPUPOOL_GPU_FRACTION"]) == 0.5
    # its kernels tell their frameworks the cap (tier 1): the start-up hook comes first on the path
    from gpupool.protocol import STARTUP_DIR

    assert a_env["PYTHONPATH"].split(os.pathsep)[0] == STARTUP_DIR
    assert STARTUP_DIR not in b_env.get("PYTHONPATH", "").split(os.pathsep)  # a whole GPU needs no cap
    assert a_env["HOME"].endswith("/home/alice") and os.path.isdir(a_env["HOME"])
    # `import gpupool` in the server finds the service: GPUPOOL_URL + the server's own token
    import requests
    r = requests.get(a_env["GPUPOOL_URL"] + "api/v1/queues", timeout=10,
                     headers={"Authorization": f"token {a_env['JUPYTERHUB_API_TOKEN']}"})
    assert r.status_code == 200 and [q["name"] for q in r.json()["queues"] if q["may_submit"]] == ["vision"]
    # the hub remembers what was asked for
    assert user_server(hub, "alice")["user_options"] == {"gpus": "0.5", "queue": "vision", "preemptible": True}
    assert b_env["CUDA_VISIBLE_DEVICES"] != "" and "GPUPOOL_GPU_FRACTION" in b_env

    # stopping frees the GPUs at once: by the time the hub answers, the workspace is gone
    r = hub.hub_api("DELETE", "users/alice/server", hub.admin_token)
    assert r.status_code in (202, 204)
    if r.status_code == 202:
        hub.wait_for(lambda: user_server(hub, "alice") is None, 30, 0.2)
    assert workspace_of(hub, "alice") is None
    gpus = {g["index"]: g for g in hub.api("GET", "nodes", hub.service_token).json()["nodes"][0]["gpus"]}
    assert gpus[a_alloc["gpus"][0]]["allocated"] == 0
    stop_server(hub, "bob")
    assert workspace_of(hub, "bob") is None


@pytest.mark.hub
def test_over_quota_waits_in_queue_with_its_position_then_starts(hub):
    start_server(hub, "alice", {"gpus": 1})  # vision's whole deserved quota
    wait_server_ready(hub, "alice")
    # dave (also vision) asks for a non-preemptible GPU: it must wait for alice's
    r = start_server(hub, "dave", {"gpus": 1}, expect=(202,))
    events = _progress_events(hub, "dave", lambda ev: any("position" in (e.get("message") or "") for e in ev))
    text = " | ".join(e.get("message", "") for e in events)
    assert "queued in vision" in text.lower() and "position 1" in text, text
    ws = workspace_of(hub, "dave")
    assert ws["status"] == "queued" and ws["position"] == 1, ws
    assert user_server(hub, "dave")["pending"] == "spawn"
    # alice stops: dave's server starts on the freed GPU
    stop_server(hub, "alice")
    wait_server_ready(hub, "dave")
    assert workspace_of(hub, "dave")["status"] == "running"
    assert _server_env(hub, "dave")["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    stop_server(hub, "dave")


@pytest.mark.hub
def test_admission_timeout_fails_cleanly_and_withdraws(hub):
    start_server(hub, "alice", {"gpus": 1})
    wait_server_ready(hub, "alice")
    start_server(hub, "erin", {"gpus": 1}, expect=(202,))  # erin's group has admission_timeout = 2 s
    events = _progress_events(hub, "erin", lambda ev: any(e.get("failed") for e in ev), timeout=40)
    failed = [e for e in events if e.get("failed")]
    assert failed, events
    msg = failed[-1]["message"]
    assert msg.startswith("Spawn failed: Still queued in vision after 2"), msg
    assert "at position 1" in msg and "runs within the queue's deserved GPUs" in msg, msg  # by reason_code
    hub.wait_for(lambda: user_server(hub, "erin") is None or not user_server(hub, "erin").get("pending"), 10)
    assert workspace_of(hub, "erin") is None  # the queued request was withdrawn
    assert "Traceback" not in hub.hub_log().split("erin")[-1][:2000]
    # a queued start that the user cancels (DELETE while pending) withdraws its request too
    start_server(hub, "dave", {"gpus": 1}, expect=(202,))
    hub.wait_for(lambda: (workspace_of(hub, "dave") or {}).get("status") == "queued", 10)
    r = hub.hub_api("DELETE", "users/dave/server", hub.admin_token)
    assert r.status_code in (202, 204), r.text
    hub.wait_for(lambda: workspace_of(hub, "dave") is None, 10, message="cancelled request still queued")
    hub.wait_for(lambda: user_server(hub, "dave") is None, 20)
    stop_server(hub, "alice")


@pytest.mark.hub
def test_server_that_fails_to_start_releases_its_gpus(hub):
    # gina's servers cannot start (group override: a command that does not exist)
    r = hub.hub_api("POST", "users/gina/server", hub.admin_token, json={"gpus": 1})
    hub.wait_for(lambda: user_server(hub, "gina") is None or not user_server(hub, "gina").get("pending"), 30)
    assert user_server(hub, "gina") is None or not user_server(hub, "gina").get("ready"), r.text
    assert workspace_of(hub, "gina") is None
    assert "released workspace workspaces/gina" in hub.hub_log()


@pytest.mark.hub
def test_preempted_workspace_server_is_stopped_and_the_owner_gets_the_gpu(hub):
    start_server(hub, "bob", {"gpus": 1, "queue": "nlp"})  # nlp's deserved GPU
    wait_server_ready(hub, "bob")
    # frank (nlp too) borrows vision's idle GPU with a preemptible workspace
    start_server(hub, "frank", {"gpus": 1, "queue": "nlp", "preemptible": True})
    wait_server_ready(hub, "frank")
    assert "borrowing" in workspace_of(hub, "frank")["reason"]
    # alice's queue wants its deserved GPU back: frank's workspace is preempted (grace 3 s), its
    # server stopped by the spawner's poll, and alice's server starts on that GPU
    start_server(hub, "alice", {"gpus": 1})
    hub.wait_for(lambda: user_server(hub, "frank") is None, 40, 0.3, message="frank's preempted server still runs")
    wait_server_ready(hub, "alice", timeout=40)
    assert workspace_of(hub, "frank") is None  # not left queued with no server behind it
    assert "frank's server: it no longer holds its GPUs" in hub.hub_log() or "no longer holds its GPUs" in hub.hub_log()
    stop_server(hub, "alice")
    stop_server(hub, "bob")


@pytest.mark.hub
@pytest.mark.parametrize("options, words", [
    ({"gpus": 1.5}, "gpus: 1.5: above 1 must be a whole number of GPUs"),
    ({"gpus": 3}, "gpus: 3 is more than a workspace may use (at most 2)"),
    ({"gpus": 1, "queue": "nlp"}, "queue: you may not use queue 'nlp' (yours: vision)"),
    ({"gpu_memory": "1Ti"}, "gpu_memory: 1Ti is more than one GPU has (24Gi)"),
    ({"gpus": 1, "colour": "red"}, "colour: unknown option"),
])
def test_bad_user_options_are_400_with_the_reason(hub, options, words):
    r = hub.hub_api("POST", "users/alice/server", hub.admin_token, json=options)
    assert r.status_code == 400, r.text
    assert words in r.json()["message"], r.json()
    assert workspace_of(hub, "alice") is None
    hub.wait_for(lambda: user_server(hub, "alice") is None, 10)


@pytest.mark.hub
def test_options_form_lists_the_users_queues(hub):
    def page(user):
        r = _login(hub, user).get(hub.hub_url + "hub/spawn")
        assert r.status_code == 200
        return r.text

    alice = page("alice")
    assert 'name="gpus"' in alice and 'value="0.25"' in alice and 'value="2"' in alice and 'value="3"' not in alice
    assert 'option value="vision"' in alice and 'option value="nlp"' not in alice
    assert "each GPU has 24Gi (L4)" in alice and 'name="preemptible"' in alice
    admin = page("admin")  # hub admins may use every queue
    assert 'option value="vision"' in admin and 'option value="nlp"' in admin
    erin = page("erin")  # by her group: the service decides from the hub's groups, not the spawner
    assert 'option value="vision"' in erin and 'option value="nlp"' not in erin

    def may_submit(token, **query):
        r = hub.api("GET", "queues", token, params=query)
        assert r.status_code == 200, r.text
        return [q["name"] for q in r.json()["queues"] if q["may_submit"]]

    # GET queues?user=: what the spawner asks with the service's (admin) token, for the user it starts
    assert may_submit(hub.service_token, user="erin") == ["vision"]
    assert may_submit(hub.service_token, user="frank") == ["nlp"]
    assert may_submit(hub.service_token, user="admin") == ["vision", "nlp"]
    assert may_submit(hub.service_token, user="nobody") == []  # no such hub user: no groups, no queue
    bob = hub.token("bob")
    assert may_submit(bob) == may_submit(bob, user="bob") == ["nlp"]
    r = hub.api("GET", "queues", bob, params={"user": "alice"})  # another user's access is the admin's to ask
    assert r.status_code == 403 and r.json()["field"] == "user"


@pytest.mark.hub
def test_hub_restart_releases_workspaces_whose_release_was_lost(tmp_path):
    """JupyterHub stops its services before its servers: on a hub restart the servers' releases
    cannot reach the gpupool service. The service asks the hub which servers it has and frees the
    GPUs of the others; a server that is still starting keeps its request."""
    import sqlite3

    from hub_harness import Hub, notebook

    gp = {"nodes": [{"name": "box", "gpus": 1, "gpu_memory": "24Gi"}], "queues": [{"name": "lab", "deserved": {"gpu": 1}}],
          "workspace_reconcile_seconds": 0.5, "workspace_release_grace": 2}
    with Hub(tmp_path, gpupool=gp, users=["alice", "bob", "carol"], admins=["admin"],
             extra_config=spawner_config(tmp_path)) as hub:
        start_server(hub, "alice", {"gpus": 1})
        wait_server_ready(hub, "alice")
        # the CLI lists, describes and refuses to delete her server, with its GPU and idle time
        from gpupool_cli import run

        ws = hub.wait_for(lambda: (workspace_of(hub, "alice") or {}).get("last_activity") and workspace_of(hub, "alice"), 10)
        cli = {"GPUPOOL_URL": hub.hub_url, "GPUPOOL_TOKEN": hub.token("alice")}
        res = run("list", env=cli)
        row = next(line for line in res.stdout.splitlines() if line.startswith(ws["id"]))
        assert re.match(rf"{ws['id']} +alice +- +lab +running +1 +box GPU 0 +\d+[smhd] ", row), res.stdout
        res = run("describe", ws["id"], env=cli)
        assert res.returncode == 0 and re.search(r"^gpus: +1 GPU$", res.stdout, re.M), res.stdout
        assert re.search(r"^last activity: .*\(idle \d+[smhd]\)$", res.stdout, re.M), res.stdout
        res = run("delete", ws["id"], env=cli)
        assert res.returncode == 1 and f"{ws['id']} is the notebook server alice/: stop it" in res.stderr
        assert workspace_of(hub, "alice")["status"] == "running"
        res = run("describe", "w-999999", env=cli)
        assert res.returncode == 1 and "no workspace 'w-999999'" in res.stderr
        # bob's job waits for alice's GPU
        bob = hub.token("bob")
        r = hub.api("POST", "jobs", bob, json={"notebook_content": notebook("print('ran')"), "gpus": 1})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        # carol's server waits in the queue: it is starting in the hub's view, so the checks (every
        # 0.5 s, grace 2 s) leave her request alone, and alice's running server keeps its GPU
        start_server(hub, "carol", {"gpus": 1}, expect=(202,))
        hub.wait_for(lambda: (workspace_of(hub, "carol") or {}).get("status") == "queued", 20)
        time.sleep(4)
        assert workspace_of(hub, "carol")["status"] == "queued" and user_server(hub, "carol")["pending"] == "spawn"
        assert workspace_of(hub, "alice")["status"] == "running"
        assert hub.api("GET", f"jobs/{jid}", bob).json()["status"] == "queued"
        stop_server(hub, "carol")  # the normal path: the spawner withdraws her request
        assert workspace_of(hub, "carol") is None

        # the hub restarts: it stops the gpupool service first, then alice's server, whose release fails
        hub.stop()
        assert "gpupool: workspaces/alice not released now: the gpupool service is not running" in hub.hub_log()
        db = sqlite3.connect(str(hub.dir / "gpupool.sqlite"))
        ((status, allocation),) = db.execute(
            "SELECT status, allocation FROM workloads WHERE type = 'workspace' AND user = 'alice'").fetchall()
        db.close()
        assert status == "running" and allocation not in (None, "null")  # still holds the GPU

        hub.start()
        # at start the service compares with the hub: alice's server is gone, so her GPU is released
        # at once (no grace: it stopped while the service was down) and bob's queued job gets it
        job = hub.wait_job(bob, jid, {"starting", "running", "succeeded"}, 60)
        assert job["allocation"] or job["status"] == "succeeded", job
        assert workspace_of(hub, "alice") is None
        db = sqlite3.connect(str(hub.dir / "gpupool.sqlite"))
        ((status, allocation, reason),) = db.execute(
            "SELECT status, allocation, reason FROM workloads WHERE type = 'workspace' AND user = 'alice'").fetchall()
        db.close()
        assert status == "cancelled" and allocation in (None, "null"), (status, allocation)
        assert reason == "released: the hub reports server alice/ not running (it stopped while the gpupool " \
                         "service was down)", reason
        log = hub.service_log()
        assert "released workspace w-" in log and "the hub reports server alice/ not running" in log


@pytest.mark.hub
def test_idle_culler_stops_an_idle_server_and_frees_its_gpu(tmp_path):
    """add_idle_culler(c): jupyterhub-idle-culler runs as a hub service; an idle server is stopped
    and the gpupool spawner releases its GPU."""
    from hub_harness import Hub

    gp = {"nodes": [{"name": "box", "gpus": 1, "gpu_memory": "24Gi"}], "queues": [{"name": "lab", "deserved": {"gpu": 1}}]}
    extra = spawner_config(tmp_path) + "from gpupool.hub_ext import add_idle_culler\nadd_idle_culler(c, timeout=3, every=1)\n"
    with Hub(tmp_path, gpupool=gp, users=["alice"], admins=["admin"], extra_config=extra) as hub:
        start_server(hub, "alice", {"gpus": 1})
        wait_server_ready(hub, "alice")
        assert workspace_of(hub, "alice")["status"] == "running"
        hub.wait_for(lambda: user_server(hub, "alice") is None, 60, 0.5, message="the idle server was not culled")
        hub.wait_for(lambda: workspace_of(hub, "alice") is None, 20, message="the culled server kept its GPU")
        assert "Culling server alice" in hub.hub_log() or "Culling server" in hub.hub_log(), hub.hub_log()[-3000:]


@pytest.mark.hub
def test_scheduler_down_gpu_start_fails_clearly_cpu_start_works(hub):
    """Runs last in this module: it stops the gpupool service."""
    hub.kill_service()
    r = hub.hub_api("POST", "users/alice/server", hub.admin_token, json={"gpus": 1})
    assert r.status_code == 503, r.text
    assert "Cannot start: the GPU scheduler" in r.json()["message"] and "not reachable" in r.json()["message"]
    hub.wait_for(lambda: user_server(hub, "alice") is None, 10)
    start_server(hub, "alice", {"gpus": 0})
    wait_server_ready(hub, "alice")
    assert _server_env(hub, "alice")["CUDA_VISIBLE_DEVICES"] == ""
    stop_server(hub, "alice")


def test_render_form_escapes_each_value_once():
    html = render_form(queues=[{"name": "a&b", "deserved": {"gpu": 1}}], max_gpus=1, gpu_memory=24 * GiB,
                       gpu_model="<L4 & co>", defaults={"gpu_memory": '"><script>'}, note="<i>note</i>")
    assert "(&lt;L4 &amp; co&gt;)" in html and "&amp;lt;" not in html and "&amp;amp;" not in html
    assert 'value="a&amp;b"' in html and '"><script>' not in html and "&lt;i&gt;note&lt;/i&gt;" in html
    assert html.count("<script>") == 1  # the form's own (the queue menu's), not the value's
    assert '<option value="0" data-gpus="0" selected>0 GPUs (CPU only)</option>' in html


def test_timeout_advice_follows_the_reason_code():
    from gpupool import contract as C
    from gpupool.spawner.mixin import timeout_advice

    assert "at its limit" in timeout_advice(C.Code.LIMIT.value)
    assert "not together on one node" in timeout_advice(C.Code.FRAGMENTED.value)
    assert "start again in a minute" in timeout_advice(C.Code.RECLAIMING.value)
    assert timeout_advice(None) == timeout_advice("no-such-code") == "Try a smaller request or ask your admin."
