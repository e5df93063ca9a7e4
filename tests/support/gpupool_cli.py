"""The `gpupool` command run as a subprocess, as a user runs it: ``run`` with an environment of the
test's choosing (nothing of the test process's hub or client settings leaks in), ``cli`` as one
user of a hub (its URL and the user's token)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GPUPOOL = str(Path(sys.executable).parent / "gpupool")


def run(*args, env=None, timeout=120, cwd=None, input=None):
    e = dict(os.environ)
    for k in ("GPUPOOL_URL", "GPUPOOL_TOKEN", "GPUPOOL_API_URL", "GPUPOOL_API_TOKEN", "JUPYTERHUB_API_URL",
              "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_PUBLIC_HUB_URL"):
        e.pop(k, None)
    e["GPUPOOL_CLIENT_CONFIG"] = "/nonexistent/gpupool.json"
    e.update(env or {})
    res = subprocess.run([GPUPOOL, *args], capture_output=True, text=True, env=e, timeout=timeout, cwd=cwd,
                         input=input)
    assert "Traceback" not in res.stderr, res.stderr
    return res


def cli(hub, *args, token):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "JUPYTERHUB_"))}
    env.update(GPUPOOL_URL=hub.hub_url, GPUPOOL_TOKEN=token, GPUPOOL_CLIENT_CONFIG="/nonexistent/gpupool.json")
    res = subprocess.run([GPUPOOL, *args], capture_output=True, text=True, env=env, timeout=60)
    assert "Traceback" not in res.stderr, res.stderr
    return res
