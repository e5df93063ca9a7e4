"""The dashboard in a real browser: JupyterLab (and Notebook 7) in headless Chromium, driven by Playwright.

A standalone ``jupyter lab`` runs with the environment JupyterHub gives a single-user server of
the test hub (JUPYTERHUB_API_URL, JUPYTERHUB_PUBLIC_HUB_URL, JUPYTERHUB_API_TOKEN, JUPYTERHUB_USER),
so ``gpupool`` in its kernel finds the real service by itself. A cell runs ``gpupool.dashboard()``;
the test checks the rendered widget and saves test-artifacts/dashboard.png.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest
import requests

from browser_harness import ARGS, ARTIFACTS, CHROMIUM
from hub_harness import free_port

pytestmark = [pytest.mark.browser, pytest.mark.hub, pytest.mark.slow]



def _pids_with(marker: bytes) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/environ", "rb") as f:
                    if marker in f.read():
                        out.append(int(p))
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def hub(hub):
    """The shared client hub (tests/conftest.py), once Chromium is known to be there."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (run `make browser-deps` or apt-get install chromium)")
    return hub


@pytest.fixture(scope="module")
def lab(hub, tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import gpupool\nd = gpupool.dashboard(interval=2)\nd")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(root / "dashboard.ipynb"))
    port, token, marker = free_port(), secrets.token_hex(16), f"GPUPOOL_BROWSER_TEST={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "JUPYTERHUB_"))}
    alice_token = hub.token("alice")
    env.update({
        # what JupyterHub puts in a single-user server's environment
        "JUPYTERHUB_API_URL": hub.hub_api_url, "JUPYTERHUB_BASE_URL": "/", "JUPYTERHUB_USER": "alice",
        "JUPYTERHUB_PUBLIC_HUB_URL": hub.hub_url + "hub/", "JUPYTERHUB_API_TOKEN": alice_token,
        "JUPYTERHUB_SERVICE_PREFIX": "/user/alice/",
        "JUPYTER_CONFIG_DIR": str(root / ".jupyter"), "JUPYTER_RUNTIME_DIR": str(root / ".runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(root / ".lab-settings"), "JUPYTERLAB_WORKSPACES_DIR": str(root / ".lab-ws"),
        "GPUPOOL_CLIENT_CONFIG": str(root / "no-config.json"), marker.split("=")[0]: marker.split("=")[1],
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    })
    log = open(root / "lab.log", "wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "jupyter-lab"), "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
         "--JupyterNotebookApp.expose_app_in_browser=True", "--LabApp.news_url=",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"jupyter lab exited: {(root / 'lab.log').read_text()[-3000:]}")
        try:
            return requests.get(url + "api/status", params={"token": token}, timeout=2).ok
        except requests.RequestException:
            return False
    try:
        hub.wait_for(up, 120, 0.5, "jupyter lab did not start")
        yield {"url": url, "token": token, "root": root}
    finally:
        try:  # shut kernels down, then the server; then anything still carrying our marker
            for k in requests.get(url + "api/kernels", params={"token": token}, timeout=5).json():
                requests.delete(url + f"api/kernels/{k['id']}", params={"token": token}, timeout=10)
        except Exception:
            pass
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()
        for pid in _pids_with(marker.encode()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture(scope="module")
def running_job(hub):
    import gpupool
    from gpupool.client.api import Client
    job = gpupool.submit("sleepy.ipynb", gpus=0.5, queue="vision", client=Client(hub.hub_url, hub.token("alice")))
    hub.wait_job(job.client.token, job.id, {"running"}, timeout=60)
    yield job
    job.cancel()


def _run_dashboard(page, address: str, shot: Path) -> str:
    try:
        return _drive(page, address, shot)
    except Exception as e:
        shot.parent.mkdir(parents=True, exist_ok=True)
        fail = shot.with_name(shot.stem + "-failure.png")
        page.screenshot(path=str(fail), full_page=True)
        state = page.evaluate(
            "() => { const a = window.jupyterapp; const w = a && a.shell.currentWidget;"
            " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
            " return {app: !!a, widget: w && w.title && w.title.label, kernel: k && [k.connectionStatus, k.status],"
            " dialogs: [...document.querySelectorAll('.jp-Dialog')].map(d => d.innerText.slice(0, 200))}; }")
        raise AssertionError(f"{address}: {e}\npage state: {state}\nscreenshot: {fail}") from None


def _drive(page, address: str, shot: Path) -> str:
    page.goto(address)
    page.wait_for_function("() => window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell')",
                           timeout=120_000)
    page.wait_for_function(  # a kernel is attached and idle
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel"
        " && w.sessionContext.session.kernel.connectionStatus === 'connected'"
        " && w.sessionContext.session.kernel.status === 'idle'; }", timeout=120_000)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_selector(".gpupool-dashboard table.gpupool-queues", timeout=120_000)
    page.wait_for_selector(".gpupool-dashboard table.gpupool-gpus", timeout=60_000)
    page.wait_for_timeout(2500)  # one live refresh
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    return page.inner_text(".gpupool-dashboard")


def test_dashboard_renders_in_jupyterlab_and_notebook7(hub, lab, running_job):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            text = _run_dashboard(page, f"{lab['url']}lab/tree/dashboard.ipynb?token={lab['token']}",
                                  ARTIFACTS / "dashboard.png")
            assert "vision" in text and "nlp" in text  # queues
            assert "box2" in text and "GPU 0" in text  # GPUs
            assert running_job.id in text and "you: 1 running" in text  # the user's own job, highlighted
            own = page.locator(f'.gpupool-alloc[data-workload="{running_job.id}"][data-own="true"]')
            assert own.count() == 1 and own.inner_text().strip() == "alice 0.5"
            box = own.bounding_box()
            bar = page.locator(f'.gpupool-gpu[data-node="{running_job.allocation[0]["node"]}"] .gpupool-gpu-bar').first
            assert box and abs(box["width"] / bar.bounding_box()["width"] - 0.5) < 0.05  # half the GPU's bar
            assert not [e for e in errors if "gpupool" in e.lower() or "widget" in e.lower()], errors

            page2 = browser.new_page(viewport={"width": 1400, "height": 1000})
            text = _run_dashboard(page2, f"{lab['url']}notebooks/dashboard.ipynb?token={lab['token']}",
                                  ARTIFACTS / "dashboard-notebook7.png")
            assert "vision" in text and "box2" in text and running_job.id in text
        finally:
            browser.close()
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000
