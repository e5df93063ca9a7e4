"""The status bar's server extension (gpupool.lab): the line it computes, its handlers in a real
Jupyter server (reading a stand-in gpupool service with the server's own token), and the
TensorBoard launcher's links to the user's job logs."""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from gpupool.lab.status import short_model, status, workspace_share
from gpupool.lab.tensorboard import link_jobs
from gpupool.protocol import JobDir, gpu_env

from hub_harness import free_port  # noqa: E402

H100 = {"name": "box", "gpu_model": "NVIDIA H100 80GB HBM3",
        "gpus": [{"index": 0, "utilization": 43.4}, {"index": 1, "utilization": None}, {"index": 2, "utilization": 10}]}
JOBS = [{"id": "j-1", "user": "alice", "status": "queued"}, {"id": "j-2", "user": "alice", "status": "queued"},
        {"id": "j-3", "user": "alice", "status": "running"}, {"id": "j-4", "user": "alice", "status": "succeeded"},
        {"id": "j-5", "user": "bob", "status": "queued"}]


def _env(gpus, fraction, node="box"):
    """What the spawner hands a server: protocol.gpu_env of its placement."""
    return gpu_env({"node": node, "gpus": gpus, "fraction": fraction} if gpus else None)


def test_half_a_gpu_with_its_model_utilisation_and_the_users_jobs():
    s = status(_env([0], 0.5), JOBS, [H100], "alice")
    assert s["label"] == "GPU 0.5 H100 · 43% · 1 running · 2 queued"
    assert (s["gpus"], s["model"], s["queued"], s["running"], s["cpu_only"]) == (0.5, "NVIDIA H100 80GB HBM3", 2, 1, False)
    assert "box" in s["title"] and "H100" in s["title"]


def test_whole_gpus_average_their_readings_and_a_missing_reading_is_left_out():
    assert status(_env([0, 2], 1.0), [], [H100], "alice")["label"] == "GPU 2 H100 · 27%"
    s = status(_env([0, 1], 1.0), [], [H100], "alice")  # GPU 1 has no NVML reading
    assert s["label"] == "GPU 2 H100" and s["utilization"] is None


def test_cpu_only_workspace():
    env = _env([], 0)
    assert workspace_share(env)["amount"] == 0
    assert status(env, [], [H100], "alice")["label"] == "CPU only"
    assert status(env, JOBS, [H100], "bob")["label"] == "CPU only · 1 queued"
    assert status({}, [], [], None)["cpu_only"] is True  # a server gpupool did not start


def test_service_down_keeps_the_share_from_the_environment():
    s = status(_env([1], 0.25), user="alice", error="connection refused")
    assert s["label"] == "GPU 0.25 · pool unreachable" and "connection refused" in s["title"]


@pytest.mark.parametrize("model, short", [("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA A100-SXM4-80GB", "A100"),
                                          ("NVIDIA L4", "L4"), ("Tesla T4", "T4"), (None, ""), ("", "")])
def test_short_model(model, short):
    assert short_model(model) == short


# -- the handlers in a real Jupyter server -------------------------------------------------------
class _Service:
    """A stand-in gpupool service: answers jobs, nodes and queues, and records the tokens it saw."""

    def __init__(self):
        self.tokens: list[str] = []
        svc = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                svc.tokens.append(self.headers.get("Authorization", ""))
                path = self.path.split("?")[0].rsplit("/", 1)[-1]
                body = {"health": {"ok": True}, "jobs": {"jobs": JOBS}, "nodes": {"nodes": [H100]},
                        "queues": {"queues": [{"name": "vision", "deserved": {"gpu": 1}, "allocated": {"gpu": 0.5},
                                               "may_submit": True}]}}.get(path)
                data = json.dumps(body).encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/gpupool/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service():
    s = _Service()
    yield s
    s.close()


def _server(tmp_path, env_extra):
    port, token = free_port(), secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "JUPYTERHUB_"))}
    env.update({"JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
                "GPUPOOL_CLIENT_CONFIG": str(tmp_path / "none.json"), "JUPYTERHUB_USER": "alice", **env_extra})
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", f"--port={port}", "--ServerApp.port_retries=0",
         "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--ServerApp.jpserver_extensions=gpupool.lab=True", "--GPUPoolLab.cache_seconds=0"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "server.log", "wb"), start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    for _ in range(200):
        try:
            if requests.get(url + "api/status", params={"token": token}, timeout=1).ok:
                return proc, url, token
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            break
        threading.Event().wait(0.1)
    proc.kill()
    raise AssertionError((tmp_path / "server.log").read_text()[-3000:])


def _stop(proc):
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def test_handlers_read_the_service_with_the_servers_own_token(tmp_path, service):
    hub_token = "server-token-" + secrets.token_hex(4)
    proc, url, token = _server(tmp_path, {"GPUPOOL_URL": service.url, "JUPYTERHUB_API_TOKEN": hub_token,
                                          **_env([2], 0.5)})
    try:
        r = requests.get(url + "gpupool/status", params={"token": token}, timeout=10)
        assert r.status_code == 200, r.text
        s = r.json()
        assert s["label"] == "GPU 0.5 H100 · 10% · 1 running · 2 queued" and s["refresh"] > 0
        assert service.tokens and set(service.tokens) == {f"token {hub_token}"}
        r = requests.get(url + "gpupool/queue", params={"token": token}, timeout=10)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
        assert 'class="gpupool-queue-panel"' in r.text and "gpupool-queues" in r.text and "j-1" in r.text
        assert "j-5" not in r.text  # bob's job is not alice's
        # the handlers are the server's: no token, no answer
        assert requests.get(url + "gpupool/status", timeout=10).status_code == 403
    finally:
        _stop(proc)


def test_service_down_is_an_answer_not_an_error(tmp_path):
    proc, url, token = _server(tmp_path, {"GPUPOOL_URL": f"http://127.0.0.1:{free_port()}/services/gpupool/",
                                          "JUPYTERHUB_API_TOKEN": "t", **_env([], 0)})
    try:
        r = requests.get(url + "gpupool/status", params={"token": token}, timeout=30)
        assert r.status_code == 200 and r.json()["label"] == "CPU only · pool unreachable", r.text
        r = requests.get(url + "gpupool/queue", params={"token": token}, timeout=30)
        assert r.status_code == 200 and "could not be read" in r.text
    finally:
        _stop(proc)


# -- TensorBoard on the user's job logs ------------------------------------------------------------
def test_tensorboard_links_each_job_with_logs(tmp_path):
    root, logdir = tmp_path / "jobs", tmp_path / "tb"
    os.makedirs(JobDir.of(str(root), "j-1").tensorboard)
    os.makedirs(JobDir.of(str(root), "j-2").path)  # no TensorBoard logs: not linked
    assert link_jobs(str(logdir), str(root), [{"id": "j-1"}, {"id": "j-2"}, {"id": "../x"}]) == ["j-1"]
    assert os.readlink(logdir / "j-1") == JobDir.of(str(root), "j-1").tensorboard
    assert link_jobs(str(logdir), str(root), [{"id": "j-1"}]) == ["j-1"]  # idempotent
    assert sorted(os.listdir(logdir)) == ["j-1"]


def test_tensorboard_is_a_server_proxy_entry_point():
    from importlib.metadata import entry_points
    [ep] = [e for e in entry_points(group="jupyter_serverproxy_servers") if e.name == "tensorboard"]
    spec = ep.load()()
    assert spec["launcher_entry"]["title"] == "TensorBoard" and "{port}" in spec["command"]
