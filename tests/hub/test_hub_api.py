"""The gpupool REST API through a real JupyterHub (tokens, scopes, proxy) and real papermill jobs."""
from __future__ import annotations

import json
import time

import pytest
from traitlets.config import Config

from hub_harness import Hub, hub_leak_check, notebook  # noqa: F401 (leak check fixtures)

pytestmark = pytest.mark.hub

QUEUES = [
    {"name": "research", "deserved": {"gpu": 2}},
    {"name": "vision", "parent": "research", "deserved": {"gpu": 1}, "users": ["alice"]},
    {"name": "nlp", "parent": "research", "deserved": {"gpu": 1}, "groups": ["nlp"]},
]
NODES = [{"name": "box", "gpus": 2, "gpu_memory": "16Gi"}]


GPUPOOL_ADMIN_DAVE = """
for _role in c.JupyterHub.load_roles:
    if _role["name"] == "gpupool-admin":
        _role["users"] = ["dave"]
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    # workspaces here are requested through the API with no server behind them: no reconciling with
    # the hub's servers (tests/spawner/test_spawner.py tests that with real servers)
    # dave holds the gpupool-admin role (custom:gpupool:admin) without being a JupyterHub admin
    h = Hub(tmp_path_factory.mktemp("api"), gpupool={"queues": QUEUES, "nodes": NODES, "workspace_reconcile_seconds": 0},
            users=["alice", "bob", "carol", "dave"], admins=["admin"], groups={"nlp": ["bob"]},
            extra_config=GPUPOOL_ADMIN_DAVE)
    with h:
        yield h


@pytest.fixture(scope="module")
def tokens(hub):
    return {u: hub.token(u) for u in ("alice", "bob", "carol")} | {"admin": hub.admin_token}


# ------------------------------------------------------------------ configure(c), no hub

def test_configure_registers_service_scopes_roles_in_either_order():
    c = Config()
    c.JupyterHub.load_roles = [{"name": "user", "scopes": ["self", "read:groups"]}]
    c.Spawner.server_token_scopes = ["access:servers!server"]
    from gpupool.hub_ext import ADMIN_SCOPE, SUBMIT_SCOPE, configure

    configure(c)
    c.GPUPool.queues = [{"name": "q", "deserved": {"gpu": 1}, "users": ["alice"]}]  # after configure
    c.GPUPool.nodes = [{"name": "n", "gpus": 1}]
    (svc,) = [s for s in c.JupyterHub.services if s["name"] == "gpupool"]
    assert svc["oauth_no_confirm"] and svc["url"].startswith("http://127.0.0.1:")
    doc = json.loads(svc["environment"]["GPUPOOL_CONFIG"]())
    assert doc["GPUPool"]["queues"][0]["users"] == ["alice"]
    assert set(c.JupyterHub.custom_scopes) == {SUBMIT_SCOPE, ADMIN_SCOPE}
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    # merged, not replaced; access:services: users may sign in to the dashboard
    assert roles["user"]["scopes"] == ["self", "read:groups", SUBMIT_SCOPE, "access:services!service=gpupool"]
    assert ADMIN_SCOPE in roles["gpupool-service"]["scopes"] and roles["gpupool-service"]["services"] == ["gpupool"]
    # to check workspaces against the hub's servers (workspace reconcile)
    assert {"list:users", "read:servers"} <= set(roles["gpupool-service"]["scopes"])
    assert c.Spawner.server_token_scopes == ["access:servers!server", SUBMIT_SCOPE]
    # a bad entry set after configure is refused when the hub starts the service, naming it
    c.GPUPool.nodes = [{"name": "n", "gpus": "four"}]
    from gpupool.hub_ext.config import GPUPoolConfigError

    with pytest.raises(GPUPoolConfigError, match=r"c.GPUPool.nodes\[0\].gpus: must be an integer"):
        svc["environment"]["GPUPOOL_CONFIG"]()
    # a misspelled setting is an error too (with the likely name), and every problem is named
    c.GPUPool.preemtion_grace = 3
    with pytest.raises(GPUPoolConfigError) as e:
        svc["environment"]["GPUPOOL_CONFIG"]()
    assert str(e.value).splitlines() == [
        "c.GPUPool.preemtion_grace: no such setting (did you mean c.GPUPool.preemption_grace?)",
        "c.GPUPool.nodes[0].gpus: must be an integer"]
    del c.GPUPool["preemtion_grace"]
    # the environment value is stored by JupyterHub as JSON: it must serialise (as a note), not be a function
    assert json.loads(json.dumps(svc["environment"]))["GPUPOOL_CONFIG"].startswith("(computed by gpupool")
    # one set before configure is refused at once
    c2 = Config()
    c2.GPUPool.queues = [{"name": "q", "users": "alice"}]
    with pytest.raises(GPUPoolConfigError, match=r"queues\[0\].users: must be a list"):
        configure(c2)


def test_a_role_with_a_filtered_gpupool_scope_stops_the_hub_at_start():
    """gpupool scopes take no filter (the service cannot honour one): a role granting
    custom:gpupool:admin!group=cv is refused when the hub starts the service, naming the role."""
    from gpupool.hub_ext import configure
    from gpupool.hub_ext.config import GPUPoolConfigError

    c = Config()
    configure(c)
    c.GPUPool.nodes = NODES
    c.JupyterHub.load_roles.append({"name": "cv-admins", "scopes": ["custom:gpupool:admin!group=cv"], "groups": ["cv"]})
    (svc,) = [s for s in c.JupyterHub.services if s["name"] == "gpupool"]
    with pytest.raises(GPUPoolConfigError) as e:
        svc["environment"]["GPUPOOL_CONFIG"]()
    assert "(cv-admins): 'custom:gpupool:admin!group=cv': gpupool scopes take no filter" in str(e.value)
    c.JupyterHub.load_roles[-1]["scopes"] = ["custom:gpupool:admin"]  # unfiltered: fine
    svc["environment"]["GPUPOOL_CONFIG"]()


def test_bad_config_stops_the_hub_with_the_entry_named(tmp_path):
    h = Hub(tmp_path, gpupool={"queues": [{"name": "q", "deserved": {"gpu": -1}}], "nodes": NODES},
            start_timeout=60)
    with pytest.raises(AssertionError) as err:
        h.start()
    assert "c.GPUPool.queues[0].deserved.gpu: must be >= 0" in str(err.value) or \
        "c.GPUPool.queues[0].deserved.gpu: must be >= 0" in h.hub_log()
    assert h._hub.returncode not in (None, 0)
    # JupyterHub dies without stopping the proxy it started; the harness stops it (the leak check
    # fixture fails the test otherwise)
    assert "configurable-http-proxy" in [what for _, what in h._started.values()], h._started
    assert h.stopped and h.leftover_processes() == []


# ------------------------------------------------------------------ authorization matrix

def test_health_and_metrics_need_no_token(hub):
    assert hub.api("GET", "health").json()["ok"] is True
    r = hub.api("GET", "metrics")
    assert r.status_code == 200 and "gpupool_jobs_submitted_total" in r.text


def test_a_filtered_admin_scope_makes_no_admin(hub, tokens):
    """A token carrying custom:gpupool:admin with a filter (asked for through the hub's API) is
    not an admin: it cannot cancel or list another user's jobs, nor admit a workspace. Found by an
    audit, where such a scope counted as global admin."""
    nb = notebook("print('hi')")
    r = hub.api("POST", "jobs", tokens["alice"], json={"notebook_content": nb, "gpus": 0, "name": "audit"})
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    dave = hub.token("dave")  # the role's unfiltered admin scope: an admin
    assert hub.api("GET", f"jobs/{jid}", dave).status_code == 200
    assert hub.api("GET", "jobs?user=alice", dave).status_code == 200
    narrowed = hub.token("dave", scopes=["custom:gpupool:admin!user=bob"])
    r = hub.api("DELETE", f"jobs/{jid}", narrowed)
    assert r.status_code == 403 and "belongs to another user" in r.json()["message"], r.text
    assert hub.api("GET", "jobs?user=alice", narrowed).status_code == 403
    r = hub.api("POST", "workspaces/alice/x", narrowed, json={"gpus": 0})
    assert r.status_code == 403 and "custom:gpupool:admin" in r.json()["message"], r.text
    assert hub.api("GET", "jobs", narrowed).status_code == 200  # its own jobs: the submit scope it implies
    assert hub.api("DELETE", f"jobs/{jid}", tokens["alice"]).status_code == 200


def test_authorization_matrix(hub, tokens):
    nb = notebook("print('hi')")
    # no token / bad token: 401; token without a gpupool scope: 403
    assert hub.api("GET", "jobs").status_code == 401
    assert hub.api("GET", "jobs", "not-a-token").status_code == 401
    noscope = hub.token("alice", scopes=["read:users:name!user"])
    r = hub.api("GET", "jobs", noscope)
    assert r.status_code == 403 and "custom:gpupool:submit" in r.json()["message"]
    assert hub.api("POST", "jobs", noscope, json={"notebook_content": nb}).status_code == 403
    # a token with only the submit scope (what a notebook server's own token has) works, also via the proxy
    submit_only = hub.token("alice", scopes=["custom:gpupool:submit"])
    r = hub.api("POST", "jobs", submit_only, json={"notebook_content": nb, "name": "mine"}, via_proxy=True)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["user"] == "alice" and job["queue"] == "vision"  # alice's first permitted queue
    jid = job["id"]
    # the owner and admins see it; another user gets 403 for read, log, output, metrics and cancel
    assert hub.api("GET", f"jobs/{jid}", tokens["alice"]).status_code == 200
    assert hub.api("GET", f"jobs/{jid}", tokens["admin"]).status_code == 200
    assert hub.api("GET", f"jobs/{jid}", hub.service_token).status_code == 200
    for method, path in (("GET", f"jobs/{jid}"), ("GET", f"jobs/{jid}/log"), ("GET", f"jobs/{jid}/output"),
                         ("DELETE", f"jobs/{jid}")):
        r = hub.api(method, path, tokens["bob"])
        assert r.status_code == 403, (method, path, r.text)
    r = hub.api("POST", f"jobs/{jid}/metrics", tokens["bob"], json={"name": "x", "value": 1})
    assert r.status_code == 403
    # listing: own jobs only; admins see all and filter by user
    assert jid not in [j["id"] for j in hub.api("GET", "jobs", tokens["bob"]).json()["jobs"]]
    assert hub.api("GET", "jobs?user=alice", tokens["bob"]).status_code == 403
    assert jid in [j["id"] for j in hub.api("GET", "jobs?user=alice", tokens["admin"]).json()["jobs"]]
    assert all(j["user"] == "alice" for j in hub.api("GET", "jobs?user=alice", tokens["admin"]).json()["jobs"])
    # workspaces are the spawner's: admin scope only
    r = hub.api("POST", "workspaces/alice", tokens["alice"], json={"gpus": 1})
    assert r.status_code == 403
    hub.wait_job(tokens["alice"], jid, {"succeeded"}, 90)


def test_queue_permissions(hub, tokens):
    nb = notebook("1")
    queues = {q["name"]: q for q in hub.api("GET", "queues", tokens["alice"]).json()["queues"]}
    assert queues["vision"]["may_submit"] and not queues["nlp"]["may_submit"]
    assert not queues["research"]["may_submit"]  # a department
    assert queues["nlp"]["groups"] == ["nlp"] and queues["vision"]["users"] == ["alice"]
    r = hub.api("POST", "jobs", tokens["alice"], json={"notebook_content": nb, "queue": "nlp"})
    assert r.status_code == 403 and r.json()["field"] == "queue"
    # bob may use nlp through his JupyterHub group; it is his default
    r = hub.api("POST", "jobs", tokens["bob"], json={"notebook_content": nb})
    assert r.status_code == 201 and r.json()["queue"] == "nlp"
    hub.api("DELETE", f"jobs/{r.json()['id']}", tokens["bob"])
    # carol is in no queue's list
    r = hub.api("POST", "jobs", tokens["carol"], json={"notebook_content": nb})
    assert r.status_code == 403 and "may not use any queue" in r.json()["message"]
    # admins may use any leaf queue
    r = hub.api("POST", "jobs", tokens["admin"], json={"notebook_content": nb, "queue": "nlp"})
    assert r.status_code == 201
    hub.api("DELETE", f"jobs/{r.json()['id']}", tokens["admin"])


@pytest.mark.parametrize("body,field,words", [
    ({"gpus": -1}, "gpus", "must be >= 0 (0 means no GPU)"),
    ({"gpus": 1.5}, "gpus", "whole number"),
    ({"gpus": 8}, "gpus", "no node has 8 GPUs"),
    ({"gpus": "two"}, "gpus", "must be a number"),
    ({"gpu_memory": "lots"}, "gpu_memory", "not a quantity"),
    ({"gpu_memory": "64Gi"}, "gpu_memory", "no GPU has 64Gi"),
    ({"gpus": 1, "gpu_memory": "1Gi"}, "gpu_memory", "either gpus or gpu_memory"),
    ({"kind": "interactive"}, "kind", "must be one of"),
    ({"kind": "batch"}, "kind", "must be one of"),
    ({"priority": "high"}, "priority", "must be an integer"),
    ({"preemptible": "yes"}, "preemptible", "true or false"),
    ({"checkpoint_on_signal": 1}, "checkpoint_on_signal", "true or false"),
    ({"cpu": "lots"}, "cpu", "number of cores"),
    ({"gpu": 1}, "gpu", "unknown field"),
    ({"queue": "nope"}, "queue", "unknown queue 'nope'"),
    ({"queue": "research"}, "queue", "department"),
    ({"parameters": [1, 2]}, "parameters", "object"),
    ({"sweep": 5}, "sweep", "string"),
    ({"name": ["x"]}, "name", "string"),
])
def test_bad_submissions_are_400_naming_the_field(hub, tokens, body, field, words):
    r = hub.api("POST", "jobs", tokens["alice"], json={"notebook_content": notebook("1"), **body})
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["status"] == 400 and err["field"] == field and words in err["message"], err
    assert err["message"].startswith(f"{field}: ")


def test_bad_notebooks_and_bodies_are_400(hub, tokens):
    tok = tokens["alice"]
    (hub.home("alice") / "not-json.ipynb").write_text("{oops")
    cases = [
        ({}, "notebook", "exactly one"),
        ({"notebook": "a.ipynb", "notebook_content": notebook("1")}, "notebook", "exactly one"),
        ({"notebook": "missing.ipynb"}, "notebook", "no such file"),
        ({"notebook": "../bob/x.ipynb"}, "notebook", "inside your working directory"),
        ({"notebook": "/etc/passwd"}, "notebook", "relative"),
        ({"notebook": "not-json.ipynb"}, "notebook", "not a readable Jupyter notebook"),
        ({"notebook_content": {"cells": "x"}}, "notebook_content", "not a Jupyter notebook"),
        ({"notebook_content": {"cells": [], "nbformat": 3}}, "notebook_content", "nbformat 4"),
    ]
    for body, field, words in cases:
        r = hub.api("POST", "jobs", tok, json=body)
        assert r.status_code == 400 and r.json().get("field") == field and words in r.json()["message"], (body, r.text)
    r = hub.api("POST", "jobs", tok, data="{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["message"].startswith("body: not valid JSON")
    r = hub.api("POST", "jobs", tok, json=[1, 2])
    assert r.status_code == 400 and "JSON object" in r.json()["message"]
    assert hub.api("GET", "jobs?status=bogus", tok).json()["field"] == "status"
    for path in ("jobs/j-999999", "jobs/nonsense", "jobs/j-999999/log", "jobs/w-000001"):
        r = hub.api("GET", path, tok)
        assert r.status_code == 404 and r.json()["status"] == 404, (path, r.text)
    assert hub.api("GET", "no/such/endpoint", tok).status_code == 404


# ------------------------------------------------------------------ real jobs

TRAIN = """
import os, json, urllib.request
print(f"training with lr={lr}", flush=True)
print("gpus", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["GPUPOOL_GPU_FRACTION"], flush=True)
def post(path, body=None, method="POST"):
    req = urllib.request.Request(os.environ["GPUPOOL_API_URL"] + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "token " + os.environ["GPUPOOL_API_TOKEN"], "Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(req).status
    except urllib.error.HTTPError as e:
        return e.code
codes = [post(f"jobs/{os.environ['GPUPOOL_JOB_ID']}/metrics", {"name": "val_acc", "value": 0.5 + i / 10, "step": i})
         for i in range(3)]
print("metric codes", codes, "list with job token:", post("jobs", method="GET"), flush=True)
result = lr * 2
"""


def test_notebook_job_runs_with_parameters_log_output_and_metrics(hub, tokens):
    tok = tokens["alice"]
    (hub.home("alice") / "train.ipynb").write_text(json.dumps(notebook(TRAIN, parameters="lr = 0.1")))
    r = hub.api("POST", "jobs", tok, json={"notebook": "train.ipynb", "parameters": {"lr": 0.25}, "gpus": 0.5,
                                           "sweep": "s-1"})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["name"] == "train" and job["gpus"] == 0.5 and job["preemptible"] is True and job["sweep"] == "s-1"
    done = hub.wait_job(tok, job["id"], {"succeeded", "failed"}, 90)
    assert done["status"] == "succeeded", done
    assert done["exit_code"] == 0 and done["reason"].startswith("succeeded")
    assert [m["value"] for m in done["metrics"]["val_acc"]] == [0.5, 0.6, 0.7]
    log = hub.api("GET", f"jobs/{job['id']}/log", tok)
    assert "training with lr=0.25" in log.text
    assert "metric codes [201, 201, 201] list with job token: 403" in log.text  # job token: its own job only
    assert "gpus 0 0.5" in log.text  # CUDA_VISIBLE_DEVICES and the fraction
    end = int(log.headers["X-Log-Offset"])
    assert end == len(log.content)
    assert hub.api("GET", f"jobs/{job['id']}/log?offset={end}", tok).content == b""
    out = hub.api("GET", f"jobs/{job['id']}/output", tok)
    assert out.status_code == 200 and out.headers["Content-Type"].startswith("application/x-ipynb+json")
    cells = out.json()["cells"]
    assert any("lr = 0.25" in "".join(c["source"]) for c in cells)  # papermill's injected parameters
    listed = hub.api("GET", "jobs?sweep=s-1&status=succeeded", tok).json()["jobs"]
    assert [j["id"] for j in listed] == [job["id"]]


def test_failing_notebook_fails_with_the_error_as_reason(hub, tokens):
    tok = tokens["bob"]
    r = hub.api("POST", "jobs", tok, json={"notebook_content": notebook("x = 1", "raise ValueError('boom at step 3')")})
    done = hub.wait_job(tok, r.json()["id"], {"succeeded", "failed"}, 90)
    assert done["status"] == "failed"
    assert "ValueError: boom at step 3" in done["reason"], done["reason"]
    assert done["exit_code"] not in (0, None)
    assert hub.api("GET", f"jobs/{done['id']}/output", tok).status_code == 200  # papermill keeps the partial output


WAIT_FOR_FILE = """
import os, time, pathlib
print("started", flush=True)
flag = pathlib.Path(flag_path)
while not flag.exists():
    time.sleep(0.1)
"""


def test_queueing_with_reason_and_position_then_cancel(hub, tokens):
    """Non-preemptible jobs stay within deserved quota: alice's second 1-GPU inference job waits."""
    tok = tokens["alice"]
    flag = hub.home("alice") / "release-1"
    nb = notebook(WAIT_FOR_FILE, parameters="flag_path = ''")
    first = hub.api("POST", "jobs", tok, json={"notebook_content": nb, "gpus": 1, "kind": "inference",
                                               "parameters": {"flag_path": str(flag)}}).json()
    second = hub.api("POST", "jobs", tok, json={"notebook_content": nb, "gpus": 1, "kind": "inference",
                                                "parameters": {"flag_path": str(flag)}}).json()
    third = hub.api("POST", "jobs", tok, json={"notebook_content": nb, "gpus": 1, "kind": "inference",
                                               "parameters": {"flag_path": str(flag)}}).json()
    hub.wait_job(tok, first["id"], {"running"}, 60)

    def queued_with_reason():
        j = hub.api("GET", f"jobs/{second['id']}", tok).json()
        return j if j["status"] == "queued" and j["position"] == 1 and "vision" in j["reason"] else None

    j = hub.wait_for(queued_with_reason, 30, message="second job never showed its queue position")
    assert "position 1" in j["reason"]
    assert hub.api("GET", f"jobs/{third['id']}", tok).json()["position"] == 2
    q = {x["name"]: x for x in hub.api("GET", "queues", tok).json()["queues"]}["vision"]
    assert q["running"] >= 1 and q["pending"] >= 2 and q["allocated"]["gpu"] >= 1
    nodes = hub.api("GET", "nodes", tok).json()["nodes"]
    holders = [a["workload"] for g in nodes[0]["gpus"] for a in g["allocations"]]
    assert first["id"] in holders
    # cancel the queued third at once; cancel the running first (stopped within the grace period)
    c3 = hub.api("DELETE", f"jobs/{third['id']}", tok).json()
    assert c3["status"] == "cancelled" and "cancelled by alice" in c3["reason"]
    c1 = hub.api("DELETE", f"jobs/{first['id']}", tok).json()
    assert c1["status"] == "cancelled"
    # the first's GPU goes to the second once the first has really stopped
    hub.wait_job(tok, second["id"], {"running"}, 60)
    first_now = hub.api("GET", f"jobs/{first['id']}", tok).json()
    assert first_now["status"] == "cancelled" and first_now["allocation"] == [] and first_now["finished_at"]
    flag.write_text("go")
    assert hub.wait_job(tok, second["id"], {"succeeded", "failed"}, 60)["status"] == "succeeded"
    assert hub.api("GET", f"jobs/{third['id']}", tok).json()["attempts"] == 0


def test_workspace_admission_for_the_spawner(hub, tokens):
    svc = hub.service_token  # what the spawner uses
    r = hub.api("POST", "workspaces/alice", svc, json={"gpus": 1, "queue": "vision"})
    assert r.status_code == 201, r.text
    t0 = time.monotonic()

    def running():
        w = hub.api("GET", "workspaces/alice", svc).json()
        return w if w["status"] == "running" else None

    ws = hub.wait_for(running, 30)
    admitted_in = time.monotonic() - t0
    assert ws["allocation"][0]["node"] == "box" and ws["env"]["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    assert ws["preemptible"] is False
    assert admitted_in < 30
    # idempotent: the same request returns the same workspace
    again = hub.api("POST", "workspaces/alice", svc, json={"gpus": 1, "queue": "vision"})
    assert again.status_code == 200 and again.json()["id"] == ws["id"]
    assert hub.api("GET", "workspaces/alice", tokens["alice"]).status_code == 200
    assert hub.api("GET", "workspaces/alice", tokens["bob"]).status_code == 403
    listed = hub.api("GET", "workspaces", tokens["bob"]).json()["workspaces"]
    assert [w["user"] for w in listed] == ["alice"] and "env" not in listed[0]
    # bob may not have a workspace in vision (not his queue); bad input names the field
    assert hub.api("POST", "workspaces/bob", svc, json={"gpus": 1, "queue": "vision"}).status_code == 403
    r = hub.api("POST", "workspaces/bob", svc, json={"gpus": -0.5})
    assert r.status_code == 400 and r.json()["field"] == "gpus"
    d = hub.api("DELETE", "workspaces/alice", svc)
    assert d.status_code == 200 and d.json()["status"] == "stopped"
    assert hub.api("GET", "workspaces/alice", svc).status_code == 404
    assert hub.api("DELETE", "workspaces/alice", svc).status_code == 404


def test_preemptible_workspace_is_reclaimed_and_requeued(hub, tokens):
    """bob holds nlp's deserved GPU with one workspace and borrows vision's idle GPU with a
    preemptible second one; alice's job reclaims it."""
    svc = hub.service_token
    assert hub.api("POST", "workspaces/bob/own", svc, json={"gpus": 1}).status_code == 201
    hub.wait_for(lambda: hub.api("GET", "workspaces/bob/own", svc).json()["status"] == "running", 30)
    r = hub.api("POST", "workspaces/bob/big", svc, json={"gpus": 1, "preemptible": True})
    assert r.status_code == 201 and r.json()["queue"] == "nlp"
    hub.wait_for(lambda: hub.api("GET", "workspaces/bob/big", svc).json()["status"] == "running", 30)
    job = hub.api("POST", "jobs", tokens["alice"], json={"notebook_content": notebook("1"), "gpus": 1}).json()

    def requeued():
        w = hub.api("GET", "workspaces/bob/big", svc).json()
        return w if w["status"] in ("preempting", "queued") else None

    w = hub.wait_for(requeued, 30, 0.1)
    assert "reclaim" in w["reason"] or "vision" in w["reason"], w
    assert hub.wait_job(tokens["alice"], job["id"], {"succeeded", "failed"}, 90)["status"] == "succeeded"
    w = hub.api("GET", "workspaces/bob/big", svc).json()
    assert w["status"] in ("queued", "running")  # requeued after the grace period; may be readmitted since
    assert hub.api("DELETE", "workspaces/bob/big", svc).status_code == 200
    assert hub.api("GET", "workspaces/bob/own", svc).json()["status"] == "running"  # untouched
    assert hub.api("DELETE", "workspaces/bob/own", svc).status_code == 200


def test_service_logged_no_errors(hub):
    """Runs last in this module: no cycle failed and no request hit a 500 in all of the above."""
    log = hub.service_log()
    assert "scheduling cycle failed" not in log and "Traceback" not in log, log[-5000:]


def test_a_job_of_a_user_without_a_working_directory_creates_it(hub, tokens):
    import shutil

    shutil.rmtree(hub.home("admin"))  # e.g. a user added after the homes were made
    r = hub.api("POST", "jobs", tokens["admin"], json={"notebook_content": notebook("open('here.txt', 'w').write('x')"),
                                                     "queue": "vision"})
    assert r.status_code == 201, r.text
    job = hub.wait_job(tokens["admin"], r.json()["id"], {"succeeded", "failed"}, timeout=60)
    assert job["status"] == "succeeded", job["reason"]
    assert (hub.home("admin") / "here.txt").read_text() == "x"
