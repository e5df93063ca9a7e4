"""A hub with GPUPool's LocalGPUSpawner starting lean single-user servers, driven through the hub's
REST API as a browser or a script would (tests/spawner/test_spawner.py, and the hub tests that
start servers: idle, policies, pools)."""
from __future__ import annotations

import sys
from pathlib import Path

SINGLEUSER = str(Path(sys.executable).parent / "jupyterhub-singleuser")
# A lean single-user server: the Jupyter server without the lab/notebook UIs (they only slow start-up).
LEAN = ("jupyterlab", "notebook", "jupyter_lsp", "notebook_shim", "jupyter_server_terminals")


def spawner_config(tmp) -> str:
    """Hub config for LocalGPUSpawner with lean single-user servers."""
    return f"""
c.JupyterHub.spawner_class = "gpupool.spawner.LocalGPUSpawner"
c.LocalGPUSpawner.home_root = {str(tmp / 'home')!r}
c.Spawner.cmd = [{SINGLEUSER!r}]
c.Spawner.args = {[f"--ServerApp.jpserver_extensions={k}=False" for k in LEAN]!r}
c.Spawner.default_url = "/api/status"
c.Spawner.http_timeout = 60
c.Spawner.poll_interval = 1
c.LocalGPUSpawner.admission_poll_interval = 0.2
c.LocalGPUSpawner.admission_timeout = 60
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0.5}}
"""


def user_server(hub, user):
    r = hub.hub_api("GET", f"users/{user}", hub.admin_token)
    assert r.status_code == 200, r.text
    return r.json()["servers"].get("")


def start_server(hub, user, options, expect=(201, 202)):
    r = hub.hub_api("POST", f"users/{user}/server", hub.admin_token, json=options)
    assert r.status_code in expect, f"{r.text}\n{hub.hub_log()[-6000:]}"
    return r


def wait_server_ready(hub, user, timeout=60):
    def ready():
        s = user_server(hub, user)
        return s if s and s.get("ready") else None
    try:
        return hub.wait_for(ready, timeout, 0.3)
    except AssertionError:
        raise AssertionError(f"{user}'s server not ready: {user_server(hub, user)}\n{hub.hub_log()[-4000:]}") from None


def stop_server(hub, user):
    r = hub.hub_api("DELETE", f"users/{user}/server", hub.admin_token)
    assert r.status_code in (202, 204, 400), r.text
    hub.wait_for(lambda: user_server(hub, user) is None, 30, 0.3, message=f"{user}'s server did not stop")


def workspace_of(hub, user):
    r = hub.api("GET", f"workspaces/{user}", hub.service_token)
    return r.json() if r.status_code == 200 else None
