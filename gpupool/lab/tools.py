"""Tools in workspaces, through jupyter-server-proxy: TensorBoard in JupyterLab's launcher, on the
user's own job logs (registered as the ``jupyter_serverproxy_servers`` entry point ``tensorboard``
in pyproject.toml). Any other port of the workspace is reachable at ``/user/NAME/proxy/PORT/``
by jupyter-server-proxy itself. docs/tools.md has both.
"""
from __future__ import annotations

import sys


def tensorboard() -> dict:
    """jupyter-server-proxy's description of the TensorBoard process (started on first use)."""
    return {
        "command": [sys.executable, "-m", "gpupool.lab.tensorboard", "--port", "{port}"],
        "timeout": 120,  # TensorBoard imports for a few seconds before it listens
        "absolute_url": False,  # TensorBoard's links are relative: it is served as if at /
        "new_browser_tab": True,
        "launcher_entry": {"enabled": True, "title": "TensorBoard", "category": "Notebook"},
    }
