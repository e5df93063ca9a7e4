"""Model endpoints through the real hub (docs/endpoints.md): a tiny HTTP server submitted as
``kind: inference`` is reached at its endpoint URL through the hub's proxy with its owner's token
(200, the server's answer), refused with another user's (403) and without a token (401), reached by
a member of a group it is shared with; killed, it is restarted and comes back ``ready``; two
replicas behind the one URL take requests in turn."""
from __future__ import annotations

import os
import signal

import pytest
import requests

from endpoint_server import SERVER
from hub_harness import Hub, hub_leak_check  # noqa: F401 (leak check fixture)



@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with Hub(tmp_path_factory.mktemp("endpoints"), gpupool={"nodes": [{"name": "box", "gpus": 2}], "endpoint_probe_seconds": 0.3,
                                                                  "queues": [{"name": "team", "deserved": {"gpu": 2}}]},
             users=["alice", "bob", "carol"], groups={"cv": ["carol"]}) as h:
        (h.home("alice") / "serve.py").write_text(SERVER)
        yield h


def call(hub, job, token=None, path="", **kw):
    headers = {"Authorization": f"token {token}"} if token else {}
    return requests.request(kw.pop("method", "GET"), hub.hub_url.rstrip("/") + job["endpoint"] + path,
                            headers=headers, timeout=30, **kw)


def wait_ready(hub, token, job_id, restarts=0, replicas=1):
    def ready():
        job = hub.api("GET", f"jobs/{job_id}", token).json()
        return job if (job["endpoint_state"] == "ready" and job["ready_replicas"] == replicas
                       and job["endpoint_restarts"] == restarts) else None
    return hub.wait_for(ready, timeout=60, message=f"{job_id} ready after {restarts} restarts")


def test_an_endpoint_answers_its_owner_refuses_others_and_comes_back_after_a_crash(hub):
    alice, bob, carol = hub.token("alice"), hub.token("bob"), hub.token("carol")
    r = hub.api("POST", "jobs", alice, json={"script": "serve.py", "kind": "inference", "gpus": 0.5,
                                             "share": {"groups": ["cv"]}})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["endpoint"] == f"/services/gpupool/endpoints/{job['id']}/"
    assert job["endpoint_state"] == "starting" and job["preemptible"] is False  # within the deserved quota
    job = wait_ready(hub, alice, job["id"])
    first = call(hub, job, alice, "predict?x=1")
    assert first.status_code == 200, first.text
    answer = first.json()
    assert answer["path"] == "/predict?x=1" and answer["user"] == "alice"
    assert answer["token"] is None  # the caller's token stays with the hub
    posted = call(hub, job, alice, "predict", method="POST", json={"x": [1, 2]})
    assert posted.status_code == 201 and posted.json() == {"echo": {"x": [1, 2]}}
    refused = call(hub, job, bob)
    assert refused.status_code == 403 and "alice" in refused.json()["message"], refused.text
    assert call(hub, job).status_code == 401
    shared = call(hub, job, carol)  # carol is in group cv, which alice shared it with
    assert shared.status_code == 200 and shared.json()["user"] == "carol"
    # the server crashes: its runner starts it again, and the endpoint is ready once it answers
    os.kill(answer["pid"], signal.SIGKILL)
    job = wait_ready(hub, alice, job["id"], restarts=1)
    again = call(hub, job, alice)
    assert again.status_code == 200 and again.json()["pid"] != answer["pid"]
    assert job["status"] == "running" and job["attempts"] == 1
    r = hub.api("DELETE", f"jobs/{job['id']}", alice)
    hub.wait_job(alice, job["id"], {"cancelled"})
    gone = call(hub, job, alice)
    assert gone.status_code == 503 and "cancelled" in gone.json()["message"]


def test_replicas_share_one_url_in_turn(hub):
    alice = hub.token("alice")
    r = hub.api("POST", "jobs", alice, json={"script": "serve.py", "kind": "inference", "replicas": 2})
    assert r.status_code == 201, r.text
    job = wait_ready(hub, alice, r.json()["id"], replicas=2)
    assert job["pods"] == 2
    pids = {call(hub, job, alice).json()["pid"] for _ in range(4)}
    assert len(pids) == 2
    hub.api("DELETE", f"jobs/{job['id']}", alice)
    hub.wait_job(alice, job["id"], {"cancelled"})


def test_replicas_and_share_belong_to_endpoints(hub):
    alice = hub.token("alice")
    r = hub.api("POST", "jobs", alice, json={"script": "serve.py", "replicas": 2})
    assert r.status_code == 400 and r.json()["field"] == "replicas", r.text
    r = hub.api("POST", "jobs", alice, json={"script": "serve.py", "share": {"users": ["bob"]}})
    assert r.status_code == 400 and r.json()["field"] == "share", r.text
    r = hub.api("POST", "jobs", alice, json={"script": "serve.py", "kind": "inference", "replicas": 2, "pods": 3})
    assert r.status_code == 400 and r.json()["field"] == "pods", r.text


def test_the_cli_and_the_client_serve_and_list_endpoints_with_their_urls(hub):
    import subprocess
    import sys
    from pathlib import Path

    import gpupool

    alice = hub.token("alice")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "JUPYTERHUB_"))}
    env.update(GPUPOOL_URL=hub.hub_url, GPUPOOL_TOKEN=alice, GPUPOOL_CLIENT_CONFIG="/nonexistent/gpupool.json")
    cli = str(Path(sys.executable).parent / "gpupool")
    res = subprocess.run([cli, "serve", "--wait", "--name", "from-cli", "serve.py"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    url = next(line.split("URL: ", 1)[1] for line in res.stdout.splitlines() if line.startswith("URL: "))
    assert url.startswith(hub.hub_url + "services/gpupool/endpoints/j-")
    assert requests.get(url, headers={"Authorization": f"token {alice}"}, timeout=30).json()["user"] == "alice"
    listed = subprocess.run([cli, "endpoints"], capture_output=True, text=True, env=env, timeout=60).stdout
    assert "from-cli" in listed and url in listed and "ready" in listed, listed
    client = gpupool.Client(hub.hub_url, alice)
    job = gpupool.serve("serve.py", gpus=0.5, name="from-python", share_users=["bob"], wait=True, client=client)
    assert job.url.startswith(hub.hub_url + "services/gpupool/endpoints/") and job.data["share"]["users"] == ["bob"]
    assert call(hub, job.data, hub.token("bob")).status_code == 200
    assert {j.data["name"] for j in gpupool.endpoints(client=client)} >= {"from-cli", "from-python"}
    for j in gpupool.endpoints(client=client):
        j.cancel()


def test_the_example_serves_the_model_the_example_notebook_trained(hub):
    """examples/serve_model.py as an endpoint: it serves the model a run of
    examples/train_checkpoint.ipynb trained (a logistic regression on data it makes, no download)
    and wrote to model.json; the job logged the val_acc the served model reports."""
    import shutil
    from pathlib import Path

    import nbformat

    alice = hub.token("alice")
    root = Path(__file__).resolve().parents[2] / "examples"
    shutil.copy(root / "serve_model.py", hub.home("alice") / "serve_model.py")
    nb = nbformat.read(str(root / "train_checkpoint.ipynb"), 4)
    r = hub.api("POST", "jobs", alice, json={"notebook_content": nb, "parameters": {
        "steps": 30, "step_seconds": 0, "model_file": "trained.json"}})
    trained = hub.wait_job(alice, r.json()["id"], {"succeeded"}, 120)
    val_acc = trained["metrics"]["val_acc"]
    assert [m["step"] for m in val_acc] == list(range(30)) and val_acc[-1]["value"] > 0.85, val_acc
    r = hub.api("POST", "jobs", alice, json={"script": "serve_model.py", "args": ["--model", "trained.json"],
                                             "kind": "inference"})
    assert r.status_code == 201, r.text
    job = wait_ready(hub, alice, r.json()["id"])
    info = call(hub, job, alice).json()
    assert info["job"] == trained["id"] and info["step"] == 30 and info["val_acc"] == val_acc[-1]["value"]
    y = call(hub, job, alice, "predict", method="POST", json={"x": [[-2, -2], [2, 2]]}).json()
    assert y["label"] == [0, 1] and y["p"][0] < 0.1 < 0.9 < y["p"][1]
    bad = call(hub, job, alice, "predict", method="POST", json={"x": [[1, 2, 3]]})
    assert bad.status_code == 400 and "2 numbers" in bad.json()["error"]
    # a run's newest checkpoint serves too (--checkpoints: a job stopped before its end)
    checkpoints = str(Path(hub.job_root) / trained["id"] / "checkpoints")
    r = hub.api("POST", "jobs", alice, json={"script": "serve_model.py", "args": ["--checkpoints", checkpoints],
                                             "kind": "inference"})
    from_checkpoint = wait_ready(hub, alice, r.json()["id"])
    assert call(hub, from_checkpoint, alice).json()["step"] == 30
    for j in (job, from_checkpoint):
        hub.api("DELETE", f"jobs/{j['id']}", alice)
