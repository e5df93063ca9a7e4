"""The Python client: configuration discovery, error mapping, log_metric, and jobs against the real hub."""
from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import requests

import gpupool
from gpupool.client import api, config
from gpupool.client.jobs import build_body, metrics_of
from hub_harness import dead_port


# -- pure ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("given, expected", [
    ("http://hub:8000", "http://hub:8000/services/gpupool/api/v1/"),
    ("http://hub:8000/", "http://hub:8000/services/gpupool/api/v1/"),
    ("https://hub.example.org/jhub/hub/", "https://hub.example.org/jhub/services/gpupool/api/v1/"),
    ("http://127.0.0.1:8081/hub/api", "http://127.0.0.1:8081/services/gpupool/api/v1/"),
    ("http://127.0.0.1:10101/services/gpupool/", "http://127.0.0.1:10101/services/gpupool/api/v1/"),
    ("http://x/services/gpupool/api/v1", "http://x/services/gpupool/api/v1/"),
    ("hub:8000", "http://hub:8000/services/gpupool/api/v1/"),
])
def test_api_base_normalises_hub_service_and_api_urls(given, expected):
    assert config.api_base(given) == expected


def test_resolution_order(tmp_path, monkeypatch):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"url": "http://from-file:1", "token": "file-token"}))
    env = {"GPUPOOL_CLIENT_CONFIG": str(cfg)}
    monkeypatch.setenv("GPUPOOL_CLIENT_CONFIG", str(cfg))
    c = config.resolve(env=env)
    assert (c.url, c.token) == ("http://from-file:1/services/gpupool/api/v1/", "file-token")
    assert c.url_source == str(cfg)
    env.update(GPUPOOL_URL="http://from-env:2", GPUPOOL_TOKEN="env-token")
    c = config.resolve(env=env)
    assert (c.url, c.token, c.url_source) == ("http://from-env:2/services/gpupool/api/v1/", "env-token", "GPUPOOL_URL")
    c = config.resolve(url="http://arg:3/", token="arg-token", env=env)
    assert (c.url, c.token, c.token_source) == ("http://arg:3/services/gpupool/api/v1/", "arg-token", "argument")


def test_single_user_server_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPOOL_CLIENT_CONFIG", str(tmp_path / "absent.json"))
    env = {"JUPYTERHUB_API_URL": "http://127.0.0.1:8081/jhub/hub/api", "JUPYTERHUB_BASE_URL": "/jhub/",
           "JUPYTERHUB_API_TOKEN": "server-token", "JUPYTERHUB_SERVICE_PREFIX": "/jhub/user/alice/"}
    c = config.resolve(env=env)
    assert c.url == "http://127.0.0.1:8081/jhub/services/gpupool/api/v1/"
    assert c.token == "server-token" and c.token_source == "JUPYTERHUB_API_TOKEN"
    env["JUPYTERHUB_PUBLIC_HUB_URL"] = "https://hub.example.org/jhub/hub/"
    assert config.resolve(env=env).url == "https://hub.example.org/jhub/services/gpupool/api/v1/"
    # inside a job the service's own URL/token win over the server's
    env.update(GPUPOOL_API_URL="http://127.0.0.1:10101/services/gpupool/api/v1/", GPUPOOL_API_TOKEN="job-token")
    c = config.resolve(env=env)
    assert (c.url, c.token) == ("http://127.0.0.1:10101/services/gpupool/api/v1/", "job-token")


def test_no_configuration_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPOOL_CLIENT_CONFIG", str(tmp_path / "absent.json"))
    with pytest.raises(config.ConfigError, match="gpupool.connect"):
        config.resolve(env={})
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    monkeypatch.setenv("GPUPOOL_CLIENT_CONFIG", str(bad))
    with pytest.raises(config.ConfigError, match="bad.json is not valid JSON"):
        config.resolve(env={})


def test_connection_refused_names_the_url():
    port = dead_port()
    with pytest.raises(gpupool.ConnectionFailed) as e:
        gpupool.connect(url=f"http://127.0.0.1:{port}", token="t")
    assert f"127.0.0.1:{port}" in str(e.value) and "connection refused" in str(e.value)
    assert isinstance(e.value, gpupool.GPUPoolError)


def _response(status: int, body, url="http://h/services/gpupool/api/v1/jobs") -> requests.Response:
    r = requests.Response()
    r.status_code = status
    r.url = url
    r._content = json.dumps(body).encode() if not isinstance(body, bytes) else body
    r.headers["Content-Type"] = "application/json"
    return r


def test_error_mapping_keeps_message_and_field():
    e = api.error_from_response(_response(400, {"status": 400, "message": "gpus: must be > 0", "field": "gpus"}))
    assert isinstance(e, gpupool.BadRequest) and e.field == "gpus" and str(e) == "gpus: must be > 0"
    e = api.error_from_response(_response(403, {"status": 403, "message": "queue vision: exceeds its limit of 4 GPU"}))
    assert isinstance(e, gpupool.QuotaError) and isinstance(e, gpupool.Forbidden)
    assert isinstance(api.error_from_response(_response(404, {"message": "no job j-9"})), gpupool.NotFound)
    assert isinstance(api.error_from_response(_response(401, {"message": "unauthorized"})), gpupool.Unauthorized)
    e = api.error_from_response(_response(502, b"<html>bad gateway</html>"))
    assert isinstance(e, gpupool.ServiceError) and "<html>" not in str(e)


def test_build_body_validates_locally():
    with pytest.raises(gpupool.GPUPoolError, match="exactly one"):
        build_body()
    with pytest.raises(gpupool.GPUPoolError, match="not a .ipynb notebook or a .py script"):
        build_body("train.sh")
    assert build_body("no/such/train.py", args=["--lr", 1]) == {"script": "no/such/train.py", "args": ["--lr", "1"]}
    assert build_body(["python", "-m", "m"], pods=2) == {"command": ["python", "-m", "m"], "pods": 2}
    with pytest.raises(gpupool.GPUPoolError, match="args"):
        build_body("train.ipynb", args=["x"])
    body = build_body("sub/train.ipynb", gpus=0.5, parameters={"lr": 1e-3}, queue="vision", kind="train")
    assert body == {"notebook": "sub/train.ipynb", "parameters": {"lr": 0.001}, "gpus": 0.5, "queue": "vision",
                    "kind": "train"}
    nb = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    assert build_body(notebook_content=nb)["notebook_content"] == nb


def test_a_local_notebook_file_is_sent_as_content(tmp_path, monkeypatch):
    nb = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.ipynb").write_text(json.dumps(nb))
    (tmp_path / "broken.ipynb").write_text("{oops")
    monkeypatch.chdir(tmp_path)
    assert build_body("sub/train.ipynb", gpus=0.5) == {"notebook_content": nb, "name": "train", "gpus": 0.5}
    assert build_body(tmp_path / "sub" / "train.ipynb", name="mine")["name"] == "mine"
    assert build_body("elsewhere/train.ipynb") == {"notebook": "elsewhere/train.ipynb"}  # a path on the hub
    with pytest.raises(gpupool.GPUPoolError, match="broken.ipynb is not a readable Jupyter notebook"):
        build_body("broken.ipynb")
    with pytest.raises(gpupool.GPUPoolError, match=f"no file {tmp_path}/gone.ipynb on this machine"):
        build_body(str(tmp_path / "gone.ipynb"))


def test_request_and_status_in_words():
    from gpupool.client.jobs import request_text, status_line

    assert [request_text(j) for j in ({"gpus": 0.5}, {"gpus": 2}, {"gpus": 1}, {"gpu_memory": 8 * 2**30},
                                      {"gpu_memory": "8Gi"}, {"gpus": 0}, {})] == [
        "0.5 GPU", "2 GPUs", "1 GPU", "8Gi of one GPU", "8Gi of one GPU", "0 GPUs (CPU only)", "0 GPUs (CPU only)"]
    assert request_text({"gpus": 4, "pods": 2}) == "2 workers x 4 GPUs"
    assert status_line({"status": "succeeded", "reason": "succeeded: the notebook ran to the end"}) == \
        "succeeded: the notebook ran to the end"
    assert status_line({"status": "failed", "reason": "failed"}) == "failed"
    assert status_line({"status": "queued", "reason": "queued in vision: position 2"}) == "queued in vision: position 2"
    assert status_line({"status": "running", "reason": "on box"}) == "running: on box"
    job = gpupool.Job({"id": "j-000001", "name": "train", "gpus": 0.5, "status": "queued", "reason": "waiting"})
    assert repr(job) == "<Job j-000001 train (0.5 GPU) queued: waiting>"


def test_metrics_of_sorts_by_step():
    raw = {"loss": [{"step": 2, "value": 0.5, "t": "x"}, {"step": 1, "value": 0.9}]}
    assert metrics_of(raw) == {"loss": [(1, 0.9), (2, 0.5)]}


def test_log_metric_outside_a_job_warns_and_noops(monkeypatch):
    from gpupool.client import metrics
    monkeypatch.delenv("GPUPOOL_JOB_ID", raising=False)
    monkeypatch.setattr(metrics, "_warned_outside", False)
    with pytest.warns(RuntimeWarning, match="not running inside a gpupool job"):
        assert gpupool.log_metric("val_acc", 0.5, step=1) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpupool.log_metric("val_acc", 0.6) is False  # warned once only
    with pytest.raises(TypeError, match="must be a number"):
        gpupool.log_metric("val_acc", "high")


def test_import_gpupool_scheduler_stays_cheap():
    code = ("import sys, gpupool.scheduler, gpupool; "
            "heavy = [m for m in ('requests', 'optuna', 'ipywidgets', 'gpupool.client') if m in sys.modules]; "
            "assert not heavy, heavy; gpupool.submit; assert 'gpupool.client' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- against the real hub ------------------------------------------------------------------------
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import nbformat  # noqa: E402

from hub_harness import Hub, notebook  # noqa: E402

@pytest.fixture(scope="module")
def alice(hub):
    """A client for alice through the proxy, as a user outside the hub would connect."""
    return api.Client(hub.hub_url, hub.token("alice"))


@pytest.fixture
def connected(hub, alice):
    api._reset_default()
    gpupool.connect(url=alice.url, token=alice.token)
    yield alice
    api._reset_default()


@pytest.mark.hub
@pytest.mark.slow
def test_submit_wait_logs_output_metrics(connected, hub):
    job = gpupool.submit("tiny.ipynb", gpus=0.5, parameters={"lr": 0.25, "steps": 4}, queue="vision")
    assert job.id.startswith("j-") and job.data["kind"] == "train" and job.data["gpus"] == 0.5
    sleeper = gpupool.submit("sleepy.ipynb", gpu_memory="8Gi", kind="inference", priority=10)
    assert job.wait(timeout=180, progress=False) is job
    assert job.status == "succeeded", (job.reason, job.logs())
    assert job.reason  # a sentence for people
    assert job.metrics == {"acc": [(0, 0.0), (1, 0.25), (2, 0.5), (3, 0.75)]}
    assert job.metric("acc") == 0.75 and job.metric("loss") is None and job.metric("loss", 0) == 0
    assert "Executing" in job.logs() and "trained with lr 0.25" in job.logs()
    out = job.output()
    assert isinstance(out, nbformat.NotebookNode)
    assert "trained with lr 0.25" in "".join(o.get("text", "") for c in out.cells for o in c.get("outputs", []))
    again = gpupool.Job(job.id)
    assert again.status == "succeeded" and again.data["parameters"] == {"lr": 0.25, "steps": 4}
    assert job.id in [j.id for j in gpupool.jobs(status="succeeded")]
    # the running one: visible with an allocation, then cancelled
    hub.wait_job(connected.token, sleeper.id, {"running"}, timeout=60)
    assert sleeper.refresh().allocation and sleeper.data["kind"] == "inference"
    assert sleeper.cancel().status in ("cancelled", "preempting", "running")
    sleeper.wait(timeout=60, progress=False)
    assert sleeper.status == "cancelled" and sleeper.reason
    with pytest.raises(gpupool.NotFound) as e:
        gpupool.Job("j-999999")
    assert "j-999999" in str(e.value)


@pytest.mark.hub
def test_service_errors_surface_with_message_and_field(connected, hub):
    with pytest.raises(gpupool.BadRequest) as e:
        gpupool.submit("tiny.ipynb", gpus=-1)
    assert e.value.field == "gpus" and "gpus" in str(e.value)
    with pytest.raises(gpupool.BadRequest) as e:
        gpupool.submit("tiny.ipynb", queue="nope")
    assert e.value.field == "queue" and "nope" in str(e.value)
    with pytest.raises(gpupool.GPUPoolError) as e:
        gpupool.submit("tiny.ipynb", gpus=0.5, queue="nlp")  # bob's queue, not alice's
    assert isinstance(e.value, gpupool.Forbidden) and "nlp" in str(e.value)
    with pytest.raises(gpupool.Unauthorized):
        api.Client(hub.hub_url, "not-a-token").queues()
    no_scope = api.Client(hub.api_url, hub.token("alice", scopes=["read:users:name!user"]))
    with pytest.raises(gpupool.Forbidden):
        no_scope.queues()


@pytest.mark.hub
def test_queues_nodes_and_in_memory_notebook(connected, hub):
    qs = {q["name"]: q for q in gpupool.queues()}
    assert qs["vision"]["may_submit"] and not qs["nlp"]["may_submit"]
    nodes = {n["name"]: n for n in gpupool.nodes()}
    assert len(nodes["box"]["gpus"]) == 2 and len(nodes["box2"]["gpus"]) == 1
    nb = notebook("import gpupool\ngpupool.log_metric('x', 1.5, step=0)")
    job = gpupool.submit(notebook_content=nb, gpus=0.25, name="inline")
    assert job.data["name"] == "inline" and job.local_notebook is None
    job.cancel()


@pytest.mark.hub
def test_submit_a_local_notebook_file(connected, hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nbformat.write(nbformat.from_dict(notebook("print('from the laptop')")), "laptop.ipynb")
    job = gpupool.submit("laptop.ipynb", gpus=0.25)
    assert job.local_notebook == tmp_path / "laptop.ipynb"
    assert job.data["name"] == "laptop" and job.data["notebook"] is None
    job.cancel()
    with pytest.raises(gpupool.BadRequest) as e:
        gpupool.submit("missing.ipynb")
    assert "working directory on the hub" in str(e.value) and "nor is it a file on this machine" in str(e.value)


@pytest.mark.hub
def test_single_user_server_environment_finds_the_service(hub, monkeypatch, tmp_path):
    """With only the variables JupyterHub gives a server, the client finds the service and the token."""
    for k in ("GPUPOOL_URL", "GPUPOOL_TOKEN", "GPUPOOL_API_URL", "GPUPOOL_API_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("GPUPOOL_CLIENT_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.setenv("JUPYTERHUB_API_URL", hub.hub_api_url)
    monkeypatch.setenv("JUPYTERHUB_BASE_URL", "/")
    monkeypatch.setenv("JUPYTERHUB_PUBLIC_HUB_URL", hub.hub_url + "hub/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.token("alice"))
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice/")
    c = api.Client.from_env()
    assert c.url == hub.proxy_api_url and c.url_source == "JUPYTERHUB_PUBLIC_HUB_URL"
    assert any(q["name"] == "vision" for q in c.queues())
    # what the gpupool spawner adds: GPUPOOL_URL (the service's own address), the token stays the server's
    monkeypatch.setenv("JUPYTERHUB_PUBLIC_HUB_URL", "")
    monkeypatch.setenv("GPUPOOL_URL", hub.service_url)
    c = api.Client.from_env()
    assert c.url == hub.api_url and c.url_source == "GPUPOOL_URL"
    job = gpupool.submit("tiny.ipynb", gpus=0.25, client=c)
    assert job.data["user"] == "alice"
    job.cancel()


@pytest.mark.hub
@pytest.mark.slow
def test_the_demo_welcome_notebook_runs_as_written(hub, tmp_path):
    """examples/demo.ipynb, executed top to bottom in a home that has train.ipynb (as the demo's)."""
    import os
    import shutil

    import papermill

    root = Path(__file__).resolve().parents[2]
    shutil.copy(root / "examples" / "train_checkpoint.ipynb", tmp_path / "train.ipynb")
    token = hub.token("alice")
    env = {"GPUPOOL_URL": hub.hub_url, "GPUPOOL_TOKEN": token, "GPUPOOL_CLIENT_CONFIG": str(tmp_path / "none.json")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits them
    try:
        out = papermill.execute_notebook(str(root / "examples" / "demo.ipynb"), str(tmp_path / "out.ipynb"),
                                         cwd=str(tmp_path), kernel_name="python3", progress_bar=False)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    text = "".join(o.get("text", "") for c in out.cells for o in c.get("outputs", []))
    assert "vision" in text and "you may submit: True" in text
    assert "vision     deserved 2 GPUs" in text  # (summed over its node pools: here the one, default)
    job_id = next(w for w in text.split() if w.startswith("j-"))
    job = api.Client(hub.hub_url, token).job(job_id)
    assert job["name"] == "train" and job["parameters"] == {"steps": 60}
    api.Client(hub.hub_url, token).cancel(job_id)
