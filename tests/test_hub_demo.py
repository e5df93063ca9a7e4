"""`gpupool hub --demo`: the one-command embedded hub comes up, answers, and stops cleanly."""
from __future__ import annotations

import json
import os
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
    assert (tmp_path / ".gpupool-demo" / "homes" / "carol" / "demo.ipynb").is_file()


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
    port = _free_block()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = open(tmp_path / "hub.log", "w+")
    proc = subprocess.Popen([GPUPOOL, "hub", "--demo", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    descendants: dict[int, int] = {}  # pid -> start time: what we may kill at the end
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
        log.seek(0)
        out = log.read()
        assert status == 200, out[-3000:]
        assert 'name="password"' in page  # the dummy authenticator's login form
        # the banner names the URL and the logins
        deadline = time.monotonic() + 20
        while "demo hub is up" not in out and time.monotonic() < deadline:
            time.sleep(0.3)
            log.seek(0)
            out = log.read()
        assert f"http://127.0.0.1:{port}/" in out and "password: gpupool" in out and "carol" in out
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
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C does
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session and group (start_new_session), not reaped yet
            proc.wait()
            rc = "killed"
        time.sleep(0.5)
        # the hub, its proxy, service and servers run in sessions of their own: kill each one left,
        # but only while it is provably the process recorded (pid + start time)
        leftovers = [p for p, started in descendants.items() if _still_ours(p, started)]
        for p in leftovers:
            _kill_if_ours(p, descendants[p])
        log.seek(0)
        tail = log.read()[-3000:]
        log.close()
    assert rc == 0, tail
    assert not leftovers, f"processes left running: {leftovers}\n{tail}"
    # servers were stopped before the service, so alice's GPU was released, not left allocated
    assert "stopping 1 server(s)" in tail and "could not release" not in tail, tail
    assert "released workspace workspaces/alice" in tail, tail
