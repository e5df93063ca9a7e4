"""Shared fixtures, and tests/shims on PYTHONPATH (a lazy stand-in for a module that is slow to import).

* ``hub_leak_check_session`` (autouse, once for the whole run): no hub started by a test is left
  running, and none left a process behind (tests/hub_harness.py).
* ``hub`` (session): one real JupyterHub + gpupool service for the client-side test files
  (test_client, test_cli, test_sweep, test_widgets, test_browser), with alice's and bob's example
  notebooks. A module that needs a hub of its own defines a module-level ``hub`` fixture, which
  overrides this one there.
"""
import os
import sys
from pathlib import Path

# tests/shims first on the path of this run and of every process it starts (hubs, servers, jobs,
# the CLI): rfc3987_syntax there loads the real one only when used (see its docstring)
SHIMS = str(Path(__file__).resolve().parent / "shims")
sys.path.insert(0, SHIMS)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SHIMS, os.environ.get("PYTHONPATH")]))

import nbformat  # noqa: E402
import pytest  # noqa: E402

from hub_harness import Hub, hub_leak_check_session, notebook  # noqa: E402,F401 (autouse session check)

SETTINGS = {
    "nodes": [{"name": "box", "gpus": 2, "gpu_memory": "24Gi"}, {"name": "box2", "gpus": 1, "gpu_memory": "24Gi"}],
    "queues": [{"name": "vision", "deserved": {"gpu": 2}, "users": ["alice"]},
               {"name": "nlp", "deserved": {"gpu": 1}, "users": ["bob"]}],
}
NOTEBOOKS = {
    # logs acc = lr * step for steps 0..steps-1
    "tiny.ipynb": notebook("import gpupool\nfor i in range(steps):\n    gpupool.log_metric('acc', lr * i, step=i)\n"
                           "print('trained with lr', lr)", parameters="lr = 0.1\nsteps = 3"),
    "sleepy.ipynb": notebook("import time\ntime.sleep(seconds)", parameters="seconds = 300"),
    "broken.ipynb": notebook("raise ValueError('the data set is missing')"),
    # sweep objective: score peaks at x == 3; trials with x < slow_below sleep between steps
    "quad.ipynb": notebook("import time, gpupool\nfor i in range(steps):\n"
                           "    gpupool.log_metric('score', (10 - (x - 3) ** 2) * (i + 1) / steps, step=i)\n"
                           "    time.sleep(pause if x < slow_below else 0)",
                           parameters="x = 0.0\nsteps = 3\npause = 0.0\nslow_below = -1e9"),
}


PASSWORD = "s3cret"  # the dummy authenticator's one password (`gpupool login` tests)


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
