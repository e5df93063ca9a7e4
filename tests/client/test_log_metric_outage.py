"""``gpupool.log_metric`` while the service is away (gpupool/client/metrics.py): a training step
never waits on it (one post has a bounded timeout, then values are buffered without touching the
network), the buffer is sent in order once the service answers, at the process's exit too; a
refused value is dropped with a warning. Against a stand-in service on a real socket: down
(nothing listens), hung (accepts, never answers), failing (503), refusing (400)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dcgm_standin import free_port
from gpupool.client import metrics

JOB = "j-000007"


class Service:
    """``POST .../jobs/<id>/metrics`` on a port: records each value, or answers ``status``."""

    def __init__(self, port: int = 0, status: int = 201, fail_first: int = 0):
        self.posted: list[tuple[str, float, int]] = []
        self.status, self.fail_first = status, fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if outer.fail_first > 0:
                    outer.fail_first -= 1
                    code = 503
                else:
                    code = outer.status
                if code < 400:
                    outer.posted.append((body["name"], body["value"], body.get("step")))
                message = "the service is restarting" if code == 503 else "no such metric"
                answer = json.dumps({"ok": code < 400, "message": message, "field": "name"}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/services/gpupool/api/v1/"


@pytest.fixture
def in_a_job(monkeypatch):
    """This process as a job's: its environment, and log_metric's state fresh (no client, empty buffer)."""
    monkeypatch.setenv("GPUPOOL_JOB_ID", JOB)
    monkeypatch.setenv("GPUPOOL_API_TOKEN", "job-token")
    monkeypatch.setattr(metrics, "_client", None)
    monkeypatch.setattr(metrics, "_steps", {})
    monkeypatch.setattr(metrics, "_buffer", metrics._Buffer())

    def at(port: int) -> None:
        monkeypatch.setenv("GPUPOOL_API_URL", url(port))
        metrics._client = None
    return at


def test_a_service_that_is_down_buffers_and_gets_every_value_in_order_once_it_answers(in_a_job):
    port = free_port()
    in_a_job(port)  # nothing listens there: the service is down (restarting)
    with pytest.warns(RuntimeWarning, match="buffering metrics"):
        assert metrics.log_metric("loss", 1.0) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not at every step
        assert metrics.log_metric("loss", 0.5) is False
        assert metrics.log_metric("val_acc", 0.25) is False
    assert len(metrics._buffer) == 3
    service = Service(port)  # back
    try:
        assert metrics.flush(timeout=20) is True
        assert service.posted == [("loss", 1.0, 0), ("loss", 0.5, 1), ("val_acc", 0.25, 0)]
        assert metrics.log_metric("loss", 0.25) is True  # answered at once again
        assert service.posted[-1] == ("loss", 0.25, 2)
    finally:
        service.close()


def test_a_hung_service_costs_one_bounded_post_then_no_step_touches_the_network(in_a_job, monkeypatch):
    monkeypatch.setattr(metrics, "SEND_TIMEOUT", 0.5)
    connections = []
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    stop = threading.Event()

    def accept():  # takes connections and never answers
        hung.settimeout(0.1)
        while not stop.is_set():
            try:
                connections.append(hung.accept()[0])
            except OSError:
                continue
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    in_a_job(hung.getsockname()[1])
    monkeypatch.setattr(metrics._Buffer, "_run", lambda self: None)  # no background sender in this test
    try:
        assert metrics._job_client()[1].timeout == 0.5  # one post waits SEND_TIMEOUT at most
        with pytest.warns(RuntimeWarning, match="did not answer within 0.5s"):
            assert metrics.log_metric("loss", 1.0) is False
        for step in range(1, 20):
            assert metrics.log_metric("loss", 1.0 / step) is False
        assert len(connections) == 1 and len(metrics._buffer) == 20  # 19 steps without a request
    finally:
        stop.set()
        t.join()
        for c in connections:
            c.close()
        hung.close()


def test_the_background_sender_retries_a_failing_service(in_a_job):
    service = Service(fail_first=2)  # the hub's proxy answers 503 while the service restarts
    in_a_job(service.port)
    try:
        with pytest.warns(RuntimeWarning, match="the service is restarting"):
            assert metrics.log_metric("loss", 1.0) is False
        deadline = threading.Event()
        for _ in range(100):  # 503 again, then sent: the thread backs off 1 s, then 2 s
            # the service records the value before it answers; the sender drops it from the
            # buffer after the answer, so both are waited for
            if service.posted and len(metrics._buffer) == 0:
                break
            deadline.wait(0.1)
        assert service.posted == [("loss", 1.0, 0)] and len(metrics._buffer) == 0
    finally:
        service.close()


def test_a_refused_value_is_dropped_with_a_warning_not_buffered(in_a_job):
    service = Service(status=400)
    in_a_job(service.port)
    try:
        with pytest.warns(RuntimeWarning, match="was not recorded: no such metric"):
            assert metrics.log_metric("loss", 1.0) is False
        assert len(metrics._buffer) == 0 and service.posted == []
    finally:
        service.close()


def test_what_is_buffered_is_sent_at_the_processs_exit(tmp_path):
    """A job that ends right after its last step: the exit sends the buffer (papermill's kernel,
    a script)."""
    service = Service(fail_first=1)
    try:
        env = {**os.environ, "GPUPOOL_JOB_ID": JOB, "GPUPOOL_API_URL": url(service.port),
               "GPUPOOL_API_TOKEN": "t"}
        code = "import gpupool, warnings; warnings.simplefilter('ignore'); print(gpupool.log_metric('acc', 0.9))"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "False", out.stderr  # buffered: the service answered 503
        assert service.posted == [("acc", 0.9, 0)], out.stderr
    finally:
        service.close()
