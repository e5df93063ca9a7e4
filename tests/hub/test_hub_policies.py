"""Workload policies through the real hub: a limit refuses a request on the REST API, the CLI and a
sweep, each naming the rule and where it is set; a default fills an omitted field (jobs and
workspaces); ``GET policies/effective`` and ``gpupool policy``; a child that loosens its parent
is refused by ``gpupool hub --check``. (The rules themselves: test_policies.py.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from api_fuzzing import check_documented
from hub_harness import Hub, hub_leak_check, notebook  # noqa: F401 (leak check fixture)

GPUPOOL = str(Path(sys.executable).parent / "gpupool")
QUEUES = [
    {"name": "research", "deserved": {"gpu": 2},
     "policy": {"*": {"limits": {"kinds": ["train", "interactive", "hpo-trial"]}},
                "interactive": {"limits": {"gpus": 1}}}},
    {"name": "vision", "parent": "research", "deserved": {"gpu": 2}, "users": ["alice"],
     "policy": {"train": {"defaults": {"gpus": 1, "cpu": 1}, "limits": {"gpus": 2}},
                "interactive": {"defaults": {"gpus": 0.5, "preemptible": True}},
                "hpo-trial": {"limits": {"gpus": 1}}}},
    {"name": "ops", "deserved": {"gpu": 2}},
]
REFUSED = "gpus: queue vision allows at most 2 GPUs per train job (policy of queue vision)"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("policies")
    from shared_hub import PASSWORD
    from spawner_harness import spawner_config

    with Hub(tmp, gpupool={"nodes": [{"name": "box", "gpus": 4, "gpu_memory": "24Gi"}], "queues": QUEUES},
             users=["alice", "bob"], admins=["admin"],
             extra_config=spawner_config(tmp) + f"c.DummyAuthenticator.password = {PASSWORD!r}\n") as h:
        nbformat.write(nbformat.from_dict(notebook("x = 1")), str(h.home("alice") / "tiny.ipynb"))
        yield h


def cli(hub, *args, token=None, cwd=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "JUPYTERHUB_"))}
    env.update(GPUPOOL_URL=hub.hub_url, GPUPOOL_TOKEN=token or hub.token("alice"),
               GPUPOOL_CLIENT_CONFIG="/nonexistent/gpupool.json")
    res = subprocess.run([GPUPOOL, *args], capture_output=True, text=True, env=env, timeout=120, cwd=cwd)
    assert "Traceback" not in res.stderr, res.stderr
    return res


def test_a_limit_refuses_an_api_request_naming_the_rule_and_where_it_is_set(hub):
    alice = hub.token("alice")
    nb = notebook("x = 1")
    r = hub.api("POST", "jobs", alice, json={"notebook_content": nb, "queue": "vision", "gpus": 3})
    assert r.status_code == 400 and r.json() == {"status": 400, "message": REFUSED, "field": "gpus"}, r.text
    r = hub.api("POST", "jobs", alice, json={"notebook_content": nb, "queue": "vision", "gpus": 2, "pods": 2})
    assert r.status_code == 400 and r.json()["message"] == (
        "gpus: queue vision allows at most 2 GPUs per train job (asked: 2 pods x 2 GPUs) (policy of queue vision)")
    r = hub.api("POST", "jobs", alice, json={"notebook_content": nb, "queue": "vision", "kind": "inference"})
    assert r.status_code == 400 and r.json() == {
        "status": 400, "field": "kind",
        "message": "kind: queue vision does not take inference jobs (policy of department research)"}
    # the spawner's path: a workspace beyond the department's limit
    r = hub.api("POST", "workspaces/alice", hub.service_token, json={"queue": "vision", "gpus": 2})
    assert r.status_code == 400 and r.json()["message"] == (
        "gpus: queue vision allows at most 1 GPU per workspace (policy of department research)"), r.text
    doc = hub.api("GET", "openapi.json").json()
    check_documented(doc, r)
    # a queue without a policy takes what the pool can hold
    r = hub.api("POST", "jobs", alice, json={"notebook_content": nb, "queue": "ops", "gpus": 3, "name": "big"})
    assert r.status_code == 201, r.text
    hub.api("DELETE", f"jobs/{r.json()['id']}", alice)


def test_defaults_fill_omitted_fields_of_jobs_and_workspaces(hub):
    alice = hub.token("alice")
    r = hub.api("POST", "jobs", alice, json={"notebook_content": notebook("x = 1"), "queue": "vision"})
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["gpus"], job["cpu"]) == (1, 1)  # the queue's defaults for train jobs
    assert hub.api("GET", f"jobs/{job['id']}", alice).json()["gpus"] == 1  # stored so
    r = hub.api("POST", "jobs", alice, json={"notebook_content": notebook("x = 1"), "queue": "vision",
                                             "gpu_memory": "8Gi", "cpu": 2})
    assert r.status_code == 201 and (r.json()["gpus"], r.json()["cpu"]) == (0, 2), r.text  # given: kept
    for j in (job["id"], r.json()["id"]):
        hub.api("DELETE", f"jobs/{j}", alice)
    r = hub.api("POST", "workspaces/alice", hub.service_token, json={"queue": "vision"})
    assert r.status_code == 201, r.text
    ws = r.json()
    assert (ws["gpus"], ws["preemptible"]) == (0.5, True)
    assert hub.api("DELETE", "workspaces/alice", hub.service_token).status_code == 200


def test_effective_policy_on_the_api_and_the_cli(hub):
    alice = hub.token("alice")
    r = hub.api("GET", "policies/effective?queue=vision", alice)
    assert r.status_code == 200, r.text
    [vision] = r.json()["policies"]
    assert vision["queue"] == "vision"
    assert vision["kinds"]["train"] == {
        "allowed": True, "refused_by": None,
        "defaults": {"cpu": {"value": 1.0, "set_by": "queue vision"}, "gpus": {"value": 1.0, "set_by": "queue vision"}},
        "limits": {"gpus": {"value": 2.0, "set_by": "queue vision"}}}
    assert vision["kinds"]["interactive"]["limits"] == {"gpus": {"value": 1.0, "set_by": "department research"}}
    assert vision["kinds"]["inference"]["allowed"] is False
    assert vision["kinds"]["inference"]["refused_by"] == "department research"
    doc = hub.api("GET", "openapi.json").json()
    check_documented(doc, r)
    every = hub.api("GET", "policies/effective", alice).json()["policies"]
    assert [p["queue"] for p in every] == ["vision", "ops"]
    for query, words in (("queue=research", "is a department"), ("queue=nope", "unknown queue 'nope'")):
        bad = hub.api("GET", f"policies/effective?{query}", alice)
        assert bad.status_code == 400 and words in bad.json()["message"] and bad.json()["field"] == "queue"
        check_documented(doc, bad)
    assert hub.api("GET", "policies/effective", hub.token("alice", scopes=["read:users:name!user"])).status_code == 403

    res = cli(hub, "policy", "vision")
    assert res.returncode == 0, res.stderr
    lines = [line.split() for line in res.stdout.splitlines()]
    assert lines[0] == ["queue", "vision"] and lines[1] == ["KIND", "RULE", "VALUE", "SET", "BY"]
    assert ["train", "limit", "gpus", "2", "GPUs", "queue", "vision"] in lines
    assert ["interactive", "limit", "gpus", "1", "GPU", "department", "research"] in lines
    assert ["inference", "not", "taken", "-", "department", "research"] in lines
    res = cli(hub, "policy", "vision", "--json")
    assert json.loads(res.stdout) == vision
    res = cli(hub, "policy", "research")
    assert res.returncode == 1 and "is a department" in res.stderr


def test_the_cli_and_a_sweep_print_the_refusal(hub, tmp_path):
    nb = tmp_path / "train.ipynb"
    nbformat.write(nbformat.from_dict(notebook("acc = 1")), str(nb))
    res = cli(hub, "submit", "-g", "3", "-q", "vision", str(nb))
    assert res.returncode == 1 and res.stderr.strip() == f"gpupool: error: {REFUSED}", res.stderr
    res = cli(hub, "sweep", "tiny.ipynb", "--space", "lr=1,2", "--objective", "acc", "-g", "2", "-q", "vision",
              "--trials", "2", "--storage", str(tmp_path / "sweeps.db"), cwd=tmp_path)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert ("the service refused trial 0: gpus: queue vision allows at most 1 GPU per hpo-trial job "
            "(policy of queue vision)") in res.stderr, res.stderr


@pytest.mark.browser
def test_the_dashboard_is_in_the_hubs_menu_shows_the_policies_and_refreshes_itself(hub):
    """In Chromium: the hub's Services menu links the dashboard; it lists the effective policies, names
    an unnamed server without a stray slash, and its numbers (the header's time) refresh by themselves."""
    from browser_harness import ARTIFACTS, chromium, login

    r = hub.api("POST", "workspaces/alice", hub.service_token, json={"queue": "vision"})
    assert r.status_code == 201, r.text
    ws = r.json()["id"]
    hub.wait_for(lambda: hub.api("GET", "workspaces/alice", hub.admin_token).json()["status"] == "running", 20)
    try:
        with chromium() as browser:
            page = login(browser, hub, "alice")
            page.goto(hub.hub_url + "hub/home")
            link = page.locator("a.dropdown-item", has_text="gpupool")
            assert link.get_attribute("href").rstrip("/").endswith("/services/gpupool"), link.get_attribute("href")
            page.goto(hub.hub_url + "services/gpupool/?refresh=1")
            page.wait_for_selector("#policies", timeout=30_000)
            rows = [" ".join(row.split()) for row in page.inner_text("#policies").splitlines()]
            assert "vision train limit gpus 2 GPUs queue vision" in rows, rows
            assert "vision interactive limit gpus 1 GPU department research" in rows, rows
            assert "vision inference not taken department research" in rows, rows
            held = page.inner_text("#running")
            assert f"{ws} alice\t" in held or f"{ws} alice\n" in held, held
            assert "alice/" not in held
            assert "no idle rules are configured" in page.inner_text("#idle")
            first = page.inner_text("header")
            page.wait_for_function("() => Number(document.body.dataset.refreshed || 0) >= 2", timeout=15_000)
            assert page.inner_text("header") != first  # its time moved on, without a reload
            assert page.evaluate("() => Chart.getChart(document.getElementById('queues-chart')) !== undefined")
            assert page.evaluate("() => document.body.dataset.refreshError") is None
            page.screenshot(path=str(ARTIFACTS / "dashboard-policies.png"))
    finally:
        hub.api("DELETE", "workspaces/alice", hub.service_token)


@pytest.mark.browser
def test_the_spawn_page_offers_only_what_the_policy_allows_and_preselects_its_defaults(hub):
    """In Chromium: the GPU menu follows the chosen queue's policy and pre-selects its defaults; a start
    that keeps them gets them; a value beyond the limit (forced into the form) is refused, naming the rule."""
    from browser_harness import ARTIFACTS, chromium, login, wait_for_text
    from spawner_harness import user_server

    with chromium() as browser:
        page = login(browser, hub, "alice")
        page.goto(hub.hub_url + "hub/spawn")
        page.wait_for_selector("#gpupool-gpus", timeout=30_000)

        def offered():
            return page.evaluate("() => [...document.getElementById('gpupool-gpus').options]"
                                 ".filter(o => !o.disabled && !o.hidden).map(o => o.value)")

        assert page.input_value("#gpupool-queue") == "vision"
        assert offered() == ["0", "0.25", "0.5", "1"]  # department research: at most 1 GPU per workspace
        assert page.input_value("#gpupool-gpus") == "0.5" and page.is_checked("#gpupool-preemptible")  # defaults
        assert page.inner_text("#gpupool-gpu-limit") == ("queue vision allows at most 1 GPU per workspace "
                                                          "(policy of department research)")
        page.select_option("#gpupool-queue", "ops")  # no policy: what the pool holds
        assert offered() == ["0", "0.25", "0.5", "1", "2", "3", "4"] and page.inner_text("#gpupool-gpu-limit") == ""
        page.select_option("#gpupool-gpus", "3")
        page.select_option("#gpupool-queue", "vision")
        assert page.input_value("#gpupool-gpus") == "0.5" and "3" not in offered()
        page.screenshot(path=str(ARTIFACTS / "spawn-policy.png"))

        # beyond the limit anyway (a hand-made form): the refusal names the rule and where it is set
        page.evaluate("() => { const o = document.querySelector('#gpupool-gpus option[value=\"2\"]');"
                      " o.disabled = false; o.hidden = false; document.getElementById('gpupool-gpus').value = '2'; }")
        page.click("input[type=submit], button[type=submit]")
        rule = "queue vision allows at most 1 GPU per workspace (policy of department research)"
        wait_for_text(page, rule)
        hub.wait_for(lambda: user_server(hub, "alice") is None, 30)

        # the defaults as pre-selected: the server gets them
        page.goto(hub.hub_url + "hub/spawn")
        page.wait_for_selector("#gpupool-gpus", timeout=30_000)
        page.click("input[type=submit], button[type=submit]")
        got_the_defaults(hub)
    # the REST API's user_options: left out, the policy's defaults; beyond the limit, refused naming the rule
    r = hub.hub_api("POST", "users/alice/server", hub.admin_token, json={"queue": "vision", "gpus": 2})
    assert r.status_code == 400 and rule in r.json()["message"], r.text
    r = hub.hub_api("POST", "users/alice/server", hub.admin_token, json={"queue": "vision"})
    assert r.status_code in (201, 202), r.text
    got_the_defaults(hub)


def got_the_defaults(hub):
    """alice's server starts with vision's workspace defaults (then it is stopped)."""
    from spawner_harness import stop_server, wait_server_ready

    wait_server_ready(hub, "alice")
    try:
        ws = hub.api("GET", "workspaces/alice", hub.service_token).json()
        assert (ws["queue"], ws["gpus"], ws["preemptible"]) == ("vision", 0.5, True)
    finally:
        stop_server(hub, "alice")


LOOSER = """
from gpupool.hub_ext import configure
c = get_config()  # noqa
configure(c)
c.GPUPool.nodes = [{"name": "n", "gpus": 8}]
c.GPUPool.queues = [
    {"name": "research", "policy": {"interactive": {"limits": {"gpus": 1, "run_time": "8h"}}}},
    {"name": "vision", "parent": "research", "policy": {"interactive": {"limits": {"gpus": 2}}}},
]
"""


def test_a_child_that_loosens_its_parent_is_refused_by_the_check(tmp_path):
    cfg = tmp_path / "jupyterhub_config.py"
    cfg.write_text(LOOSER)
    res = subprocess.run([GPUPOOL, "hub", "--config", cfg.name, "--check"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert res.returncode == 1, res.stderr
    assert res.stderr.splitlines() == [
        f"gpupool hub: {cfg.name}: c.GPUPool.queues[1] (vision).policy.interactive.limits.gpus: 2 GPUs is looser "
        "than the 1 GPU of the policy of department research (a queue may only tighten its parent's policy)"]
    cfg.write_text(LOOSER.replace('"gpus": 2', '"gpus": 1'))
    res = subprocess.run([GPUPOOL, "hub", "--config", cfg.name, "--check"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr
