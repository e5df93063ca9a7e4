"""Policy limits on node pools and images, and choosing a pool on the spawn page, through the real
hub: a request for a pool or an image the queue's policy does not allow is refused on the API and
the CLI, naming the rule; ``GET policies/effective`` and ``gpupool policy`` show the limits; in
Chromium the spawn page offers only the pools the chosen queue may use (quota and policy) and the
pool picked is the workspace's ``pools``. (The rules: test_policy_pools_images.py.)"""
from __future__ import annotations

import pytest

from hub_harness import Hub, hub_leak_check, notebook  # noqa: F401 (leak check fixture)

NODES = [{"name": "small", "gpus": 2, "gpu_memory": "24Gi", "pool": "build"},
         {"name": "big", "gpus": 2, "gpu_memory": "80Gi", "pool": "train"}]
QUEUES = [
    {"name": "research", "deserved": {"gpu": 4},
     "policy": {"interactive": {"limits": {"images": ["quay.io/jupyter/*"]}}}},
    {"name": "vision", "parent": "research", "users": ["alice"],
     "pools": {"build": {"deserved": {"gpu": 1}}, "train": {"deserved": {"gpu": 1}}},
     "policy": {"interactive": {"limits": {"pools": ["build"]}}}},
    {"name": "nlp", "parent": "research", "users": ["alice"],
     "pools": {"build": {"deserved": {"gpu": 1}}, "train": {"deserved": {"gpu": 1}}}},
]
RULE = "pools: queue vision may not use pool 'train' for workspaces (allowed: build; policy of queue vision)"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    from shared_hub import PASSWORD
    from spawner_harness import spawner_config as _extra

    tmp = tmp_path_factory.mktemp("policy-pools")
    with Hub(tmp, gpupool={"nodes": NODES, "queues": QUEUES}, users=["alice"], admins=["admin"],
             extra_config=_extra(tmp) + f"c.DummyAuthenticator.password = {PASSWORD!r}\n") as h:
        yield h


def test_pool_and_image_limits_refuse_naming_the_rule_on_the_api_and_the_cli(hub):
    from api_fuzzing import check_documented
    from gpupool_cli import cli

    doc = hub.api("GET", "openapi.json").json()
    r = hub.api("POST", "workspaces/alice", hub.service_token, json={"queue": "vision", "gpus": 1, "pools": ["train"]})
    assert r.status_code == 400 and r.json() == {"status": 400, "message": RULE, "field": "pools"}, r.text
    check_documented(doc, r)
    r = hub.api("POST", "workspaces/alice", hub.service_token,
                json={"queue": "nlp", "gpus": 1, "image": "docker.io/me/miner:latest"})
    assert r.status_code == 400 and r.json()["message"] == (
        "image: queue nlp does not allow image 'docker.io/me/miner:latest' for workspaces (allowed: "
        "quay.io/jupyter/*; policy of department research)"), r.text
    # allowed: as asked (the image of a Kubernetes profile; pools naming none: only the allowed ones)
    r = hub.api("POST", "workspaces/alice/ok", hub.service_token,
                json={"queue": "vision", "gpus": 1, "image": "quay.io/jupyter/scipy-notebook:latest"})
    assert r.status_code in (200, 201) and r.json()["pools"] == ["build"], r.text
    hub.api("DELETE", "workspaces/alice/ok", hub.service_token)
    # jobs of vision may use either pool (the limit is the workspaces')
    job = hub.api("POST", "jobs", hub.token("alice"), json={"notebook_content": notebook("x = 1"), "queue": "vision",
                                                              "pools": ["train"], "gpus": 1})
    assert job.status_code == 201, job.text
    hub.api("DELETE", f"jobs/{job.json()['id']}", hub.token("alice"))

    [vision] = hub.api("GET", "policies/effective?queue=vision", hub.token("alice")).json()["policies"]
    assert vision["kinds"]["interactive"]["limits"] == {
        "images": {"value": ["quay.io/jupyter/*"], "set_by": "department research"},
        "pools": {"value": ["build"], "set_by": "queue vision"}}
    res = cli(hub, "policy", "vision", token=hub.token("alice"))
    lines = [line.split() for line in res.stdout.splitlines()]
    assert ["interactive", "limit", "pools", "build", "queue", "vision"] in lines, res.stdout
    assert ["interactive", "limit", "images", "quay.io/jupyter/*", "department", "research"] in lines


def test_the_spawn_page_offers_the_queues_pools_and_the_choice_is_the_workspaces(hub):
    from browser_harness import ARTIFACTS, chromium, login, wait_for_text
    from spawner_harness import stop_server as _stop, user_server as _server, wait_server_ready as _wait_ready

    with chromium() as browser:
        page = login(browser, hub, "alice")
        page.goto(hub.hub_url + "hub/spawn")
        page.wait_for_selector("#gpupool-pool", timeout=30_000)

        def offered():
            return page.evaluate("() => [...document.getElementById('gpupool-pool').options]"
                                 ".filter(o => !o.disabled && !o.hidden).map(o => o.value)")

        assert page.input_value("#gpupool-queue") == "vision"
        assert offered() == ["", "build"]  # vision's policy: workspaces in build only
        page.select_option("#gpupool-queue", "nlp")
        assert offered() == ["", "build", "train"]
        page.select_option("#gpupool-pool", "train")
        page.select_option("#gpupool-queue", "vision")  # train is not vision's: back to "any"
        assert page.input_value("#gpupool-pool") == "" and offered() == ["", "build"]
        page.select_option("#gpupool-queue", "nlp")
        page.select_option("#gpupool-pool", "train")
        page.select_option("#gpupool-gpus", "1")
        page.screenshot(path=str(ARTIFACTS / "spawn-pool.png"))
        page.click("input[type=submit], button[type=submit]")
        _wait_ready(hub, "alice")
        ws = hub.api("GET", "workspaces/alice", hub.service_token).json()
        assert (ws["queue"], ws["pools"], ws["allocation"][0]["node"]) == ("nlp", ["train"], "big"), ws
        _stop(hub, "alice")
        hub.wait_for(lambda: _server(hub, "alice") is None, 30)

        # a pool the queue may not use (a hand-made form): refused, naming the rule
        page.goto(hub.hub_url + "hub/spawn")
        page.wait_for_selector("#gpupool-pool", timeout=30_000)
        assert page.input_value("#gpupool-pool") == "train"  # the last choice, with its queue
        page.select_option("#gpupool-queue", "vision")
        page.select_option("#gpupool-gpus", "1")
        page.evaluate("() => { const o = document.querySelector('#gpupool-pool option[value=\"train\"]');"
                      " o.disabled = false; o.hidden = false; document.getElementById('gpupool-pool').value = 'train'; }")
        page.click("input[type=submit], button[type=submit]")
        wait_for_text(page, RULE.split(': ', 1)[1])
    hub.wait_for(lambda: _server(hub, "alice") is None, 30)
