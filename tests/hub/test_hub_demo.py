"""`gpupool hub --demo`: the one-command embedded hub comes up, answers, and stops cleanly."""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from demo_process import GPUPOOL, HubProcess, free_port_block, process_tree

ROOT = Path(__file__).resolve().parents[2]


def test_demo_config_declared_and_real_gpus(tmp_path):
    from gpupool.hub_ext import demo_config
    from gpupool.hub_ext.config import load
    from nvml_standin import FakeNVML, device
    from traitlets.config.loader import PyFileConfigLoader

    assert demo_config.nodes_for("declared") == demo_config.DEMO_NODES
    # with GPUs found by NVML (a stand-in for the pynvml library: no GPU on this machine)
    real = demo_config.nodes_for("real", FakeNVML([device(0, "NVIDIA L4", 24 * 2**30), device(1, "NVIDIA L4", 24 * 2**30)]))
    assert real == [{"name": socket.gethostname(), "gpus": 2, "gpu_memory": 24 * 2**30, "gpu_model": "NVIDIA L4"}]
    # the written config is valid Python that JupyterHub and the gpupool service accept
    path = demo_config.write_demo(tmp_path / ".gpupool-demo", demo_config.DemoOptions(port=18950))
    cfg = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    assert cfg.JupyterHub.port == 18950 and cfg.GPUPool.port == 18953
    assert cfg.JupyterHub.spawner_class == "gpupool.spawner.LocalGPUSpawner"
    assert cfg.JupyterHub.tornado_settings["slow_spawn_timeout"] == 1
    settings = load(cfg, cwd=str(tmp_path))
    assert [q.name for q in settings.queues] == ["vision", "nlp"]
    assert sum(n.gpus for n in settings.nodes) == 8 and settings.access["vision"]["users"] == ["alice"]
    for name in ("demo.ipynb", "train.ipynb"):  # the welcome notebook and a checkpointing first job
        assert (tmp_path / ".gpupool-demo" / "homes" / "carol" / name).is_file()


def test_a_stray_proxy_is_stopped_and_nothing_else(tmp_path):
    """`gpupool hub` stops the proxy a hub that died at start-up left behind (its pid file), and
    only when that pid is still a configurable-http-proxy (its command line, read with psutil)."""
    from gpupool.hub_ext import cli

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    other = subprocess.Popen(sleeper)
    proxy = subprocess.Popen([*sleeper, cli.PROXY, "--port", "0"])
    import threading

    threading.Thread(target=proxy.wait, daemon=True).start()  # reaped at once, as init reaps a real stray
    # a real stray has been running a while: Popen returns as the exec begins, and until the new
    # program's arguments are laid out /proc shows an empty command line (on a loaded machine the
    # check below then read "" and left the proxy alone)
    deadline = time.monotonic() + 10
    while cli.PROXY not in " ".join(psutil.Process(proxy.pid).cmdline()) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        pid_file = tmp_path / "jupyterhub-proxy.pid"
        pid_file.write_text(str(other.pid))
        cli._stop_stray_proxy(tmp_path)
        assert other.poll() is None and pid_file.exists()  # not a proxy: left alone
        pid_file.write_text(str(proxy.pid))
        cli._stop_stray_proxy(tmp_path)
        assert proxy.wait(10) == -signal.SIGTERM and not pid_file.exists()
        cli._stop_stray_proxy(tmp_path)  # no pid file: nothing to do
    finally:
        for p in (other, proxy):
            p.kill()
            p.wait()


def test_cli_errors_are_messages(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run([GPUPOOL, "hub", "--demo", "--port", str(port)], capture_output=True, text=True,
                             cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in res.stderr, res.stderr
    res = subprocess.run([GPUPOOL, "hub"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and "give --demo" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([GPUPOOL, "hub", "--config", "nope.py"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and "nope.py does not exist" in res.stderr
    res = subprocess.run([GPUPOOL, "hub", "--demo", "--gpus", "real"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert res.returncode == 2 and "NVML finds no GPU" in res.stderr  # this machine has none


@pytest.mark.hub
@pytest.mark.slow
def test_demo_hub_comes_up_and_stops(tmp_path):
    port = free_port_block()
    hub = HubProcess(["--demo", "--port", str(port)], tmp_path)
    proc, descendants = hub.proc, hub.descendants
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            descendants.update(process_tree(proc.pid))
            try:
                with urllib.request.urlopen(f"{base}/hub/login", timeout=3) as r:
                    status = r.status
                    page = r.read().decode()
                if status == 200:
                    break
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        assert status == 200, hub.output()[-3000:]
        assert 'name="password"' in page  # the dummy authenticator's login form
        # the banner names the URL and the logins
        out = hub.wait_output("demo hub is up", 20)
        assert f"http://127.0.0.1:{port}/" in out and "password: gpupool" in out and "carol" in out
        assert f"http://127.0.0.1:{port}/services/gpupool/" in out  # the dashboard
        # log in as alice with the documented password: the hub redirects to her spawn page
        import requests

        with requests.Session() as s:
            s.get(f"{base}/hub/login", timeout=30)
            xsrf = s.cookies.get("_xsrf", path="/hub/")
            bad = s.post(f"{base}/hub/login", data={"username": "alice", "password": "wrong", "_xsrf": xsrf})
            assert "Invalid username or password" in bad.text
            r = s.post(f"{base}/hub/login", data={"username": "alice", "password": "gpupool", "_xsrf": xsrf},
                       timeout=30)
            assert r.status_code == 200 and r.url.endswith("/hub/spawn"), r.url
            assert 'name="gpus"' in r.text and 'option value="vision"' in r.text  # the GPU options form
            # alice starts a server with a GPU (it runs when the demo is stopped)
            xsrf = s.cookies.get("_xsrf", path="/hub/")
            r = s.post(f"{base}/hub/spawn", data={"gpus": "1", "queue": "vision", "_xsrf": xsrf},
                       allow_redirects=False)
            assert r.status_code == 302, r.text[:300]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                me = s.get(f"{base}/hub/api/users/alice", headers={"X-XSRFToken": xsrf}).json()
                if (me["servers"].get("") or {}).get("ready"):
                    break
                time.sleep(0.5)
            assert (me["servers"].get("") or {}).get("ready"), me
            # her first start opens JupyterLab on the welcome notebook (the demo's pre-spawn hook)
            lab = s.get(f"{base}/user/alice/", timeout=60)
            assert lab.url.endswith("/user/alice/lab/tree/demo.ipynb"), lab.url
            # the demo runs a distributed job: two workers of two GPUs each, started together
            token = s.post(f"{base}/hub/api/users/alice/tokens", headers={"X-XSRFToken": xsrf}, json={}).json()["token"]
            api = f"{base}/services/gpupool/api/v1/"
            auth = {"Authorization": f"token {token}"}
            job = s.post(api + "jobs", headers=auth, json={
                "command": ["python", "-c", "import os; print('worker', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])"],
                "pods": 2, "gpus": 2}).json()
            deadline = time.monotonic() + 90
            while job.get("status") not in ("succeeded", "failed") and time.monotonic() < deadline:
                time.sleep(0.5)
                job = s.get(api + f"jobs/{job['id']}", headers=auth).json()
            assert job["status"] == "succeeded", job
            assert "worker 1 of 2" in s.get(api + f"jobs/{job['id']}/log?rank=1", headers=auth).text
        # the first job needs no code: the home's train.ipynb, as the welcome notebook submits it
        from gpupool.client import Client

        alice = Client(base, token)
        job = alice.submit({"notebook": "train.ipynb", "gpus": 0.5, "parameters": {"steps": 3, "step_seconds": 0}})
        deadline = time.monotonic() + 90
        while alice.job(job["id"])["status"] not in ("succeeded", "failed") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert alice.job(job["id"])["status"] == "succeeded", alice.job(job["id"])["reason"]
        assert "finished 3 steps" in alice.log(job["id"])[0]
        # a job that cannot start (4 more GPUs within vision's quota of 4, while her server holds 1) is
        # still queued at Ctrl-C: the stop says which jobs outlive the hub
        waiting = alice.submit({"notebook": "train.ipynb", "gpus": 4, "preemptible": False})["id"]
        # the demo's files are where the docs say, with the example notebook in every home
        demo = tmp_path / ".gpupool-demo"
        assert (demo / "jupyterhub_config.py").is_file()
        for user in ("alice", "bob", "carol"):
            nb = json.loads((demo / "homes" / user / "demo.ipynb").read_text())
            assert nb["nbformat"] == 4
            assert (demo / "homes" / user / "ddp_train.py").is_file()  # the 2-worker example of docs/jobs.md
        # the gpupool service answers through the proxy
        with urllib.request.urlopen(f"{base}/services/gpupool/api/v1/health", timeout=10) as r:
            assert json.loads(r.read())["ok"] is True
        descendants.update(process_tree(proc.pid))
        assert descendants, "the hub runs as a child process"
    finally:
        out = hub.stop()
        tail = out[-3000:]
    assert hub.rc == 0, tail
    assert "Starting service 'idle-culler'" in out  # idle servers give their GPUs back
    # (the server stops first, so the job may get its GPU as the hub stops: it then runs on)
    assert re.search(rf"1 job not finished: {waiting} \((queued|starting|running)\)", out), out[-3000:]
    assert "the next start re-adopts them" in out
    assert not hub.leftovers, f"processes left running: {hub.leftovers}\n{tail}"
    # servers were stopped before the service, so alice's GPU was released, not left allocated
    assert "stopping 1 server(s)" in tail and "could not release" not in tail, tail
    assert "released workspace workspaces/alice" in tail, tail


BAD_CONFIG = """from gpupool.hub_ext import configure
c = get_config()  # noqa
configure(c)
c.GPUPool.queues = [{"name": "a", "deserved": {"gpu": 2}}, {"name": "b", "deserved": {"gpu": -1}}]
c.GPUPool.nodes = [{"name": "n", "gpus": 8}]
c.GPUPool.preemtion_grace = 3
c.GPUPool.kill_after = -2
"""


def test_config_check_prints_one_line_per_problem_and_runs_before_start(tmp_path):
    cfg = tmp_path / "jupyterhub_config.py"
    cfg.write_text(BAD_CONFIG)
    res = subprocess.run([GPUPOOL, "hub", "--config", cfg.name, "--check"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines() == [
        f"gpupool hub: {cfg.name}: c.GPUPool.preemtion_grace: no such setting (did you mean c.GPUPool.preemption_grace?)",
        f"gpupool hub: {cfg.name}: c.GPUPool.queues[1].deserved.gpu: must be >= 0",
        f"gpupool hub: {cfg.name}: c.GPUPool.kill_after: must be >= 0"]
    # the same check stops `gpupool hub` before JupyterHub starts (no traceback, nothing created)
    res = subprocess.run([GPUPOOL, "hub", "--config", cfg.name, "--port", str(free_port_block(1))], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)
    assert res.returncode == 1 and "no such setting" in res.stderr and "not starting JupyterHub" in res.stderr
    assert "Traceback" not in res.stderr and sorted(p.name for p in tmp_path.iterdir()) == [cfg.name]
    # over-committed quotas are a warning (the hub starts); a file that never calls configure(c) is an error
    tail = ("(over-committed: when every queue wants its share, the guarantees shrink in proportion and some get less "
            "than they deserve; the hub starts)")

    def warnings_of(queues: str) -> list[str]:
        cfg.write_text(BAD_CONFIG.replace('{"name": "a", "deserved": {"gpu": 2}}, {"name": "b", "deserved": {"gpu": -1}}',
                                          queues).replace("c.GPUPool.preemtion_grace = 3\n", "")
                       .replace("c.GPUPool.kill_after = -2\n", ""))
        res = subprocess.run([GPUPOOL, "hub", "--config", cfg.name, "--check"], capture_output=True, text=True,
                             cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == f"gpupool hub: {cfg.name}: the gpupool settings are fine"
        return res.stderr.splitlines()

    assert warnings_of('{"name": "a", "deserved": {"gpu": 2}}, {"name": "b", "deserved": {"gpu": 7}}') == [
        f"gpupool hub: warning: c.GPUPool.queues: the top-level queues deserve 9 GPUs but there are 8 {tail}"]
    # so are projects of a department that deserve more than the department (their guarantees shrink)
    assert warnings_of('{"name": "d", "deserved": {"gpu": 4}}, {"name": "p", "parent": "d", "deserved": {"gpu": 3}}, '
                       '{"name": "q", "parent": "d", "deserved": {"gpu": 3}}') == [
        f"gpupool hub: warning: c.GPUPool.queues: the children of 'd' deserve 6 GPUs in all, more than its 4 {tail}"]
    cfg.write_text("c = get_config()  # noqa\nc.JupyterHub.port = 8000\n")
    res = subprocess.run([GPUPOOL, "hub", "--config", cfg.name, "--check"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 1 and "does not call configure(c)" in res.stderr


@pytest.mark.hub
@pytest.mark.slow
def test_config_hub_listens_where_the_banner_says(tmp_path):
    """`gpupool hub --config FILE --port N` with a config naming no address: 127.0.0.1 only, as the
    banner and --help say; the start-up log has none of the old noise."""
    import psutil

    port = free_port_block()
    cfg = tmp_path / "jupyterhub_config.py"
    cfg.write_text(f"""from gpupool.hub_ext import configure
c = get_config()  # noqa
c.JupyterHub.hub_port = {port + 2}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{port + 1}"
c.JupyterHub.authenticator_class = "dummy"
c.GPUPool.port = {port + 3}
configure(c)
c.GPUPool.nodes = []
""")
    hub = HubProcess(["--config", cfg.name, "--port", str(port)], tmp_path)
    try:
        out = hub.wait_output("gpupool hub is up")
        assert f"gpupool hub is up: http://127.0.0.1:{port}/" in out
        listening = {c.laddr.ip for c in psutil.net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        assert listening == {"127.0.0.1"}, listening
    finally:
        out = hub.stop()
    assert hub.rc == 0 and not hub.leftovers, out[-3000:]
    for noise in ("404 GET /hub/health", "ECONNREFUSED", "Non-jsonable data", "Ignoring unrecognized key"):
        assert noise not in out, noise


@pytest.mark.parametrize("doc, heading", [("README.md", "## For admins"), ("docs/hub.md", "## Set-up")])
def test_the_documented_admin_configs_pass_the_check(tmp_path, doc, heading):
    """The jupyterhub_config.py examples of the README and docs/hub.md, as written."""
    text = (ROOT / doc).read_text()
    block = text[text.index(heading):].split("```python\n", 1)[1].split("```", 1)[0]
    cfg = tmp_path / "jupyterhub_config.py"
    cfg.write_text(block)
    res = subprocess.run([GPUPOOL, "hub", "--config", cfg.name, "--check"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == "", res.stderr
