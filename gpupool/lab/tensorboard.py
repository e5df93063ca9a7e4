"""``python -m gpupool.lab.tensorboard --port N``: TensorBoard on the user's own job logs.

A job writes TensorBoard event files into its job directory's ``tensorboard/`` folder
(:attr:`gpupool.protocol.JobDir.tensorboard`; ``gpupool.tensorboard_dir()`` inside the job). This
process keeps one folder of links, ``~/.gpupool/tensorboard/<job id>`` -> that folder, for each of
the user's jobs that has one (asked of the service with the server's own token, every
``--scan`` seconds), and serves it with TensorBoard, which reloads it as it grows. The jobs'
directories are under ``$GPUPOOL_JOB_ROOT``, which the spawner gives the workspace.
"""
from __future__ import annotations

import argparse
import logging
import os
import threading
import time

from ..protocol import Env, JobDir

log = logging.getLogger("gpupool.tensorboard")


def default_logdir() -> str:
    return os.environ.get("GPUPOOL_TENSORBOARD_LOGDIR") or os.path.join(os.path.expanduser("~"), ".gpupool", "tensorboard")


def link_jobs(logdir: str, job_root: str, jobs: list[dict]) -> list[str]:
    """Link ``logdir/<job id>`` to each job's TensorBoard folder that exists; returns the linked ids."""
    os.makedirs(logdir, exist_ok=True)
    linked = []
    for job in jobs:
        job_id = str(job.get("id") or "")
        if not job_id or os.sep in job_id or job_id.startswith("."):
            continue
        target = JobDir.of(job_root, job_id).tensorboard
        if not os.path.isdir(target):
            continue
        link = os.path.join(logdir, job_id)
        if os.path.islink(link) and os.readlink(link) == target:
            linked.append(job_id)
            continue
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(target, link)
        linked.append(job_id)
    return linked


def _scan_forever(logdir: str, job_root: str, every: float) -> None:
    from gpupool.client.api import Client
    client = None
    user = os.environ.get("JUPYTERHUB_USER")
    while True:
        try:
            client = client or Client.from_env(login_hint=False)
            jobs = [j for j in client.jobs() if user is None or j.get("user") == user]
            link_jobs(logdir, job_root, jobs)
        except Exception as e:  # noqa: BLE001 - the service may be restarting; TensorBoard keeps serving
            log.warning("gpupool: could not list your jobs for TensorBoard: %s", e)
        time.sleep(every)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="TensorBoard on your gpupool jobs' logs")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--logdir", default=default_logdir())
    p.add_argument("--scan", type=float, default=15.0, help="seconds between two looks for new jobs")
    a = p.parse_args(argv)
    os.makedirs(a.logdir, exist_ok=True)
    job_root = os.environ.get(Env.JOB_ROOT)
    if job_root:
        threading.Thread(target=_scan_forever, args=(a.logdir, job_root, a.scan), daemon=True,
                         name="gpupool-tensorboard-scan").start()
    else:
        log.warning("gpupool: %s is not set: TensorBoard shows only %s", Env.JOB_ROOT, a.logdir)
    from tensorboard import program
    tb = program.TensorBoard()
    tb.configure(argv=[None, "--logdir", a.logdir, "--port", str(a.port), "--host", "127.0.0.1",
                       "--reload_interval", "10"])
    tb.main()


if __name__ == "__main__":
    main()
