"""The server extension's handlers, under the single-user server's base URL:

* ``GET gpupool/status``: JSON for the status bar (:func:`gpupool.lab.status.status`) plus
  ``refresh`` (seconds between two reads).
* ``GET gpupool/queue``: the HTML of the queue view the widgets draw (queues and the user's jobs).

The service is read with the server's own token (``JUPYTERHUB_API_TOKEN``) and ``GPUPOOL_URL``, as
``import gpupool`` in a notebook does (gpupool.client.config). Reads run in a thread (the client is
synchronous) and are shared for ``cache_seconds`` by every open tab.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, Callable, Mapping

from tornado import web
from traitlets import Float
from traitlets.config import Configurable

from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join

from .status import status


class GPUPoolLab(Configurable):
    """The gpupool server extension in a single-user server (``c.GPUPoolLab``)."""

    refresh_seconds = Float(
        10.0, help="Seconds between two updates of the status bar (each open JupyterLab tab asks this often).",
    ).tag(config=True)

    cache_seconds = Float(
        5.0, help="""Seconds one read of the gpupool service is reused for: every tab of the server
        shares it, so the service sees at most one read per server in that time.""",
    ).tag(config=True)

    service_timeout = Float(
        5.0, help="Seconds to wait for the gpupool service before the status bar says it is unreachable.",
    ).tag(config=True)


class PoolReader:
    """Reads (and briefly caches) what the status bar and the queue panel show."""

    def __init__(self, config: GPUPoolLab, env: Mapping[str, str] | None = None,
                 client_factory: Callable[[], Any] | None = None):
        self.config = config
        self.env = os.environ if env is None else env
        self._client_factory = client_factory
        self._client: Any = None
        self._cache: dict[str, tuple[float, Any]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def user(self) -> str | None:
        return self.env.get("JUPYTERHUB_USER") or self.env.get("GPUPOOL_USER")

    def client(self) -> Any:
        if self._client is None:
            if self._client_factory is not None:
                self._client = self._client_factory()
            else:
                from gpupool.client.api import Client
                self._client = Client.from_env(timeout=self.config.service_timeout, login_hint=False)
        return self._client

    async def _read(self, what: str, fn: Callable[[Any], Any]) -> Any:
        """``fn(client)`` in a thread, reused for ``cache_seconds``; an exception is cached too
        (a service that is down is not asked again by every tab)."""
        lock = self._locks.setdefault(what, asyncio.Lock())
        async with lock:
            hit = self._cache.get(what)
            if hit and time.monotonic() - hit[0] < self.config.cache_seconds:
                value = hit[1]
            else:
                try:
                    value = await asyncio.to_thread(lambda: fn(self.client()))
                except Exception as e:  # noqa: BLE001 - shown to the user, never a 500
                    value = e
                self._cache[what] = (time.monotonic(), value)
        if isinstance(value, Exception):
            raise value
        return value

    async def status(self) -> dict:
        try:
            jobs, nodes = await self._read("status", lambda c: (c.jobs(), c.nodes()))
            out = status(self.env, jobs, nodes, self.user)
        except Exception as e:  # noqa: BLE001
            out = status(self.env, user=self.user, error=str(e) or type(e).__name__)
        out["refresh"] = self.config.refresh_seconds
        return out

    async def queue_html(self) -> str:
        from gpupool.widgets import render
        try:
            queues, jobs = await self._read("queue", lambda c: (c.queues(), c.jobs()))
        except Exception as e:  # noqa: BLE001
            return render.status_line(f"The gpupool service could not be read: {e}", "#b71c1c")
        user = self.user
        mine = [j for j in jobs if user is None or j.get("user") == user]  # an admin's token sees everyone's
        return "".join([
            '<div class="gpupool-queue-panel">',
            '<h4 style="margin:6px 0 2px 0">Queues</h4>', render.queues_html(queues, jobs, user),
            '<h4 style="margin:10px 0 2px 0">Your jobs</h4>', render.jobs_html(mine, user),
            render.status_line(f'updated {time.strftime("%H:%M:%S")}'), "</div>"])


class StatusHandler(APIHandler):
    def initialize(self, reader: PoolReader) -> None:
        self.reader = reader

    @web.authenticated
    async def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(await self.reader.status()))


class QueueHandler(JupyterHandler):  # HTML, not JSON
    def initialize(self, reader: PoolReader) -> None:
        self.reader = reader

    @web.authenticated
    async def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.finish(await self.reader.queue_html())


def setup(serverapp: Any) -> PoolReader:
    reader = PoolReader(GPUPoolLab(parent=serverapp))
    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(".*$", [
        (url_path_join(base, "gpupool", "status"), StatusHandler, {"reader": reader}),
        (url_path_join(base, "gpupool", "queue"), QueueHandler, {"reader": reader}),
    ])
    serverapp.log.info("gpupool: status bar handlers at %s", url_path_join(base, "gpupool/"))
    return reader
