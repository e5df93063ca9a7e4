"""`gpupool hub ...` as a user runs it, in a session of its own (tests/hub/test_hub_demo.py,
tests/hub/test_hub_shutdown.py): ``HubProcess`` starts it and stops it as Ctrl-C does, then kills
whatever it left running, but only processes recorded with their start time (from /proc);
``free_port_block`` finds the demo's four consecutive ports."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from gpupool_cli import GPUPOOL


def free_port_block(n: int = 4, lo: int = 18700, hi: int = 18990) -> int:
    """A base port with ``n`` consecutive free ports (the demo uses port .. port+3). Each test
    worker (pytest-xdist) looks in its own part of the range, so two demos that start at the same
    moment never pick the same block between the check and the bind."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    k = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % workers
    span = (hi - lo) // workers // 4 * 4
    lo, hi = lo + k * span, lo + (k + 1) * span
    blocks = list(range(lo, hi - n + 1, 4))
    start = os.getpid() % len(blocks)
    for base in blocks[start:] + blocks[:start]:
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


def process_tree(pid: int) -> dict[int, int]:
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


class HubProcess:
    """``gpupool hub ...`` run in its own session with its output in a file; ``stop()`` sends what
    Ctrl-C sends, then kills whatever it left running (only processes recorded with their start time)."""

    def __init__(self, args: list[str], cwd: Path, background: bool = False):
        """``background``: start it as a shell starts a background job (``gpupool hub &``), with
        SIGINT and SIGQUIT ignored, which every process it starts inherits unless it resets them."""
        self.log = open(cwd / "hub.log", "w+")
        ignore = (lambda: [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT)]) if background else None
        self.proc = subprocess.Popen([GPUPOOL, "hub", *args], cwd=cwd, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=ignore)
        self.descendants: dict[int, int] = {}  # pid -> start time: what we may kill at the end
        self.rc: int | str | None = None
        self.leftovers: list[int] = []

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def wait_output(self, text: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while text not in (out := self.output()) and time.monotonic() < deadline and self.proc.poll() is None:
            self.descendants.update(process_tree(self.proc.pid))
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
