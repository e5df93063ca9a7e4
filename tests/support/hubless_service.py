"""The gpupool service's parts without a hub (tests/hub/test_idle_held.py, tests/kube/test_dcgm.py):
settings loaded from a dict, the database's sessions and the scheduling loop on the local backend,
for the idle check and the sampler to run against."""
from __future__ import annotations

QUEUES = [{"name": "q", "deserved": {"gpu": 2}}]


def service_parts(tmp_path, nodes, queues, idle_rules):
    """What the idle check and the sampler need, without a hub: the settings, the database's
    sessions and the loop (the ledger follows its rows)."""
    from gpupool.backends.local import LocalBackend
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.config import load as load_config
    from gpupool.hub_ext.runtime.loop import SchedulerLoop

    settings = load_config({"nodes": nodes, "queues": queues, "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}",
                            "job_root": str(tmp_path / "jobs"), "work_dir": str(tmp_path), "run_as_user": False,
                            "idle_rules": idle_rules}, discover=False)
    sessions = D.make_sessionmaker(D.make_engine(settings.pool.db_url))
    return settings, sessions, SchedulerLoop(settings, sessions, LocalBackend())
