"""A notebook job's log holds what the job says: ipykernel's "Kernel is running over TCP without
encryption" warning, printed by papermill's kernel at every start, is dropped in the kernel by the
jobs' start-up hook (gpupool/startup/gpupool_quiet.py); the rest of the kernel's log stays."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import nbformat

from gpupool import protocol as P
from gpupool.startup import gpupool_caps as caps
from gpupool.startup import gpupool_quiet as quiet
from hub_harness import notebook

WARNING = "without encryption"


def _papermill(tmp_path, through_runner: bool) -> str:
    """A notebook run by papermill as a job's worker runs it (through the local backend's runner,
    which puts the start-up hook on the path), or bare; the log it leaves."""
    nb = tmp_path / "in.ipynb"
    nbformat.write(nbformat.from_dict(notebook("print('the job speaks')")), str(nb))
    log = tmp_path / ("job.log" if through_runner else "bare.log")
    cmd = [sys.executable, "-m", "papermill", str(nb), str(tmp_path / "out.ipynb"), "--log-output",
           "--no-progress-bar"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and p != P.STARTUP_DIR)
    if through_runner:
        exit_file = tmp_path / "exit.json"
        subprocess.run([sys.executable, "-m", "gpupool.backends.local", "run", "--exit-file", str(exit_file),
                        "--log", str(log), "--run-id", "test-quiet", "--", *cmd], env=env, check=True, timeout=180)
        assert P.read_exit(str(exit_file)) == 0, log.read_text()
    else:
        with open(log, "wb") as out:
            subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, check=True, timeout=180)
    return log.read_text()


def test_a_notebook_jobs_log_has_no_tcp_warning_but_a_bare_papermill_has(tmp_path):
    logged = _papermill(tmp_path, through_runner=True)
    assert "the job speaks" in logged and WARNING not in logged, logged
    bare = _papermill(tmp_path, through_runner=False)  # the same kernel without the hook warns
    assert WARNING in bare, bare


def test_only_the_tcp_warning_is_dropped_and_the_filter_is_added_once(monkeypatch):
    logger = logging.getLogger(quiet.KERNEL_LOGGER)
    monkeypatch.setattr(logger, "filters", [])
    quiet.kernel_app()
    quiet.kernel_app()
    assert len(logger.filters) == 1

    def record(msg):
        return logging.LogRecord(quiet.KERNEL_LOGGER, logging.WARNING, __file__, 1, msg, None, None)

    assert not logger.filter(record(quiet.TCP_WARNING + ". All communication ..."))
    assert logger.filter(record("Starting the kernel at pid: 1"))


def test_the_start_up_hooks_share_one_import_finder(monkeypatch):
    """The cap's hooks (torch, tensorflow) and the kernel's filter wait on the same finder."""
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, caps._AfterImport)])
    monkeypatch.delitem(sys.modules, quiet.KERNEL_APP, raising=False)
    assert quiet.install() == [quiet.KERNEL_APP]
    assert caps.after_import({"a_module_never_imported": print}) == ["a_module_never_imported"]
    finders = [f for f in sys.meta_path if isinstance(f, caps._AfterImport)]
    assert len(finders) == 1 and set(finders[0].hooks) == {quiet.KERNEL_APP, "a_module_never_imported"}
    seen = []
    assert caps.after_import({"json": seen.append}) == [] and seen == [sys.modules["json"]]  # already imported
