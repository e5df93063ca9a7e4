"""The pool in JupyterLab's status bar, and TensorBoard from the launcher, in headless Chromium.

A real hub (tests/support/hub_harness.py) with LocalGPUSpawner starts alice's JupyterLab on half a GPU of
a declared H100 node; the browser logs in, opens /user/alice/lab and reads the status-bar item
(share, model and alice's queued job), clicks it for the queue panel, then opens TensorBoard from
the launcher on alice's own job logs. bob's server (no GPU) answers "CPU only" through the hub.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from browser_harness import ARGS, ARTIFACTS, CHROMIUM
from hub_harness import Hub, hub_leak_check  # noqa: F401 (leak check fixtures)

from gpupool.protocol import JobDir

pytestmark = [pytest.mark.browser, pytest.mark.hub, pytest.mark.slow]

SINGLEUSER = str(Path(sys.executable).parent / "jupyterhub-singleuser")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (run `make browser-deps` or apt-get install chromium)")
    tmp = tmp_path_factory.mktemp("statusbar")
    extra = f"""
c.JupyterHub.spawner_class = "gpupool.spawner.LocalGPUSpawner"
c.LocalGPUSpawner.home_root = {str(tmp / 'home')!r}
c.Spawner.cmd = [{SINGLEUSER!r}]
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 90
c.Spawner.poll_interval = 1
c.Spawner.environment = {{"JUPYTERLAB_SETTINGS_DIR": {str(tmp / 'lab-settings')!r},
                          "JUPYTERLAB_WORKSPACES_DIR": {str(tmp / 'lab-ws')!r}}}
c.Spawner.args = ["--LabApp.news_url=", "--LabApp.expose_app_in_browser=True", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                  "--GPUPoolLab.refresh_seconds=1", "--GPUPoolLab.cache_seconds=0.5"]
c.LocalGPUSpawner.admission_poll_interval = 0.2
c.LocalGPUSpawner.admission_timeout = 60
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0.5}}
"""
    gp = {"nodes": [{"name": "box", "gpus": 2, "gpu_memory": "80Gi", "gpu_model": "NVIDIA H100 80GB HBM3"}],
          "queues": [{"name": "vision", "deserved": {"gpu": 1}, "users": ["alice"]},
                     {"name": "nlp", "deserved": {"gpu": 1}, "users": ["bob"]}]}
    with Hub(tmp, gpupool=gp, users=["alice", "bob"], admins=["admin"], extra_config=extra) as h:
        yield h


def _write_scalar(logdir, tag, value):
    """A job's TensorBoard log, as SummaryWriter.add_scalar writes it."""
    import time

    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    w = EventFileWriter(str(logdir))
    w.add_event(Event(wall_time=time.time(), step=0, summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)])))
    w.close()


def _start(hub, user, options):
    r = hub.hub_api("POST", f"users/{user}/server", hub.admin_token, json=options)
    assert r.status_code in (201, 202), f"{r.text}\n{hub.hub_log()[-4000:]}"

    def ready():
        s = hub.hub_api("GET", f"users/{user}", hub.admin_token).json()["servers"].get("")
        return s if s and s.get("ready") else None
    try:
        hub.wait_for(ready, 120, 0.5)
    except AssertionError:
        raise AssertionError(f"{user}'s server is not ready\n{hub.hub_log()[-6000:]}") from None


def test_status_bar_shows_the_share_and_tensorboard_opens(hub):
    import requests
    from playwright.sync_api import sync_playwright

    alice = hub.token("alice")
    _start(hub, "alice", {"gpus": 0.5, "queue": "vision"})
    _start(hub, "bob", {"gpus": 0, "queue": "nlp"})
    # a job of alice's that cannot start (the node has 1.5 GPUs left), and one with TensorBoard logs
    waiting = hub.api("POST", "jobs", alice, json={"command": ["sleep", "300"], "gpus": 2, "queue": "vision",
                                                   "preemptible": False})
    assert waiting.status_code == 201, waiting.text
    hub.wait_job(alice, waiting.json()["id"], {"queued"})
    _write_scalar(JobDir.of(str(hub.job_root), waiting.json()["id"]).tensorboard, "val_acc", 0.75)
    # bob's server, through the hub: the server extension's answer for a workspace without a GPU
    r = requests.get(hub.hub_url + "user/bob/gpupool/status", timeout=20,
                     headers={"Authorization": f"token {hub.token('bob')}"})
    assert r.status_code == 200, r.text[:500]
    assert r.json()["label"] == "CPU only" and r.json()["cpu_only"] is True

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            try:
                page.goto(hub.hub_url + "hub/login")
                page.fill("input[name=username]", "alice")
                page.fill("input[name=password]", "x")
                page.click("input[type=submit], button[type=submit]")
                page.goto(hub.hub_url + "user/alice/lab")
                item = page.locator("#gpupool-status")
                item.wait_for(timeout=120_000)
                page.wait_for_function(
                    "() => (document.querySelector('#gpupool-status') || {}).textContent.includes('queued')",
                    timeout=60_000)
                label = item.inner_text()
                assert label == "GPU 0.5 H100 · 1 queued", label
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "statusbar.png"))
                # the click opens the queue panel: the widgets' queue view and alice's jobs
                item.click()
                page.wait_for_selector(".gpupool-queue-panel table.gpupool-queues", timeout=60_000)
                panel = page.inner_text(".gpupool-queue-panel")
                assert "vision" in panel and waiting.json()["id"] in panel, panel
                # TensorBoard from the launcher, in a new tab, served through the server's proxy
                page.evaluate("() => window.jupyterapp ? window.jupyterapp.commands.execute('launcher:create')"
                              " : null")
                # the visible card: the launcher lab opened at the start may still be there, behind a tab
                card = page.locator('.jp-LauncherCard[title^="TensorBoard"]:visible, '
                                    '.jp-LauncherCard:has-text("TensorBoard"):visible').first
                card.wait_for(timeout=60_000)
                with page.context.expect_page(timeout=60_000) as opened:
                    card.click()
                tb = opened.value
                tb.wait_for_load_state("domcontentloaded", timeout=120_000)
                assert "/user/alice/tensorboard" in tb.url, tb.url
                tb.wait_for_function("() => document.title.includes('TensorBoard')", timeout=120_000)
                tb.screenshot(path=str(ARTIFACTS / "tensorboard.png"))
                # it reads alice's job's logs: the job is a run, with its scalar
                runs = hub.wait_for(lambda: [r for r in tb.request.get(tb.url.split("#")[0] + "data/runs").json()
                                             if r == waiting.json()["id"]], 60, 1)
                assert runs == [waiting.json()["id"]]
            except Exception:
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "statusbar-failure.png"))
                raise
        finally:
            browser.close()
    hub.api("DELETE", f"jobs/{waiting.json()['id']}", alice)
