"""ipywidgets views of the pool, refreshed live by a background thread.

Each view is an ``ipywidgets.VBox`` holding an ``HTML`` widget whose value is a pure function of
the service's data (:mod:`gpupool.widgets.render`) and a one-line status. A :class:`Refresher`
thread fetches the data every ``interval`` seconds without blocking the kernel; ``close()`` stops
and joins it.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from typing import Any, Callable

import ipywidgets as w

from .. import contract as C
from . import render

_ids = itertools.count(1)


class Refresher:
    """Calls ``fn()`` every ``interval`` seconds in a daemon thread until stopped.

    ``fn`` returns False to stop itself (e.g. a finished job). Errors are passed to ``on_error``
    and retried with backoff (up to 60 s), so a hub restart does not kill a dashboard.
    """

    def __init__(self, fn: Callable[[], Any], interval: float = 5.0,
                 on_error: Callable[[BaseException], None] | None = None, name: str = "gpupool-refresh"):
        self.fn = fn
        self.interval = float(interval)
        self.on_error = on_error
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.name = f"{name}-{next(_ids)}"

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, delay_first: bool = False) -> "Refresher":
        if self.running:
            return self
        self._stop.clear()
        self._delay_first = delay_first
        self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self.thread.start()
        return self

    def _loop(self) -> None:
        delay = self.interval
        if getattr(self, "_delay_first", False) and self._stop.wait(delay):
            return
        while not self._stop.is_set():
            try:
                if self.fn() is False:
                    return
                delay = self.interval
            except Exception as e:  # shown in the widget; keep refreshing
                delay = min(max(delay, self.interval) * 2, 60.0)
                if self.on_error is not None:
                    try:
                        self.on_error(e)
                    except Exception:
                        pass
            self._stop.wait(delay)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)


class _View(w.VBox):
    """Base: an HTML body, a status line, and an optional refresher."""

    title = ""

    def __init__(self, *, interval: float = 5.0, autorefresh: bool = True, client=None, user: str | None = None):
        self.html = w.HTML(value=render.loading())
        self.status_line = w.HTML(value="")
        super().__init__([self.html, self.status_line])
        self.add_class("gpupool-view")
        self._client = client
        self.user = user if user is not None else _current_user()
        self.data: Any = None
        self.error: str | None = None
        self.refresher = Refresher(self._tick, interval, self._show_error, name=f"gpupool-{type(self).__name__}")
        if autorefresh:
            self.start()

    def start(self) -> "_View":
        """Draw once now (so the cell shows data at once), then refresh live in the background."""
        _first_refresh(self.refresh, self._show_error)
        if not self.finished():
            self.refresher.start(delay_first=True)
        return self

    # subclasses: fetch() does the I/O, render(data) is pure
    def fetch(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def render(self, data: Any) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def client(self):
        from gpupool.client.api import get_client
        return get_client(self._client)

    def show(self, data: Any) -> None:
        """Render ``data`` into the widget (no I/O)."""
        self.data = data
        self.error = None
        self.html.value = self.render(data)
        self.status_line.value = (f'<span style="color:#999;font-size:11px">updated {time.strftime("%H:%M:%S")}'
                                  f'{" · live" if self.refresher.running else ""}</span>')

    def refresh(self) -> "_View":
        """Fetch once and redraw (in the calling thread)."""
        self.show(self.fetch())
        return self

    def _tick(self):
        self.refresh()
        return not self.finished()

    def finished(self) -> bool:
        return False

    def _show_error(self, e: BaseException) -> None:
        self.error = str(e)
        self.status_line.value = render.status_line(f'{e} (retrying; {time.strftime("%H:%M:%S")})', "#b71c1c")

    def close(self) -> None:
        """Stop the refresher thread and close the widget."""
        self.refresher.stop()
        for child in (self.html, self.status_line):
            child.close()
        super().close()


def _first_refresh(fn, on_error) -> None:
    from gpupool.client.api import ConfigurationError
    try:
        fn()
    except ConfigurationError:
        raise  # no service configured: say so in the cell rather than retrying forever
    except Exception as e:
        on_error(e)


def _current_user() -> str | None:
    return os.environ.get("JUPYTERHUB_USER") or os.environ.get("GPUPOOL_USER")


class QueueView(_View):
    """Queues: allocated / deserved / fair-share bars, running and pending counts, your jobs highlighted."""

    def fetch(self):
        return {"queues": self.client.queues(), "jobs": self.client.jobs()}

    def render(self, data):
        return render.queues_html(data["queues"], data.get("jobs") or [], self.user or _user_of(data.get("jobs")))


class GPUView(_View):
    """Every GPU as a bar of its allocations (fractions by user), with live utilization and memory."""

    def fetch(self):
        return {"nodes": self.client.nodes()}

    def render(self, data):
        return render.gpus_html(data["nodes"], self.user)


class JobsView(_View):
    """Your jobs with status and reason."""

    def fetch(self):
        return {"jobs": self.client.jobs()}

    def render(self, data):
        return render.jobs_html(data["jobs"], self.user)


class EndpointsView(_View):
    """Your model endpoints (``gpupool.serve``) not ended: state (``starting`` until a replica
    answers, then ``ready``), replicas, GPUs, restarts and the URL as a link."""

    def fetch(self):
        return {"endpoints": _endpoints(self.client, self.client.jobs(kind=C.INFERENCE))}

    def render(self, data):
        return render.endpoints_html(data["endpoints"])


def _endpoints(client, jobs) -> list[dict]:
    """The endpoints among ``jobs`` not ended, each with its whole ``url`` on the client's hub."""
    from gpupool.client.serving import endpoint_url
    return [{**j, "url": endpoint_url(j, client)} for j in jobs
            if j.get("kind") == C.INFERENCE and j.get("status") in C.ACTIVE]


class JobView(_View):
    """One job: status, reason while it waits, allocation, live metric plots and the log's tail
    (a distributed job: its workers, and the tail of every worker's log).

    Refreshing stops by itself once the job has finished. A Cancel button cancels the job.
    """

    def __init__(self, job, *, interval: float = 3.0, autorefresh: bool = True, log_lines: int = 20, **kw):
        from gpupool.client.jobs import Job
        self.job = job if isinstance(job, Job) else Job(job, client=kw.get("client"))
        self.log_lines = log_lines
        self._log_offset: dict[int, int] = {}  # rank -> bytes read
        self._log_tail: dict[int, str] = {}
        self.cancel_button = w.Button(description="Cancel job", button_style="danger", icon="stop",
                                      layout=w.Layout(width="auto"))
        self.cancel_button.on_click(lambda _b: self._cancel())
        super().__init__(interval=interval, autorefresh=False, **kw)
        self.children = (self.html, w.HBox([self.cancel_button]), self.status_line)
        if autorefresh:
            self.start()

    def fetch(self):
        data = self.job.refresh().data
        for rank in range(int(data.get("pods") or 1) if self.log_lines else 0):
            try:  # only the new part of each worker's log each time
                text, self._log_offset[rank] = self.job.client.log(self.job.id, self._log_offset.get(rank, 0),
                                                                   rank=rank or None)
                if text:
                    tail = self._log_tail.get(rank, "") + text
                    self._log_tail[rank] = "".join(tail.splitlines(keepends=True)[-self.log_lines:])
            except Exception:
                pass
        if data.get("endpoint"):
            from gpupool.client.serving import endpoint_url
            data = {**data, "url": endpoint_url(data, self.job.client)}
        return {"job": data, "log": self._log_tail.get(0) or None,
                "rank_logs": {r: t for r, t in self._log_tail.items() if r and t}}

    def render(self, data):
        return render.job_html(data["job"], data.get("log"), data.get("rank_logs"))

    def show(self, data):
        super().show(data)
        self.cancel_button.disabled = data["job"].get("status") in C.ENDED

    def finished(self) -> bool:
        return bool(self.data) and self.data["job"].get("status") in C.ENDED

    def _cancel(self):
        try:
            self.job.cancel()
            self.refresh()
        except Exception as e:
            self._show_error(e)

    def close(self):
        self.cancel_button.close()
        super().close()


class SweepView(_View):
    """A sweep: status, progress, best so far, live objective curves of every trial, trial table."""

    def __init__(self, sweep, *, interval: float = 3.0, autorefresh: bool = True, **kw):
        self.sweep = sweep
        self.stop_button = w.Button(description="Stop sweep", icon="stop", layout=w.Layout(width="auto"))
        self.stop_button.on_click(lambda _b: self.sweep.stop(cancel=True))
        super().__init__(interval=interval, autorefresh=False, **kw)
        self.children = (self.html, w.HBox([self.stop_button]), self.status_line)
        if autorefresh:
            self.start()

    def fetch(self):
        return self.sweep.summary()

    def render(self, data):
        return render.sweep_html(data)

    def show(self, data):
        super().show(data)
        self.stop_button.disabled = data.get("status") in ("finished", "failed", "stopped")

    def finished(self) -> bool:
        return bool(self.data) and self.data.get("status") in ("finished", "failed", "stopped")

    def close(self):
        self.stop_button.close()
        super().close()


def _user_of(jobs) -> str | None:
    users = {j.get("user") for j in jobs or []}
    return users.pop() if len(users) == 1 else None


class Dashboard(w.VBox):
    """Queues, GPUs and your jobs, refreshed together by one thread."""

    _instances: "weakref.WeakSet[Dashboard]" = weakref.WeakSet()

    def __init__(self, *, interval: float = 5.0, autorefresh: bool = True, client=None, user: str | None = None):
        kw = dict(interval=interval, autorefresh=False, client=client, user=user)
        self.queues = QueueView(**kw)
        self.gpus = GPUView(**kw)
        self.jobs = JobsView(**kw)
        self.endpoints = w.HTML()  # your endpoints, when you have some (drawn from the same jobs)
        self._client = client
        self.user = user if user is not None else _current_user()
        self.server = w.HTML()  # this notebook's own server (its GPUs and any warning), when it has one
        self.status_line = w.HTML()
        heads = [w.HTML(f'<h4 style="margin:6px 0 2px 0">{t}</h4>') for t in ("Queues", "GPUs", "Your jobs")]
        self._heads = heads
        super().__init__([self.server, heads[0], self.queues, heads[1], self.gpus, heads[2], self.jobs,
                          self.endpoints, self.status_line])
        self.add_class("gpupool-dashboard")
        self.refresher = Refresher(self.refresh, interval, self._show_error, name="gpupool-dashboard")
        # a newer dashboard supersedes older ones: freeze them so re-running a cell leaks no threads
        for old in list(Dashboard._instances):
            old.refresher.stop(timeout=0)
            old.status_line.value = '<span style="color:#999;font-size:11px">stopped: a newer dashboard replaced this one</span>'
        Dashboard._instances.add(self)
        if autorefresh:
            _first_refresh(self.refresh, self._show_error)
            self.refresher.start(delay_first=True)

    @property
    def client(self):
        from gpupool.client.api import get_client
        return get_client(self._client)

    def fetch(self) -> dict:
        c = self.client
        return {"queues": c.queues(), "nodes": c.nodes(), "jobs": c.jobs(), "workspaces": c.workspaces()}

    def show(self, data: dict) -> None:
        self.queues.show({"queues": data["queues"], "jobs": data["jobs"]})
        self.gpus.show({"nodes": data["nodes"]})
        self.jobs.show({"jobs": data["jobs"]})
        mine = _endpoints(self.client, data["jobs"])
        self.endpoints.value = ('<h4 style="margin:6px 0 2px 0">Your endpoints</h4>' + render.endpoints_html(mine)
                                if mine else "")
        name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        mine = [ws for ws in data.get("workspaces", []) if ws.get("user") == self.user and ws.get("server") == name]
        self.server.value = render.workspace_html(mine[0] if mine else None)
        for v in (self.queues, self.gpus, self.jobs):
            v.status_line.value = ""
        self.status_line.value = render.status_line(f'updated {time.strftime("%H:%M:%S")}'
                                                    f'{" · live" if self.refresher.running else ""} · {self.client.url}')

    def refresh(self) -> "Dashboard":
        self.show(self.fetch())
        return self

    def _show_error(self, e):
        self.status_line.value = render.status_line(f'{e} (retrying; {time.strftime("%H:%M:%S")})', "#b71c1c")

    def close(self) -> None:
        self.refresher.stop()
        Dashboard._instances.discard(self)
        for v in (self.queues, self.gpus, self.jobs):
            v.close()
        for h in self._heads:
            h.close()
        self.status_line.close()
        self.server.close()
        self.endpoints.close()
        super().close()


def dashboard(interval: float = 5.0, client=None, user: str | None = None) -> Dashboard:
    """Queues, GPUs, your jobs and your endpoints in one live widget: ``gpupool.dashboard()``."""
    return Dashboard(interval=interval, client=client, user=user)
