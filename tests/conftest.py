"""Shared fixtures for every folder of tests/, tests/support on ``sys.path`` (the helpers a test module
imports: hub_harness, kube_fixture, ...; tests/README.md lists them), and tests/shims on PYTHONPATH
(a lazy stand-in for a module that is slow to import).

* ``hub_leak_check_session`` (autouse, once for the whole run): no hub started by a test is left
  running, and none left a process behind (tests/support/hub_harness.py).
* ``hub`` (session): one real JupyterHub + gpupool service for the client-side test files
  (tests/client/: test_client, test_cli, test_sweep, test_widgets, test_browser; and
  tests/hub/test_dashboard.py), with alice's and bob's example notebooks (tests/support/shared_hub.py).
  A module that needs a hub of its own defines a module-level ``hub`` fixture, which overrides this
  one there.
"""
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the helpers every folder's test modules import (test modules never import each other)
sys.path.insert(0, str(HERE / "support"))
# tests/shims first on the path of this run and of every process it starts (hubs, servers, jobs,
# the CLI): rfc3987_syntax there loads the real one only when used (see its docstring)
SHIMS = str(HERE / "shims")
sys.path.insert(0, SHIMS)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SHIMS, os.environ.get("PYTHONPATH")]))

import nbformat  # noqa: E402
import pytest  # noqa: E402

from hub_harness import Hub, hub_leak_check_session  # noqa: E402,F401 (autouse session check)
from shared_hub import NOTEBOOKS, PASSWORD, SETTINGS  # noqa: E402


@pytest.fixture(scope="session")
def hub(tmp_path_factory, hub_leak_check_session):
    """Depends on the leak check, so pytest stops this hub before the check runs."""
    hub = Hub(tmp_path_factory.mktemp("gpupool-client"), gpupool=SETTINGS, users=["alice", "bob"], admins=["admin"],
              extra_config=f"c.DummyAuthenticator.password = {PASSWORD!r}")
    hub.start()
    try:
        for user in ("alice", "bob"):
            for name, nb in NOTEBOOKS.items():
                nbformat.write(nbformat.from_dict(nb), str(hub.home(user) / name))
        yield hub
    finally:
        hub.stop()
