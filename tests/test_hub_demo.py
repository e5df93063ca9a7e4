"""`gpupool hub --demo`: the one-command embedded hub comes up, answers, and stops cleanly."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
GPUPOOL = str(Path(sys.executable).parent / "gpupool")


def _free_block(n: int = 4, lo: int = 18700, hi: int = 18990) -> int:
    """A base port with ``n`` consecutive free ports (the demo uses port .. port+3)."""
    for base in range(lo + (os.getpid() % 50) * 4, hi, 4):
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state, ppid, ..., starttime at [19])."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, it names one process for good
    (pids wrap: pid_max is 32768 here, so a pid alone may later be someone else's process)."""
    fields = _stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def _children(pid: int) -> dict[int, int]:
    """All descendants of ``pid`` (from /proc), each with its start time."""
    parents: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            fields = _stat(int(d))
            try:
                ppid = int(fields[1]) if fields else None
            except (IndexError, ValueError):
                continue
            if ppid is not None:
                parents.setdefault(ppid, []).append(int(d))
    out: dict[int, int] = {}
    todo = [pid]
    while todo:
        for c in parents.get(todo.pop(), []):
            started = _start_time(c)
            if c not in out and started is not None:
                out[c] = started
                todo.append(c)
    return out


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def _still_ours(pid: int, started: int) -> bool:
    """``pid`` is alive and is the very process recorded (same start time), not a reused pid."""
    return _alive(pid) and _start_time(pid) == started


def _kill_if_ours(pid: int, started: int) -> bool:
    """SIGKILL ``pid`` only if it is still the process recorded. The pidfd pins the process: once it
    is open and the start time matches, the signal cannot reach another process, even if the pid is
    reused meanwhile."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return False
    try:
        if not _still_ours(pid, started):
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def test_demo_config_declared_and_real_gpus(tmp_path):
    from gpupool.hub_ext import demo_config
    from gpupool.hub_ext.config import load
    from test_nvml import FakeNVML, device
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


class HubProcess:
    """``gpupool hub ...`` run in its own session with its output in a file; ``stop()`` sends what
    Ctrl-C sends, then kills whatever it left running (only processes recorded with their start time)."""

    def __init__(self, args: list[str], cwd: Path):
        self.log = open(cwd / "hub.log", "w+")
        self.proc = subprocess.Popen([GPUPOOL, "hub", *args], cwd=cwd, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.descendants: dict[int, int] = {}  # pid -> start time: what we may kill at the end
        self.rc: int | str | None = None
        self.leftovers: list[int] = []

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def wait_output(self, text: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while text not in (out := self.output()) and time.monotonic() < deadline and self.proc.poll() is None:
            self.descendants.update(_children(self.proc.pid))
            time.sleep(0.3)
        assert text in out, out[-3000:]
        return out

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # what Ctrl-C does
        try:
            self.rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session and group (start_new_session), not reaped yet
            self.proc.wait()
            self.rc = "killed"
        time.sleep(0.5)
        # the hub, its proxy, service and servers run in sessions of their own: kill each one left,
        # but only while it is provably the process recorded (pid + start time)
        self.leftovers = [p for p, started in self.descendants.items() if _still_ours(p, started)]
        for p in self.leftovers:
            _kill_if_ours(p, self.descendants[p])
        out = self.output()
        self.log.close()
        return out


@pytest.mark.hub
@pytest.mark.slow
def test_demo_hub_comes_up_and_stops(tmp_path):
    port = _free_block()
    hub = HubProcess(["--demo", "--port", str(port)], tmp_path)
    proc, descendants = hub.proc, hub.descendants
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            descendants.update(_children(proc.pid))
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
        descendants.update(_children(proc.pid))
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
    res = subprocess.run([GPUPOOL, "hub", "--config", cfg.name, "--port", str(_free_block(1))], capture_output=True,
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

    port = _free_block()
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
