"""``gpupool hub``: run JupyterHub with the gpupool service and GPU-aware spawner.

    gpupool hub --demo [--port 8000] [--ip 127.0.0.1] [--gpus auto|real|declared]
    gpupool hub --config jupyterhub_config.py [--port N] [--ip ADDR]

``--demo`` writes a ready-made config into ./.gpupool-demo/ (see demo_config.py) and runs the
hub there; ``--config`` runs an admin's own config (which calls ``gpupool.hub_ext.configure(c)``).
Either way the hub runs in the foreground; Ctrl-C (or SIGTERM) stops it, its proxy, the service
and every single-user server. JupyterHub runs in a session of its own, so a Ctrl-C in the terminal
reaches this launcher alone, which stops things in order (the demo: the servers first, while the
service can still free their GPUs; then the hub, which stops the service and the proxy); it
dies with the launcher (Linux: the parent-death signal), so a killed launcher leaves no hub behind.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

PROXY = "configurable-http-proxy"
INSTALL_HINT = (
    "configurable-http-proxy (JupyterHub's proxy, a Node.js program) is not installed.\n"
    "  In a gpupool checkout: `npm install` (or simply `make hub`, which installs it and starts the demo).\n"
    "  Elsewhere: `npm install -g configurable-http-proxy` (needs Node.js >= 18)."
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "hub", help="run JupyterHub with the gpupool scheduler (try: gpupool hub --demo)",
        description="Run JupyterHub with the gpupool service and the GPU-aware spawner.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--demo", action="store_true",
                      help="write a demo config into ./.gpupool-demo/ and run it (users alice, bob, carol; "
                           "password gpupool)")
    mode.add_argument("--config", metavar="FILE", help="run JupyterHub with this jupyterhub_config.py")
    p.add_argument("--port", type=int, default=None, help="public port (default 8000; the demo also uses the "
                                                          "next three ports for the proxy API, the hub and the service)")
    p.add_argument("--ip", default=None, help="public address (default: the config's c.JupyterHub.ip or bind_url, "
                                             "else 127.0.0.1; the hub listens where the banner says)")
    p.add_argument("--gpus", choices=("auto", "real", "declared"), default="auto",
                   help="demo inventory: this machine's GPUs via NVML (real), 2 declared nodes x 4 GPUs "
                        "(declared), or real when NVML finds GPUs (auto, the default)")
    p.add_argument("--check", action="store_true",
                   help="with --config: check the gpupool settings (one line per problem) and exit; "
                        "`gpupool hub --config FILE` runs the same check before JupyterHub starts")
    p.add_argument("--dir", default=None, help=argparse.SUPPRESS)  # demo directory (tests)
    p.set_defaults(func=run)


def find_proxy(cwd: Path | None = None) -> str | None:
    """configurable-http-proxy on PATH, in ./node_modules/.bin, or in the gpupool checkout's."""
    found = shutil.which(PROXY)
    if found:
        return found
    for base in (cwd or Path.cwd(), Path(__file__).resolve().parents[1]):
        cand = base / "node_modules" / ".bin" / PROXY
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def _configured_address(config: Path) -> tuple[str, int, bool]:
    """The public ip/port a jupyterhub_config.py sets, 127.0.0.1:8000 where it sets none, and
    whether it sets ``bind_url`` (JupyterHub's own default address is every interface)."""
    from urllib.parse import urlsplit

    try:
        from traitlets.config.loader import PyFileConfigLoader

        c = PyFileConfigLoader(config.name, path=str(config.parent)).load_config()
        hub = c.JupyterHub
        if "bind_url" in hub:
            u = urlsplit(hub.bind_url)
            return u.hostname or "", u.port or 8000, True
        return (hub.ip if "ip" in hub else "") or "127.0.0.1", int(hub.port) if "port" in hub else 8000, False
    except Exception:  # the check before start reports problems with the file
        return "127.0.0.1", 8000, False


def _service_port_taken(config: Path) -> str:
    """The message when the service's port (``c.GPUPool.port``) of a config is in use, else ""."""
    from . import GPUPool, port_in_use, port_taken_message
    from traitlets.config.loader import PyFileConfigLoader

    try:
        port = GPUPool(config=PyFileConfigLoader(config.name, path=str(config.parent)).load_config()).port
    except Exception:  # the check before start reports problems with the file
        return ""
    return port_taken_message(port) if port_in_use(port) else ""


def _port_free(ip: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip if ip not in ("", "*") else "0.0.0.0", port))
        except OSError:
            return False
    return True


def _local(ip: str) -> str:
    """An address to reach a server listening on ``ip`` from this machine."""
    if ip in ("", "0.0.0.0", "*"):
        return "127.0.0.1"
    if ip == "::":
        return "[::1]"
    return f"[{ip}]" if ":" in ip else ip


def _checked(config: Path) -> bool:
    """Check the gpupool settings of ``config``: print each problem on a line of its own (and the
    warnings); True when there is no error."""
    from .config import check_file

    errors, warnings = check_file(str(config))
    for w in warnings:
        print(f"gpupool hub: warning: {w}", file=sys.stderr)
    for e in errors:
        print(f"gpupool hub: {config}: {e}", file=sys.stderr)
    return not errors


def _fail(message: str, code: int = 2) -> int:
    print(f"gpupool hub: {message}", file=sys.stderr)
    return code


RUNNING_MARK = b"JupyterHub is now running"


def _relay(stream, out, ready: threading.Event) -> None:
    """Copy the hub's log to ``out`` line by line; set ``ready`` once JupyterHub says it is running
    (its proxy routes are in place then, so polling the public URL earlier only fills the proxy's
    log with 404s)."""
    for line in iter(stream.readline, b""):
        try:
            out.write(line)
            out.flush()
        except (OSError, ValueError):
            pass
        if RUNNING_MARK in line:
            ready.set()
    ready.set()  # the hub ended


def _wait_up(proc: subprocess.Popen, url: str, stopping: dict | None = None, timeout: float = 120.0,
             ready: threading.Event | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while ready is not None and not ready.wait(0.3):
        if proc.poll() is not None or (stopping and stopping.get("signal") is not None) or time.monotonic() > deadline:
            return False
    while time.monotonic() < deadline:
        if proc.poll() is not None or (stopping and stopping.get("signal") is not None):
            return False
        try:  # through the proxy: 200 only once the hub's route is in place and the hub answers
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (OSError, ValueError):  # includes HTTPError (404 until the hub's route exists)
            pass
        time.sleep(0.3)
    return False


def _stop_stray_proxy(cwd: Path) -> None:
    """JupyterHub leaves its proxy running when it dies at start-up (e.g. a service fails): stop the
    proxy named in its pid file, if that process is still a configurable-http-proxy."""
    pid_file = cwd / "jupyterhub-proxy.pid"
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except (OSError, ValueError, psutil.Error):
        return
    if PROXY not in cmdline:
        return
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            time.sleep(0.1)
            os.kill(pid, 0)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        pid_file.unlink()
    except OSError:
        pass


def _call(method: str, url: str, token: str, timeout: float) -> tuple[int, object]:
    """(status, JSON body) of a request with a token; (status, None) for an HTTP error."""
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
            return r.status, json.loads(body) if body else None
    except urllib.error.HTTPError as e:
        return e.code, None


def stop_all_servers(hub_api: str, token: str, timeout: float = 60.0) -> None:
    """Stop every single-user server through the hub's REST API and wait for them to be gone.

    JupyterHub's own shutdown stops its services *before* the servers, so the gpupool service
    would never hear that their GPUs are free; stopping the servers first keeps its state clean."""
    def call(method: str, path: str) -> tuple[int, object]:
        return _call(method, hub_api.rstrip("/") + path, token, timeout)

    def active() -> list[tuple[str, str]]:
        status, users = call("GET", "/users?state=active")
        if status != 200 or not isinstance(users, list):
            return []
        return [(u["name"], name) for u in users for name in (u.get("servers") or {})]

    from urllib.parse import quote

    servers = active()
    if not servers:
        return
    print(f"gpupool hub: stopping {len(servers)} server(s) ...", file=sys.stderr, flush=True)
    for user, name in servers:
        path = f"/users/{quote(user, safe='')}/server" if not name else \
            f"/users/{quote(user, safe='')}/servers/{quote(name, safe='')}"
        call("DELETE", path)
    deadline = time.monotonic() + timeout
    while active() and time.monotonic() < deadline:
        time.sleep(0.5)


def _die_with_parent() -> None:
    """In the hub's process, before it runs (Linux): SIGTERM when the launcher dies; SIGINT and
    SIGQUIT back to their defaults (a shell starts a background job with them ignored, and the
    hub's services would inherit that and sit out the hub's SIGINT: each stop then waits for its
    timeout, ~30 s in all)."""
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _run_hub(cmd: list[str], cwd: Path, env: dict, health_url: str, banner: str | None,
             before_stop=None) -> int:
    # a session of its own: the terminal's Ctrl-C (SIGINT to the foreground group) reaches the
    # launcher only, which stops things in order; JupyterHub alone would stop the service first
    proc = subprocess.Popen(cmd, cwd=str(cwd), env=env, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    ready = threading.Event()
    relay = threading.Thread(target=_relay, args=(proc.stderr, sys.stderr.buffer, ready), daemon=True)
    relay.start()
    stopping: dict = {"signal": None, "sent": False}

    def request_stop(signum, frame):  # handled in the loop below (no network calls in a handler)
        if stopping["signal"] is not None and not stopping["sent"]:
            stopping["sent"] = True  # a second Ctrl-C: stop the hub now
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        stopping["signal"] = signum

    def stop_hub() -> None:
        if stopping["sent"]:
            return
        stopping["sent"] = True
        if before_stop is not None:
            try:
                before_stop()
            except Exception as e:  # the hub's own shutdown still stops everything
                print(f"gpupool hub: could not stop the servers first: {e}", file=sys.stderr)
        try:  # the hub stops the proxy, the service and any server left
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        if banner is not None and _wait_up(proc, health_url, stopping, ready=ready) and stopping["signal"] is None:
            print(banner, flush=True)
        while True:
            if stopping["signal"] is not None:
                stop_hub()
            try:
                rc = proc.wait(timeout=0.3)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        if proc.poll() is None:  # we are leaving abnormally: do not leave the hub behind
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for s, h in old.items():
            signal.signal(s, h)
        relay.join(5)  # the rest of the hub's log
        _stop_stray_proxy(cwd)
    if stopping["signal"] is not None:
        print("gpupool hub: stopped", file=sys.stderr)
        return 0
    if rc != 0:
        return _fail(f"jupyterhub exited with status {rc} (see its log above)", 1)
    return 0


def run(args: argparse.Namespace) -> int:
    if not args.demo and not args.config:
        return _fail("give --demo (a ready-made demo hub) or --config FILE (your jupyterhub_config.py)")
    if args.port is not None and not 1 <= args.port <= 65532:
        return _fail(f"--port: {args.port} is not a usable port")
    if args.check and not args.config:
        return _fail("--check needs --config FILE")
    if args.config:
        config = Path(args.config).expanduser()
        if not config.is_file():
            return _fail(f"--config: {config} does not exist")
        ok = _checked(config)
        if args.check:
            if ok:
                print(f"gpupool hub: {config}: the gpupool settings are fine")
            return 0 if ok else 1
        if not ok:
            return _fail("not starting JupyterHub: fix the settings above (`gpupool hub --config FILE --check` "
                         "checks again without starting anything)", 1)
        taken = _service_port_taken(config)
        if taken:
            return _fail(f"{config}: {taken}", 1)
    proxy = find_proxy()
    if proxy is None:
        return _fail(INSTALL_HINT)
    jupyterhub = shutil.which("jupyterhub") or str(Path(sys.executable).parent / "jupyterhub")
    if not os.path.exists(jupyterhub):
        return _fail("the `jupyterhub` command is not installed in this environment (pip install jupyterhub)")
    env = dict(os.environ)
    extra_path = [str(Path(sys.executable).parent), str(Path(proxy).parent)]
    env["PATH"] = os.pathsep.join(extra_path + [env.get("PATH", "")])

    if args.config:
        cmd = [jupyterhub, "-f", str(config.resolve())]
        cfg_ip, cfg_port, has_bind_url = _configured_address(config)
        ip, port = args.ip or cfg_ip, args.port or cfg_port
        if args.port is not None:
            cmd += ["--port", str(args.port)]
        # listen where the banner says: JupyterHub alone would take every interface when the config
        # names no address, and recompute a bind_url's address from its `ip` ('') on --port
        if args.ip is not None or args.port is not None or not has_bind_url:
            cmd += ["--ip", ip]
        return _run_hub(cmd, Path.cwd(), env, f"http://{_local(ip)}:{port}/hub/health",
                        f"\ngpupool hub is up: http://{ip}:{port}/\n")

    from . import demo_config

    gpus = args.gpus
    if gpus in ("auto", "real"):
        from ..backends import nvml

        has = nvml.available()
        if gpus == "real" and not has:
            return _fail("--gpus real: NVML finds no GPU on this machine (no driver or no device); "
                         "use --gpus declared for the demo inventory")
        gpus = "real" if has else "declared"
    opts = demo_config.DemoOptions(port=args.port or 8000, ip=args.ip or "127.0.0.1", gpus=gpus,
                                   proxy_command=proxy)
    busy = [p for p in range(opts.port, opts.port + 4) if not _port_free(opts.ip, p)]
    if busy:
        return _fail(f"port {busy[0]} on {opts.ip} is in use (the demo needs ports {opts.port}-{opts.port + 3}); "
                     f"is another hub running? Try --port {opts.port + 10}")
    root = Path(args.dir or demo_config.DEMO_DIR)
    try:
        config = demo_config.write_demo(root, opts)
    except OSError as e:
        return _fail(f"cannot write the demo into {root}: {e}")
    print(f"gpupool hub: demo config written to {config}", flush=True)
    hub_api = f"http://127.0.0.1:{opts.hub_port}/hub/api"
    return _run_hub([jupyterhub, "-f", str(config)], config.parent, env,
                    f"http://{_local(opts.ip)}:{opts.port}/hub/health", demo_config.banner(opts),
                    before_stop=lambda: stop_all_servers(hub_api, opts.control_token))
