"""The ``c.GPUPool`` knobs of model endpoints (``kind: inference``; ``GPUPool`` inherits them):
restarts, the readiness probe, the proxy's timeout and the port a pod serves on. docs/endpoints.md
says how endpoints work."""
from __future__ import annotations

from typing import Any

from traitlets import Float, Integer
from traitlets.config import Configurable


class EndpointSettings(Configurable):
    """Model endpoints (``c.GPUPool.*``)."""

    endpoint_restarts = Integer(
        5,
        help="""How often an endpoint's server is restarted after it exits with an error or is
        killed, per replica and attempt, before the endpoint fails (local backend: its runner waits
        1, 2, 4 ... up to 30 s between restarts; Kubernetes restarts the container itself, with its
        own back-off). 0: never restarted.""",
    ).tag(config=True)

    endpoint_probe_seconds = Float(
        1.0,
        help="""How often the service asks every replica of a running endpoint for ``/`` (its readiness
        probe): an endpoint is ``starting`` until a replica answers with any HTTP status below 500,
        then ``ready``; a replica that stops answering gets no requests until it answers again.
        0 turns the probe off (endpoints then stay ``starting`` and the URL answers 503).""",
    ).tag(config=True)

    endpoint_timeout = Float(
        300.0,
        help="""Seconds the service waits for an endpoint's answer to one proxied request before it
        answers 504 (a model's first request may be slow).""",
    ).tag(config=True)

    endpoint_port = Integer(
        8000,
        help="""Kubernetes: the container port an endpoint's server listens on (``$PORT``) and the
        port of the Service in front of its pods. The local backend picks a free port per replica.""",
    ).tag(config=True)


def endpoint_errors(pool: Any) -> list[str]:
    """One sentence per bad endpoint knob of ``pool`` (a GPUPool)."""
    errors = []
    if pool.endpoint_restarts < 0:
        errors.append("c.GPUPool.endpoint_restarts: must be 0 or more")
    if pool.endpoint_probe_seconds < 0:
        errors.append("c.GPUPool.endpoint_probe_seconds: must be 0 (off) or more")
    if pool.endpoint_timeout <= 0:
        errors.append("c.GPUPool.endpoint_timeout: must be more than 0 seconds")
    if not 1 <= pool.endpoint_port <= 65535:
        errors.append("c.GPUPool.endpoint_port: must be a TCP port, 1 to 65535")
    return errors
