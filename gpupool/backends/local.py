"""Local job backend: each job attempt is a process tree on this machine running papermill.

``start`` launches ``python -m gpupool.backends.local run ...`` (the *runner*) in a new session
(its own process group). The runner starts ``python -m papermill INPUT OUTPUT -f params.json
--cwd WORKDIR --log-output`` with stdout/stderr appended to the job's log, forwards SIGTERM to it,
and when papermill is gone kills whatever is left of the run (papermill starts the kernel in a
session of its own) and writes ``exit.json`` with the exit code. Every process of the run carries
``GPUPOOL_RUN_ID=<job id>.<attempt>`` in its environment; that is how the backend finds a run
again after the service restarts (no handle needed) and how it reaches the kernel.

Liveness never trusts a bare pid: a pid counts only while its environment carries the run id and
the process is not a zombie (read with psutil).
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil

from .. import protocol as P
from .base import EXITED, LOST, RUNNING, JobBackend, JobSpec, RunState, gang_state, program_argv, worker_run_id

RUN_ENV = P.Env.RUN_ID
KEEP_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH",
            "CUDA_HOME", "PYTHONPATH", "JUPYTER_PATH", "JUPYTER_DATA_DIR", "TMPDIR")


# --------------------------------------------------------------------------------------------
# processes of a run (psutil)

_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def _of_run(proc: psutil.Process, run_id: str) -> bool:
    """Whether ``proc`` is a live (non-zombie) process of the run ``run_id``: its environment (as
    it was at exec) carries the run id. Gone, or not ours to read: no."""
    try:
        return proc.environ().get(RUN_ENV) == run_id and proc.status() not in _GONE
    except psutil.Error:
        return False


def run_alive(pid: int | None, run_id: str) -> bool:
    """Whether ``pid`` is a live (non-zombie) process of the run ``run_id``."""
    if not pid:
        return False
    try:
        return _of_run(psutil.Process(pid), run_id)
    except psutil.Error:
        return False


def run_pids(run_id: str) -> list[int]:
    """Every live process of the run, found by its environment."""
    me = os.getpid()
    return [p.pid for p in psutil.process_iter() if p.pid != me and _of_run(p, run_id)]


def _signal_run(run_id: str, pgid: int | None, sig: int) -> None:
    if pgid:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in run_pids(run_id):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


read_exit = P.read_exit


# --------------------------------------------------------------------------------------------
# The backend

class LocalBackend(JobBackend):
    """Jobs as local processes (``c.GPUPool.backend = "local"``, the default)."""

    name = "local"

    def __init__(self, settings: Any = None, log: Any = None):
        super().__init__(settings, log)
        self._procs: dict[str, subprocess.Popen] = {}  # worker run id -> our child (for reaping)
        self._causes: dict[str, int] = {}  # gang run id -> the rank whose failure stops it
        self._stopping: dict[str, float] = {}  # gang run id -> when its workers were first told to stop
        self._unlisted: dict[str, set[str]] = {}  # node -> GPU UUIDs the last NVML reading did not list
        self._limits: Any = None  # gpu_limits.CgroupLimits (tier 2), made at the first fractional start

    def limits(self) -> Any:
        """The driver's per-cgroup GPU memory limits (tier 2), or None where they are off."""
        if self._limits is None:
            from . import gpu_limits, nvml

            pool = getattr(self.settings, "pool", None)
            root = getattr(pool, "gpu_memory_cgroup", "") or ""
            module = nvml._module(nvml.load_module(getattr(pool, "nvml_module", "") or "")) if root else None
            self._limits = gpu_limits.CgroupLimits(module, root) if module is not None else False
        return self._limits or None

    def _cgroup(self, spec: JobSpec, rank: int, run_id: str) -> str | None:
        """Worker ``rank``'s cgroup with its GPU memory limits set (tier 2), or None (whole GPUs,
        or the machine does not allow it: the NVML watch and the frameworks' caps hold it)."""
        cap = spec.gpu_caps[rank] if rank < len(spec.gpu_caps) else {}
        limits = self.limits() if cap else None
        if limits is None or not limits.usable(cap["gpu"])[0]:
            return None
        try:
            return limits.prepare(run_id, cap["gpu"], cap["hard"], cap["soft"])
        except Exception as e:  # OSError, NVMLError: the lower tiers hold it
            self.log.warning("GPU memory limits of %s not set by the driver: %s", run_id, e)
            return None

    def _env(self, spec: JobSpec, home: str) -> dict[str, str]:
        env = {k: os.environ[k] for k in KEEP_ENV if k in os.environ}
        env.update({"HOME": home, "USER": spec.run_as or spec.user, "JUPYTERHUB_USER": spec.user,
                    "PYTHONUNBUFFERED": "1"})
        env.update(spec.env)
        env[RUN_ENV] = spec.run_id
        return env

    async def start(self, spec: JobSpec) -> dict:
        return await asyncio.get_running_loop().run_in_executor(None, self._start, spec)

    def _start(self, spec: JobSpec) -> dict:
        """Start every worker of the run (one for a plain job); all or none: a worker that cannot
        start takes the ones already started down with it."""
        files = spec.files
        run_dir = files.run_dir(spec.attempt)
        os.makedirs(run_dir, exist_ok=True)
        os.makedirs(spec.checkpoint_dir, exist_ok=True)
        pods = max(1, int(spec.pods or 1))
        for stale in [files.exit_file(spec.attempt, r) for r in range(pods)] + [spec.stop_file]:
            try:
                os.unlink(stale)
            except FileNotFoundError:
                pass
        params = files.parameters(spec.attempt)
        with open(params, "w") as f:
            json.dump(spec.parameters or {}, f)
        kwargs: dict[str, Any] = {}
        home = spec.workdir
        if spec.run_as:
            import pwd

            try:
                pw = pwd.getpwnam(spec.run_as)
            except KeyError:
                raise RuntimeError(f"there is no system user {spec.run_as!r} to run the job as "
                                   "(an admin can set c.GPUPool.run_as_user = False)") from None
            home = pw.pw_dir
            kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=os.getgrouplist(pw.pw_name, pw.pw_gid))
            for path in (spec.job_dir, run_dir, spec.checkpoint_dir, os.path.dirname(spec.stop_file)):
                os.chown(path, pw.pw_uid, pw.pw_gid)
            for path in [f(r) for f in (spec.worker_log, spec.worker_output) for r in range(pods)]:
                if os.path.exists(path):
                    os.chown(path, pw.pw_uid, pw.pw_gid)
        if not os.path.isdir(spec.workdir):
            raise RuntimeError(f"the working directory {spec.workdir} does not exist")
        rendezvous = {}
        if pods > 1 and not spec.endpoint:  # an endpoint's replicas are independent: no rendezvous
            from ..distributed import worker_env

            port = free_port()
            rendezvous = {r: worker_env(spec.placements, r, "127.0.0.1", port) for r in range(pods)}
        handles: list[dict] = []
        try:
            for rank in range(pods):
                handles.append(self._start_worker(spec, rank, params, home, rendezvous.get(rank, {}), kwargs))
        except BaseException:
            for h in handles:
                _signal_run(h["run_id"], h.get("pgid"), signal.SIGKILL)
            raise
        handle = dict(handles[0])
        if pods > 1:
            handle["workers"] = handles[1:]
        return handle

    def _start_worker(self, spec: JobSpec, rank: int, params: str, home: str, rendezvous: dict,
                      kwargs: dict) -> dict:
        python = spec.python or sys.executable
        cmd = [python, "-m", "papermill", spec.notebook, spec.worker_output(rank), "-f", params, "--cwd",
               spec.workdir, "--log-output", "--no-progress-bar"]
        if spec.kernel_name:
            cmd += ["-k", spec.kernel_name]
        cmd = program_argv(spec.command, python, cmd)
        run_id = worker_run_id(spec.run_id, rank)
        exit_file = spec.files.exit_file(spec.attempt, rank)
        cgroup = self._cgroup(spec, rank, run_id)
        serve: list[str] = []
        env = self._env(spec, home)
        if spec.endpoint:  # a replica: its own port, restarted by the runner when it exits with an error
            port = free_port()
            env[P.PORT] = str(port)
            serve = ["--restarts", str(int(spec.max_restarts)), "--restarts-file",
                     spec.files.restarts_file(spec.attempt, rank)]
        runner = [python, "-m", "gpupool.backends.local", "run", "--exit-file", exit_file,
                  "--log", spec.worker_log(rank), "--run-id", run_id, *(["--cgroup", cgroup] if cgroup else []),
                  *serve, "--", *cmd]
        if rank < len(spec.worker_env):
            env.update(spec.worker_env[rank])
        env.update(rendezvous)
        env[RUN_ENV] = run_id
        proc = subprocess.Popen(runner, cwd=spec.workdir, env=env, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                close_fds=True, **kwargs)
        self._procs[run_id] = proc
        handle = {"pid": proc.pid, "pgid": proc.pid, "run_id": run_id, "exit_file": exit_file, "started": time.time()}
        if spec.endpoint:
            handle["target"] = f"http://127.0.0.1:{env[P.PORT]}"
        if cgroup:
            try:
                self._limits.enter(cgroup, proc.pid)  # the runner waits for this before it starts the program
            except OSError as e:
                _signal_run(run_id, proc.pid, signal.SIGKILL)
                self._limits.release(cgroup)
                raise RuntimeError(f"could not move the job into its cgroup {cgroup}: {e}") from None
            handle.update(cgroup=cgroup, enforcement="driver")
        return handle

    def _state(self, handle: dict) -> RunState:
        if "workers" not in handle:
            return self._worker_state(handle)
        workers = _workers(handle)
        run_id = handle["run_id"]
        state, cause = gang_state([self._worker_state(h) for h in workers], self._causes.get(run_id))
        if cause is None:
            return state
        self._causes[run_id] = cause
        if state.state == RUNNING:  # one worker failed: the gang stops as a unit (SIGTERM, then SIGKILL)
            first = self._stopping.setdefault(run_id, time.monotonic())
            force = time.monotonic() - first >= self._kill_after()
            for h in workers:
                _signal_run(h["run_id"], h.get("pgid"), signal.SIGKILL if force else signal.SIGTERM)
        else:
            self._causes.pop(run_id, None)
            self._stopping.pop(run_id, None)
        return state

    def _kill_after(self) -> float:
        pool = getattr(self.settings, "pool", None)
        return float(getattr(pool, "kill_after", 5.0) or 0.0)

    def _worker_state(self, handle: dict) -> RunState:
        run_id = handle["run_id"]
        proc = self._procs.get(run_id)
        if proc is not None:
            rc = proc.poll()
            if rc is None:
                return RunState(RUNNING)
            self._procs.pop(run_id, None)
        elif run_alive(handle.get("pid"), run_id):
            return RunState(RUNNING)
        if handle.get("cgroup") and self._limits:  # its processes are gone: the limits go with the cgroup
            self._limits.release(handle["cgroup"])
        code = read_exit(handle.get("exit_file", ""))
        if code is not None:
            return RunState(EXITED, code, _describe(code))
        if proc is not None and proc.returncode is not None:
            rc = proc.returncode
            code = 128 - rc if rc < 0 else rc
            return RunState(EXITED, code, _describe(code))
        return RunState(LOST, None, "its processes are gone and left no exit status (killed from outside gpupool?)")

    async def poll(self, handle: dict) -> RunState:
        return self._state(handle)

    async def request_checkpoint(self, handle: dict, spec: JobSpec, reason: str = "") -> None:
        P.write_stop(spec.stop_file, reason)

    async def terminate(self, handle: dict, force: bool = False) -> None:
        for h in _workers(handle):
            _signal_run(h["run_id"], h.get("pgid"), signal.SIGKILL if force else signal.SIGTERM)

    async def adopt(self, spec: JobSpec, handle: dict | None) -> tuple[dict | None, RunState]:
        pods = max(1, int(spec.pods or 1))
        known = {h["run_id"]: h for h in _workers(handle)} if handle else {}
        found = [self._adopt_worker(spec, r, known.get(worker_run_id(spec.run_id, r))) for r in range(pods)]
        if pods == 1:
            return found[0]
        handles = [h for h, _ in found]
        new = dict(handles[0])
        new["workers"] = handles[1:]
        return new, self._state(new)

    def _adopt_worker(self, spec: JobSpec, rank: int, handle: dict | None) -> tuple[dict, RunState]:
        run_id = worker_run_id(spec.run_id, rank)
        exit_file = spec.files.exit_file(spec.attempt, rank)
        if handle and run_alive(handle.get("pid"), run_id):
            return handle, RunState(RUNNING)
        pids = run_pids(run_id)
        if pids:
            # the runner: our wrapper, leader of its process group (the kernel leads a session too)
            runners = [p for p in pids if _is_runner(p)]
            pid = runners[0] if runners else min(pids)
            found = {"pid": pid, "pgid": _pgid(pid) or pid, "run_id": run_id, "exit_file": exit_file, "started": None}
            if handle and handle.get("target"):
                found["target"] = handle["target"]
            return found, RunState(RUNNING)
        handle = handle or {"pid": None, "pgid": None, "run_id": run_id, "exit_file": exit_file, "started": None}
        code = read_exit(exit_file)
        if code is not None:
            return handle, RunState(EXITED, code, _describe(code))
        return handle, RunState(LOST, None, "its process was gone when the gpupool service restarted")

    def pids(self, handle: dict) -> set[int]:
        return {pid for h in _workers(handle) for pid in run_pids(h["run_id"])}

    async def node_conditions(self) -> dict[str, tuple[str, str]]:
        """A GPU found through NVML at start (``settings.gpu_uuids``) that NVML no longer lists
        (fallen off the bus, its driver gone) fails its node: CUDA numbers the GPUs left afresh, so
        no run there keeps the GPU it was given. It must be missing from two readings in a row (one
        failed reading is not a failure); the node is back once NVML lists all its GPUs again."""
        expected = getattr(self.settings, "gpu_uuids", None) or {}
        if not expected:
            return {}
        listed = await asyncio.get_running_loop().run_in_executor(None, self._listed_uuids)
        out: dict[str, tuple[str, str]] = {}
        for node, uuids in expected.items():
            gone = {u for u in uuids if u not in listed}
            twice = sorted(gone & self._unlisted.get(node, set()), key=uuids.index)
            self._unlisted[node] = gone
            if twice:
                named = ", ".join(f"GPU {uuids.index(u)} ({u})" for u in twice)
                out[node] = ("fail", f"NVML no longer lists {named}")
        return out

    def _listed_uuids(self) -> set[str]:
        from . import nvml

        pool = getattr(self.settings, "pool", None)
        reader = nvml.Reader(nvml.load_module(getattr(pool, "nvml_module", "") or ""))
        return {g["uuid"] for g in reader.gpus()}

    async def close(self) -> None:
        self._procs.clear()  # runs keep going; a restarted service adopts them


def _workers(handle: dict) -> list[dict]:
    """Every worker's handle of a run, rank order (a plain run: itself)."""
    return [handle, *handle.get("workers", [])]


def free_port() -> int:
    """A TCP port free on this machine right now (the rendezvous port of a gang)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_count(path: str, n: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(int(n)))
    os.replace(tmp, path)


def _is_runner(pid: int) -> bool:
    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    ours = any(cmd[i:i + 2] == ["gpupool.backends.local", "run"] for i in range(len(cmd)))
    return ours and _pgid(pid) == pid


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _describe(code: int) -> str:
    if code == 0:
        return "it ran to the end"
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return f"it was stopped by {name}"
    return f"it exited with status {code}"


# --------------------------------------------------------------------------------------------
# The runner: `python -m gpupool.backends.local run --exit-file F --log L --run-id R -- CMD...`

def _runner(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="gpupool.backends.local run")
    p.add_argument("--exit-file", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--cgroup", default="")
    p.add_argument("--restarts", type=int, default=0, help="an endpoint: restart the program this often at most")
    p.add_argument("--restarts-file", default="", help="an endpoint: where the restarts so far are counted")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd and args.cmd[0] == "--" else args.cmd
    log = open(args.log, "ab", buffering=0)
    if args.cgroup:  # the service moves this runner into the worker's cgroup (tier 2): the program starts inside
        from .gpu_limits import wait_inside

        if not wait_inside(args.cgroup):
            log.write(f"gpupool: not in the cgroup {args.cgroup}; the driver does not cap this job's GPU memory\n"
                      .encode())
    # the program's Python processes start with gpupool's hook (a fraction's cap handed to PyTorch, TensorFlow)
    child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=P.with_startup_hook(os.environ))
    stopped: list[int] = []
    restarts = 0

    def forward(signum: int, _frame: Any) -> None:
        stopped.append(signum)
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass
        for pid in run_pids(args.run_id):  # the kernel lives in a session of its own
            if pid != child.pid:
                try:
                    os.kill(pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    rc = child.wait()
    code = 128 - rc if rc < 0 else rc
    # an endpoint's server that crashed (not one asked to stop) starts again, a bounded number of times
    while code != 0 and not stopped and restarts < args.restarts:
        restarts += 1
        log.write(f"\n=== gpupool: the endpoint's server ended ({_describe(code)}); restart {restarts} of at most "
                  f"{args.restarts} ===\n".encode())
        if args.restarts_file:
            _write_count(args.restarts_file, restarts)
        time.sleep(min(2.0 ** (restarts - 1), 30.0) if not stopped else 0)
        if stopped:
            break
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=P.with_startup_hook(os.environ))
        rc = child.wait()
        code = 128 - rc if rc < 0 else rc
    # whatever is left of the run (an orphaned kernel) goes too
    leftovers = [p for p in run_pids(args.run_id) if p != os.getpid()]
    for sig, pause in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0)):
        if not leftovers:
            break
        for pid in leftovers:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.time() + pause
        while pause and time.time() < deadline and leftovers:
            time.sleep(0.1)
            leftovers = [p for p in run_pids(args.run_id) if p != os.getpid()]
    P.write_exit(args.exit_file, code, stopped[0] if stopped else None)
    log.close()
    return code


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        sys.exit(_runner(sys.argv[2:]))
    print("usage: python -m gpupool.backends.local run --exit-file F --log L --run-id R -- CMD...", file=sys.stderr)
    sys.exit(2)
