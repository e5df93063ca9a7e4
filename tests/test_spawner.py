"""The GPU-aware spawner.

Part 1 (fast, no processes): the options form and user_options validation.
Part 2 (marker ``hub``): a real JupyterHub + configurable-http-proxy + the gpupool service
(tests/hub_harness.py) with LocalGPUSpawner starting real jupyterhub-singleuser processes, driven
through the hub's REST API like a browser or a script would.
"""
from __future__ import annotations

import pytest

from gpupool.spawner.form import GPURequest, OptionError, options_from_form, parse_user_options, render_form

GiB = 2**30


# ---------------------------------------------------------------------------------------------
# Part 1: form and validation
# ---------------------------------------------------------------------------------------------

def parse(opts, **kw):
    kw.setdefault("queues", ["vision", "shared"])
    kw.setdefault("max_gpus", 4)
    kw.setdefault("max_gpu_memory", 24 * GiB)
    return parse_user_options(opts, **kw)


def test_valid_requests():
    assert parse({}) == GPURequest(gpus=0, queue="vision", preemptible=False)
    assert parse({"gpus": 0.5}) == GPURequest(gpus=0.5, queue="vision")
    assert parse({"gpus": "2", "queue": "shared", "preemptible": "on"}) == GPURequest(2, 0, "shared", True)
    r = parse({"gpu_memory": "20Gi", "preemptible": False})
    assert (r.gpus, r.gpu_memory, r.wants_gpu) == (0, 20 * GiB, True)
    assert r.body("dev") == {"server": "dev", "preemptible": False, "gpu_memory": 20 * GiB, "queue": "vision"}
    assert parse({"gpus": 1}).body() == {"server": "", "preemptible": False, "gpus": 1.0, "queue": "vision"}
    assert parse({}, default_gpus=1, default_preemptible=True) == GPURequest(1, 0, "vision", True)
    assert parse({"gpus": 1}, queues=None).queue is None  # queue list unknown: the service decides


@pytest.mark.parametrize("opts, field, words", [
    ({"gpus": -1}, "gpus", "0 or more"),
    ({"gpus": 0.3}, "gpus", "not offered; choose 0, 0.25, 0.5 or a whole number 1..4"),
    ({"gpus": 1.5}, "gpus", "whole number"),
    ({"gpus": 5}, "gpus", "at most 4"),
    ({"gpus": "lots"}, "gpus", "not a number"),
    ({"gpus": True}, "gpus", "number of GPUs"),
    ({"gpu_memory": "20Gi", "gpus": 1}, "gpu_memory", "either gpus or gpu_memory"),
    ({"gpu_memory": "80Gi"}, "gpu_memory", "more than one GPU has (24Gi)"),
    ({"gpu_memory": "twenty"}, "gpu_memory", "not a quantity"),
    ({"gpu_memory": 0}, "gpu_memory", "more than 0"),
    ({"queue": "nlp"}, "queue", "you may not use queue 'nlp' (yours: vision, shared)"),
    ({"queue": 3}, "queue", "queue name"),
    ({"preemptible": "maybe"}, "preemptible", "true or false"),
    ({"image": "x"}, "image", "unknown option"),
])
def test_invalid_requests_name_the_field(opts, field, words):
    with pytest.raises(OptionError) as e:
        parse(opts)
    assert e.value.field == field
    assert words in e.value.message


def test_no_queue_at_all():
    with pytest.raises(OptionError, match="you have no queue, ask your admin"):
        parse({"gpus": 1, "queue": "vision"}, queues=[])
    assert parse({"gpus": 0}, queues=[]).queue is None


def test_extra_fields_allowed_when_declared():
    assert parse({"gpus": 1, "image": "x"}, extra_fields=["image"]).gpus == 1
    with pytest.raises(OptionError):
        parse(["gpus"])


def test_options_from_form():
    assert options_from_form({"gpus": ["0.5"], "queue": ["vision"], "gpu_memory": [""]}) == {
        "gpus": "0.5", "queue": "vision", "preemptible": False}
    assert options_from_form({"gpus": ["1"], "gpu_memory": ["8Gi"], "preemptible": ["on"]}) == {
        "gpu_memory": "8Gi", "preemptible": True}
    # what the form produces always validates into the intended request
    assert parse(options_from_form({"gpus": ["0.25"], "queue": ["shared"]})) == GPURequest(0.25, 0, "shared")


def test_render_form():
    queues = [{"name": "vision", "deserved": {"gpu": 4}, "allocated": {"gpu": 1.5}, "pending": 2},
              {"name": "<b>x</b>", "deserved": {"gpu": 1}, "allocated": {}, "pending": 0}]
    html = render_form(queues=queues, max_gpus=3, gpu_memory=24 * GiB, gpu_model="A10",
                       defaults={"gpus": "2", "queue": "vision", "preemptible": True}, note="Ask #gpu")
    assert 'name="gpus"' in html and 'name="gpu_memory"' in html and 'name="preemptible"' in html
    assert '<option value="0.25">' in html and '<option value="0.5">' in html
    assert '<option value="2" selected>2 GPUs</option>' in html
    assert '<option value="4"' not in html
    assert 'value="vision" selected>vision: 1.5 of 4 deserved GPUs in use, 2 waiting' in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html  # escaped
    assert " checked" in html and "24Gi (A10)" in html and "Ask #gpu" in html
    empty = render_form(queues=[], max_gpus=1)
    assert "You may not use any GPU queue" in empty and 'name="queue"' not in empty
