"""The pool in JupyterLab: a server extension in the single-user server and the prebuilt
JupyterLab extension (built from ``labextension/`` into ``gpupool/lab/labextension``) that shows
the workspace's GPU share, its utilisation and the user's jobs in the status bar.

``pip install gpupool`` enables both (data files in ``etc/jupyter`` and
``share/jupyter/labextensions``); docs/tools.md describes them.
"""
from __future__ import annotations

from typing import Any


def _jupyter_labextension_paths() -> list[dict]:
    return [{"src": "labextension", "dest": "gpupool-lab"}]


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "gpupool.lab"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from .handlers import setup
    setup(serverapp)
