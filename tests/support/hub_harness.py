"""A real JupyterHub + configurable-http-proxy + the gpupool service, for tests. Stable API.

Usage::

    from hub_harness import Hub

    with Hub(tmp_path, gpupool={"nodes": [{"name": "box", "gpus": 2}],
                                "queues": [{"name": "vision", "deserved": {"gpu": 1}, "users": ["alice"]}]},
             users=["alice", "bob"], admins=["admin"], groups={"cv": ["alice"]}) as hub:
        tok = hub.token("alice")                          # JupyterHub API token (inherits alice's scopes)
        r = hub.api("POST", "jobs", tok, json={...})      # requests.Response, direct to the service
        r = hub.api("GET", "jobs", tok, via_proxy=True)   # the same through the proxy
        job = hub.wait_job(tok, r.json()["id"], {"succeeded"})

``Hub(tmp_path, gpupool=None, users=("alice", "bob"), admins=("admin",), groups=None,
extra_config="", managed=True, start_timeout=90)``

* ``gpupool``: ``c.GPUPool`` settings (a dict of trait -> value). The harness sets, unless given:
  ``db_url`` and ``job_root`` under ``tmp_path``, ``work_dir = <tmp_path>/home/{user}`` (each
  user's home is created), ``run_as_user = False``, ``cycle_seconds = 0.5``, ``preemption_grace =
  3``, ``kill_after = 2``, ``nodes = []`` (no GPUs) and ``port`` (a free port).
* ``extra_config``: Python appended to ``jupyterhub_config.py`` after ``configure(c)`` (``c`` is
  the config), e.g. ``"c.JupyterHub.spawner_class = 'simple'"``.
* ``managed``: True = JupyterHub starts the service (``configure(c)`` as an admin would use it).
  False = the harness starts the service itself (the hub sees it as an external service) so a
  test can kill and restart it quickly: JupyterHub itself restarts a dead managed service only
  on its 30 s poll.

Attributes: ``hub_url`` (public, through the proxy, ends in ``/``), ``hub_api_url``
(``.../hub/api``), ``service_url`` (direct, ``http://127.0.0.1:PORT/services/gpupool/``),
``api_url`` (``service_url + "api/v1/"``), ``proxy_api_url`` (the API through the proxy),
``admin_token`` (a JupyterHub admin's token that inherits all its scopes), ``service_token``
(the gpupool service's own token, admin scope: what the spawner uses), ``job_root``,
``config_file``, ``dir`` (the hub's working directory), ``ports``.

Methods:

* ``home(user) -> Path``: the user's working directory (jobs run there).
* ``token(user, scopes=None, note="test") -> str``: a new JupyterHub token for ``user``;
  ``scopes=None`` inherits all of the user's scopes, a list restricts them (e.g.
  ``["read:users:name!user"]`` for a token without any gpupool scope).
* ``api(method, path, token=None, json=None, via_proxy=False, **kw) -> requests.Response``:
  ``path`` is relative to ``api/v1/`` (e.g. ``"jobs/j-000001/log"``).
* ``hub_api(method, path, token=None, **kw)``: JupyterHub's own REST API (admin token by default).
* ``wait_job(token, job_id, statuses, timeout=60) -> dict``: poll until the job's status is in
  ``statuses`` (raises ``AssertionError`` with the job on timeout).
* ``wait_for(predicate, timeout=30, interval=0.2, message="")``: poll a callable until truthy.
* ``service_pid() -> int | None``, ``kill_service(sig=SIGKILL, timeout=10)``,
  ``start_service()`` (unmanaged only), ``restart_service()`` (unmanaged: kill -9 and start).
* ``job_pids() -> list[int]``: live processes of this hub's jobs (by their environment).
* (module) ``children(parent, command) -> list[int]``: live children of a process whose command
  line contains ``command`` (e.g. the service's scheduling worker: ``children(hub.service_pid(),
  "spawn_main")``).
* (module) ``ledger(hub, job_id) -> list[dict]``: the usage records of one job, from the hub's database.
* (module) ``free_port()``, ``free_ports(n)``, ``dead_port()``: a free port to listen on; n distinct ones;
  a port where nothing listens.
* ``hub_log() -> str``, ``service_log() -> str`` (unmanaged: the service's own output; managed:
  it is in the hub log).
* ``stop()``: stops the hub, the proxy, the service and every job process; also on ``__exit__``.
* ``leftover_processes() -> list[str]``: processes this hub started that are still alive
  (``[]`` after ``stop()``).

Leak check: every process the harness starts carries ``GPUPOOL_TEST_HUB=<random id>`` in its
environment (JupyterHub hands its own environment to configurable-http-proxy), and the harness
records each process it knows it started (the hub, the service, the proxy from JupyterHub's
``jupyterhub-proxy.pid``) with its start time, so a reused pid is never mistaken for one of ours.
``stop()`` kills only those. The autouse fixtures ``hub_leak_check`` (after each test; a module
that starts hubs imports it: ``from hub_harness import Hub, hub_leak_check  # noqa: F401``) and
``hub_leak_check_session`` (after the last test; registered once in tests/conftest.py) fail when a
stopped hub left a process running, or a hub was never stopped. A session-scoped hub fixture must
request ``hub_leak_check_session`` so that pytest stops it before the final check.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import psutil
import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CHP_BIN = ROOT / "node_modules" / ".bin"


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports. Each socket stays bound until all are chosen: ports picked one
    after another, each closed at once, can repeat (a CI run once gave the hub and the proxy's API
    the same port, and the hub could not bind)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def dead_port() -> int:
    """A port where nothing listens (it was free a moment ago)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return port


def _environ(pid: int) -> bytes:
    """The process's environment as ``K=V`` entries joined by NULs (b"" when gone or not readable)."""
    try:
        env = psutil.Process(pid).environ()
    except psutil.Error:
        return b""
    return "\0".join(f"{k}={v}" for k, v in env.items()).encode(errors="replace") + b"\0"


def _cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def _pids() -> list[int]:
    return psutil.pids()


def _ppid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def children(parent: int, command: str) -> list[int]:
    """Live child processes of ``parent`` whose command line contains ``command``."""
    return [pid for pid in _pids() if command in _cmdline(pid) and _ppid(pid) == parent and _alive(pid)]


def _start_time(pid: int) -> float | None:
    """Start time of ``pid``; with the pid it names one process for good."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _signal_if_same(pid: int, started: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only while it is the process that started at ``started``: the pidfd
    pins the process, so a pid reused after the check cannot be hit."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if _start_time(pid) != started or not _alive(pid):
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


MARKER_VAR = "GPUPOOL_TEST_HUB"
_HUBS: list["Hub"] = []  # every Hub started in this test process (for the leak check)


def _default_signals() -> None:
    """In a hub's process before it runs: SIGINT and SIGQUIT at their defaults, as the launcher
    sets them (a suite started in the background has them ignored, and the hub's managed services
    would inherit that and outlive the hub's stop)."""
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


class Hub:
    def __init__(self, tmp_path: Any, gpupool: dict | None = None, users: Iterable[str] = ("alice", "bob"),
                 admins: Iterable[str] = ("admin",), groups: dict[str, list[str]] | None = None,
                 extra_config: str = "", managed: bool = True, start_timeout: float = 90.0):
        self.dir = Path(tmp_path) / "hub"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.users = list(users)
        self.admins = list(admins)
        self.groups = dict(groups or {})
        self.managed = managed
        self.start_timeout = start_timeout
        self.ports = dict(zip(("public", "hub", "proxy_api", "service"), free_ports(4)))
        self.job_root = str(self.dir / "jobs")
        self.marker = secrets.token_hex(12)
        self._started: dict[int, tuple[float, str]] = {}  # pid -> (start time, what) of what we started
        self.stopped = False
        self._leak_checked = False
        self.harness_token = secrets.token_hex(24)
        self.service_token = secrets.token_hex(24)
        settings = {
            "db_url": f"sqlite:///{self.dir / 'gpupool.sqlite'}", "job_root": self.job_root,
            "work_dir": str(Path(tmp_path) / "home" / "{user}"), "run_as_user": False, "cycle_seconds": 0.5,
            "preemption_grace": 3.0, "kill_after": 2.0, "nodes": [],
        }
        settings.update(gpupool or {})
        settings["port"] = self.ports["service"]
        settings["api_token"] = self.service_token
        self.settings = settings
        self._home_root = Path(tmp_path) / "home"
        for u in {*self.users, *self.admins}:
            self.home(u).mkdir(parents=True, exist_ok=True)
        self.hub_url = f"http://127.0.0.1:{self.ports['public']}/"
        self.hub_api_url = f"http://127.0.0.1:{self.ports['hub']}/hub/api"
        self.service_url = f"http://127.0.0.1:{self.ports['service']}/services/gpupool/"
        self.api_url = self.service_url + "api/v1/"
        self.proxy_api_url = self.hub_url + "services/gpupool/api/v1/"
        self.config_file = self.dir / "jupyterhub_config.py"
        self.config_file.write_text(self._config_text(extra_config))
        self._hub: subprocess.Popen | None = None
        self._service: subprocess.Popen | None = None
        self._service_log = self.dir / "service.log"
        self.admin_token = ""
        self.session = requests.Session()

    # ------------------------------------------------------------------ config
    def _config_text(self, extra: str) -> str:
        groups = {g: {"users": list(m)} for g, m in self.groups.items()}
        unmanaged = "" if self.managed else (
            "for _s in c.JupyterHub.services:\n"
            "    if _s['name'] == 'gpupool':\n"
            "        _s.pop('command', None); _s.pop('environment', None)\n")
        return f"""# written by tests/support/hub_harness.py
import json
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {self.ports['public']}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {self.ports['hub']}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.ports['proxy_api']}"
c.ConfigurableHTTPProxy.should_start = True
c.JupyterHub.db_url = "sqlite:///{self.dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = "{self.dir / 'jupyterhub_cookie_secret'}"
c.JupyterHub.pid_file = "{self.dir / 'jupyterhub.pid'}"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = set({self.users!r})
c.Authenticator.admin_users = set({self.admins!r})
c.JupyterHub.load_groups = {groups!r}
c.JupyterHub.services = [{{"name": "harness", "api_token": "{self.harness_token}"}}]
c.JupyterHub.load_roles = [{{"name": "harness", "scopes": ["admin:users", "tokens", "admin:groups", "read:users"],
                             "services": ["harness"]}}]
c.JupyterHub.cleanup_servers = True
c.GPUPool.port = {self.ports['service']}
c.GPUPool.api_token = "{self.service_token}"
from gpupool.hub_ext import configure
configure(c)
for _k, _v in json.loads({json.dumps(json.dumps(self.settings))}).items():
    setattr(c.GPUPool, _k, _v)
{extra}
{unmanaged}"""

    def home(self, user: str) -> Path:
        return self._home_root / user

    # ------------------------------------------------------------------ lifecycle
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{VENV_BIN}:{CHP_BIN}:{env.get('PATH', '/usr/bin:/bin')}"
        env.pop("JUPYTERHUB_API_TOKEN", None)
        env.pop("GPUPOOL_CONFIG", None)
        env[MARKER_VAR] = self.marker  # inherited by configurable-http-proxy (JupyterHub copies its environment)
        return env

    def _record(self, pid: int | None, what: str) -> None:
        started = _start_time(pid) if pid else None
        if pid and started is not None and pid not in self._started:
            self._started[pid] = (started, what)

    def _record_proxy(self) -> None:
        """The proxy JupyterHub started, from its pid file (JupyterHub leaves it behind when it dies
        at start-up, e.g. when a managed service fails to start)."""
        try:
            pid = int((self.dir / "jupyterhub-proxy.pid").read_text().strip())
        except (OSError, ValueError):
            return
        if f"{MARKER_VAR}={self.marker}".encode() in _environ(pid):
            self._record(pid, "configurable-http-proxy")

    def own_processes(self) -> dict[int, tuple[float, str]]:
        """Live processes this hub started: pid -> (start time, description). Found by the marker in
        their environment, by the hub's directory in it (the managed service, job processes), and
        by the pids recorded at start (checked against their start time)."""
        out: dict[int, tuple[float, str]] = {}
        tag = f"{MARKER_VAR}={self.marker}".encode()
        here = f"{self.dir}".encode()
        for pid in _pids():
            if pid == os.getpid():
                continue
            env = _environ(pid)
            if (tag in env or here in env) and _alive(pid):
                started = _start_time(pid)
                if started is not None:
                    out[pid] = (started, _cmdline(pid)[:200])
        for pid, (started, what) in self._started.items():
            if pid not in out and _alive(pid) and _start_time(pid) == started:
                out[pid] = (started, f"{what}: {_cmdline(pid)[:200]}")
        return out

    def leftover_processes(self) -> list[str]:
        return [f"{pid} {what}" for pid, (_, what) in sorted(self.own_processes().items())]

    def start(self) -> "Hub":
        if self not in _HUBS:
            _HUBS.append(self)
        self.stopped = self._leak_checked = False
        if not self.managed:
            self.start_service()
        self._hub_log_f = open(self.dir / "hub.log", "ab")
        self._hub = subprocess.Popen([str(VENV_BIN / "jupyterhub"), "-f", str(self.config_file)], cwd=self.dir,
                                     env=self._env(), stdout=self._hub_log_f, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_default_signals)
        self._record(self._hub.pid, "jupyterhub")
        try:
            self.wait_for(self._hub_up, self.start_timeout, message="JupyterHub did not come up")
            self.wait_for(self._service_up, self.start_timeout, message="the gpupool service did not come up")
            self.wait_for(self._proxy_routes_service, self.start_timeout,
                          message="the proxy never routed /services/gpupool/")
            self._record_proxy()
            self._record(self.service_pid(), "gpupool service")
            # a real admin's token, inheriting everything the admin holds
            self.admin_token = self.token(self.admins[0]) if self.admins else ""
        except BaseException:
            self.stop()
            raise
        return self

    def _hub_up(self) -> bool:
        if self._hub is not None and self._hub.poll() is not None:
            raise AssertionError(f"JupyterHub exited with {self._hub.returncode}:\n{self.hub_log()[-4000:]}")
        try:
            return self.session.get(self.hub_api_url + "/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def _service_up(self) -> bool:
        if self._service is not None and self._service.poll() is not None:
            raise AssertionError(f"the gpupool service exited with {self._service.returncode}:\n"
                                 f"{self.service_log()[-4000:]}")
        try:
            return self.session.get(self.api_url + "health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def _proxy_routes_service(self) -> bool:
        try:
            r = self.session.get(self.proxy_api_url + "health", timeout=2)
        except requests.RequestException:
            return False
        return r.status_code == 200 and r.headers.get("Content-Type", "").startswith("application/json")

    def service_environment(self) -> dict[str, str]:
        from traitlets.config.loader import PyFileConfigLoader

        from gpupool.hub_ext.config import load, to_json

        cfg = PyFileConfigLoader(str(self.config_file)).load_config()
        env = self._env()
        env.update({
            "GPUPOOL_CONFIG": to_json(load(cfg, cwd=str(self.dir))),
            "JUPYTERHUB_API_TOKEN": self.service_token,
            "JUPYTERHUB_API_URL": self.hub_api_url,
            "JUPYTERHUB_SERVICE_NAME": "gpupool",
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{self.ports['service']}",
            "JUPYTERHUB_SERVICE_PREFIX": "/services/gpupool/",
        })
        return env

    def start_service(self) -> None:
        assert not self.managed, "start_service() is for Hub(managed=False)"
        log = open(self._service_log, "ab")
        self._service = subprocess.Popen([sys.executable, "-m", "gpupool.hub_ext.app"], cwd=self.dir,
                                         env=self.service_environment(), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        log.close()
        self._record(self._service.pid, "gpupool service")
        if self._hub is not None:
            self.wait_for(self._service_up, 60, message="the gpupool service did not come back")

    def service_pid(self) -> int | None:
        if self._service is not None:
            return self._service.pid if self._service.poll() is None else None
        if self._hub is None:
            return None
        for pid in children(self._hub.pid, "gpupool.hub_ext.app"):
            return pid
        return None

    def kill_service(self, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        pid = self.service_pid()
        if pid is None:
            return
        os.kill(pid, sig)
        if self._service is not None:
            self._service.wait(timeout)
        else:
            self.wait_for(lambda: not _alive(pid), timeout, message="the service did not exit")

    def restart_service(self) -> None:
        self.kill_service()
        self.start_service()

    def job_pids(self) -> list[int]:
        tag = f"GPUPOOL_JOB_DIR={self.job_root}/".encode()
        return [p for p in _pids() if tag in _environ(p) and _alive(p)]

    def stop(self) -> None:
        if self.stopped:  # idempotent: a shared hub may be stopped by the session check and at exit
            return
        self._record_proxy()
        self._record(self.service_pid(), "gpupool service")
        if self._hub is not None:
            if self._hub.poll() is None:
                self._hub.send_signal(signal.SIGTERM)  # JupyterHub stops its service, servers and proxy
                try:
                    self._hub.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(self._hub.pid, signal.SIGKILL)  # its own session; not reaped yet, so still ours
                    self._hub.wait(5)
            self._hub_log_f.close()
        if self._service is not None and self._service.poll() is None:
            self._service.send_signal(signal.SIGTERM)
            try:
                self._service.wait(10)
            except subprocess.TimeoutExpired:
                self._service.kill()
                self._service.wait(5)
        # anything left: the proxy (JupyterHub does not stop it when it dies at start-up), the managed
        # service, servers, job processes; only processes proven ours (marker or recorded pid + start time)
        deadline = time.monotonic() + 10
        while True:
            left = self.own_processes()
            if not left or time.monotonic() > deadline:
                break
            for pid, (started, _) in left.items():
                _signal_if_same(pid, started, signal.SIGKILL)
            time.sleep(0.1)
        self.stopped = True
        self.session.close()

    def __enter__(self) -> "Hub":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ HTTP
    def hub_api(self, method: str, path: str, token: str | None = None, **kw: Any) -> requests.Response:
        headers = kw.pop("headers", {})
        headers["Authorization"] = f"token {token or self.harness_token}"
        return self.session.request(method, f"{self.hub_api_url}/{path.lstrip('/')}", headers=headers,
                                    timeout=kw.pop("timeout", 30), **kw)

    def token(self, user: str, scopes: list[str] | None = None, note: str = "test") -> str:
        body: dict[str, Any] = {"note": note}
        if scopes is not None:
            body["scopes"] = scopes
        r = self.hub_api("POST", f"users/{user}/tokens", json=body)
        assert r.status_code in (200, 201), r.text
        return r.json()["token"]

    def api(self, method: str, path: str, token: str | None = None, json: Any = None, via_proxy: bool = False,
            **kw: Any) -> requests.Response:
        headers = kw.pop("headers", {})
        if token:
            headers["Authorization"] = f"token {token}"
        base = self.proxy_api_url if via_proxy else self.api_url
        return self.session.request(method, base + path.lstrip("/"), headers=headers, json=json,
                                    timeout=kw.pop("timeout", 30), **kw)

    # ------------------------------------------------------------------ waiting
    @staticmethod
    def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.2, message: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(message or f"timed out after {timeout:g} s waiting for {predicate}")
            time.sleep(interval)

    def wait_preempted(self, token: str, job_ids: Iterable[str], timeout: float = 30.0) -> dict:
        """The first of ``job_ids`` seen asked to stop or requeued during its first attempt."""
        job_ids = list(job_ids)

        def preempted():
            for j in job_ids:
                view = self.api("GET", f"jobs/{j}", token).json()
                if view["status"] in ("preempting", "queued") and view["attempts"] == 1:
                    return view
            return None
        return self.wait_for(preempted, timeout, 0.1, message=f"none of {job_ids} was preempted")

    def wait_job(self, token: str, job_id: str, statuses: Iterable[str], timeout: float = 60.0) -> dict:
        wanted = set(statuses)
        last: dict = {}

        def done() -> bool:
            nonlocal last
            r = self.api("GET", f"jobs/{job_id}", token)
            assert r.status_code == 200, r.text
            last = r.json()
            return last["status"] in wanted

        try:
            self.wait_for(done, timeout, 0.25)
        except AssertionError:
            raise AssertionError(f"job {job_id} not in {sorted(wanted)} after {timeout:g} s: {last}\n"
                                 f"log:\n{self.api('GET', f'jobs/{job_id}/log', token).text[-3000:]}") from None
        return last

    # ------------------------------------------------------------------ logs
    def hub_log(self) -> str:
        p = self.dir / "hub.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def service_log(self) -> str:
        if self.managed:
            return self.hub_log()
        return self._service_log.read_text(errors="replace") if self._service_log.exists() else ""


def _check_leaks(hubs: list[Hub]) -> list[str]:
    problems = []
    for hub in hubs:
        if not hub.stopped:
            problems.append(f"Hub in {hub.dir} was started and never stopped")
            hub.stop()
        left = hub.leftover_processes()
        if left:
            problems.append(f"Hub in {hub.dir} left processes running after stop(): {left}")
            for pid, (started, _) in hub.own_processes().items():
                _signal_if_same(pid, started, signal.SIGKILL)
        hub._leak_checked = True
    return problems


@pytest.fixture(autouse=True)
def hub_leak_check():
    """After each test: every Hub stopped so far left no process running."""
    yield
    problems = _check_leaks([h for h in _HUBS if h.stopped and not h._leak_checked])
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="session", autouse=True)
def hub_leak_check_session():
    """After the last test (module-scoped hubs are stopped by then): no Hub left a process running."""
    yield
    problems = _check_leaks([h for h in _HUBS if not h._leak_checked])
    assert not problems, "\n".join(problems)


def ledger(hub: Hub, job_id: str) -> list[dict]:
    """The usage records of one job (hub_ext/store/ledger.py), oldest first."""
    db = sqlite3.connect(hub.settings["db_url"].removeprefix("sqlite:///"))
    db.row_factory = sqlite3.Row
    rows = [dict(r) for r in db.execute('SELECT * FROM usage WHERE workload = ? ORDER BY id', (job_id,))]
    db.close()
    return rows


def notebook(*cells: str, parameters: str | None = None) -> dict:
    """An nbformat-4 notebook of code cells; ``parameters`` becomes papermill's parameters cell."""
    out = []
    if parameters is not None:
        out.append({"cell_type": "code", "id": "parameters", "metadata": {"tags": ["parameters"]},
                    "source": parameters, "outputs": [], "execution_count": None})
    for i, src in enumerate(cells):
        out.append({"cell_type": "code", "id": f"cell-{i}", "metadata": {}, "source": src, "outputs": [],
                    "execution_count": None})
    return {"nbformat": 4, "nbformat_minor": 5, "cells": out,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                         "language_info": {"name": "python"}}}
