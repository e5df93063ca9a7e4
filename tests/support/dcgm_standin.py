"""A stand-in for NVIDIA's DCGM exporter (tests): an HTTP server whose ``/metrics`` answers in the
exporter's format (its metric names and labels: ``gpu``, ``UUID``, ``device``, ``modelName``,
``Hostname``, and with its Kubernetes mapping ``namespace``, ``pod``, ``container``), and a real
Prometheus server (Debian's ``prometheus`` package; ``make test-deps`` installs it) that scrapes
it every second."""
from __future__ import annotations

import contextlib
import http.server
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

HELP = {"DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).", "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
        "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB)."}


class Exporter:
    """``gpus``: a list of dicts with the labels of each GPU and its ``util`` (%), ``used`` and
    ``free`` (MiB); change them and the next scrape sees it."""

    def __init__(self, gpus: list[dict]):
        self.gpus = gpus
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def text(self) -> str:
        lines = []
        for name, key in (("DCGM_FI_DEV_GPU_UTIL", "util"), ("DCGM_FI_DEV_FB_USED", "used"),
                          ("DCGM_FI_DEV_FB_FREE", "free")):
            lines += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} gauge"]
            for g in self.gpus:
                labels = ",".join(f'{k}="{v}"' for k, v in g.items() if k not in ("util", "used", "free"))
                lines.append(f"{name}{{{labels}}} {g[key]}")
        return "\n".join(lines) + "\n"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(url: str, promql: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


@contextlib.contextmanager
def prometheus(tmp_path, exporter: Exporter, wait_for: int = 1):
    """A Prometheus scraping ``exporter`` every second; yields its URL once it holds ``wait_for``
    DCGM_FI_DEV_GPU_UTIL series."""
    import pytest

    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Prometheus is not installed (Debian: apt-get install prometheus; `make prometheus-deps` does it)")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                      "scrape_configs:\n- job_name: dcgm\n  static_configs:\n"
                      f"  - targets: ['127.0.0.1:{exporter.port}']\n")
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if len(query(url, "DCGM_FI_DEV_GPU_UTIL")) >= wait_for:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("Prometheus did not scrape the exporter: "
                                     + (tmp_path / "prometheus.log").read_text()[-2000:])
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def wait_for_value(url: str, promql: str, value: float, timeout: float = 30.0) -> None:
    """Until every series of ``promql`` reads ``value`` (the next scrapes have happened)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = query(url, promql)
        if found and all(float(s["value"][1]) == value for s in found):
            return
        time.sleep(0.25)
    raise AssertionError(f"{promql} never read {value}")
