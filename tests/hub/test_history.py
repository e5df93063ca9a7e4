"""A job's attempts through the real hub: when and where each ran (every rank), how it ended and
why, and the checkpoint it resumed from; in the REST answer, `gpupool describe` and `list`, and the
job widget. A notebook run that dies before its code runs is retried, with the cause in its history."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hub_harness import Hub, hub_leak_check, notebook  # noqa: F401 (leak check fixture)

pytestmark = pytest.mark.hub

GPUPOOL = str(Path(sys.executable).parent / "gpupool")
QUEUES = [
    {"name": "vision", "deserved": {"gpu": 2}, "users": ["alice"]},
    {"name": "nlp", "deserved": {"gpu": 2}, "users": ["bob"]},
]
NODES = [{"name": "box", "gpus": 4, "gpu_memory": "16Gi"}]

# both ranks step; rank 0 saves a checkpoint after each step; a stop request ends the attempt
TRAIN = """
import os, sys, time
from gpupool import checkpoint
rank = int(os.environ["RANK"])
start = (checkpoint.load(default={"step": 0}) or {"step": 0})["step"]
print(f"rank {rank} attempt {os.environ['GPUPOOL_ATTEMPT']} starts at step {start}", flush=True)
with open(f"token-{os.environ['GPUPOOL_ATTEMPT']}", "w") as f:
    f.write(os.environ["GPUPOOL_API_TOKEN"])
for step in range(start, int(sys.argv[1])):
    time.sleep(0.25)
    if rank == 0:
        checkpoint.save({"step": step + 1}, step=step + 1)
    if checkpoint.should_stop():
        print(f"rank {rank} asked to stop at step {step + 1}", flush=True)
        sys.exit(0)
print(f"rank {rank} done", flush=True)
"""

# a job that uses its token while it runs (reads its job, posts a metric), keeps it in a file, and
# then succeeds, fails or waits to be cancelled
PROBE = """
import json, os, sys, time, urllib.request
api, token, me = os.environ["GPUPOOL_API_URL"], os.environ["GPUPOOL_API_TOKEN"], os.environ["GPUPOOL_JOB_ID"]
def call(method, path, body=None):
    req = urllib.request.Request(api.rstrip("/") + "/" + path, method=method, headers={
        "Authorization": "token " + token, "Content-Type": "application/json"},
        data=json.dumps(body).encode() if body is not None else None)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status
print("while running:", call("GET", "jobs/" + me), call("POST", f"jobs/{me}/metrics", {"name": "x", "value": 1}),
      flush=True)
with open(f"token-{me}", "w") as f:
    f.write(token)
if sys.argv[1] == "fail":
    sys.exit(3)
if sys.argv[1] == "wait":
    time.sleep(120)
"""

# a kernel that dies as it starts, the first time only (or always, with "always" in its argv)
FLAKY_KERNEL = """
import os, sys
flag = os.path.join(os.path.dirname(os.path.abspath(__file__)), "died-once")
if "always" in sys.argv or not os.path.exists(flag):
    open(flag, "w").close()
    sys.exit(1)
os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *sys.argv[1:]])
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = Hub(tmp_path_factory.mktemp("history"), gpupool={"queues": QUEUES, "nodes": NODES, "preemption_grace": 15,
                                                         "startup_retries": 1})
    with h:
        (h.home("bob") / "train.py").write_text(TRAIN)
        (h.home("alice") / "probe.py").write_text(PROBE)
        for name, extra in (("flaky", []), ("dead", ["always"])):
            spec = h.home("alice") / ".local" / "share" / "jupyter" / "kernels" / name
            spec.mkdir(parents=True)
            (spec / "kernel.py").write_text(FLAKY_KERNEL)
            (spec / "kernel.json").write_text(json.dumps({
                "argv": [sys.executable, str(spec / "kernel.py"), "-f", "{connection_file}", *extra],
                "display_name": name, "language": "python"}))
        yield h


def cli(hub, user, *args):
    env = dict(os.environ, GPUPOOL_URL=hub.hub_url, GPUPOOL_TOKEN=hub.token(user),
               GPUPOOL_CLIENT_CONFIG="/nonexistent/gpupool.json")
    for k in ("GPUPOOL_API_URL", "GPUPOOL_API_TOKEN", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL"):
        env.pop(k, None)
    res = subprocess.run([GPUPOOL, *args], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    return res.stdout


def dashboard_page(hub, user: str) -> str:
    """The dashboard as ``user`` sees it: signed in to the hub, then JupyterHub's OAuth to the page."""
    import requests

    with requests.Session() as s:
        s.get(hub.hub_url + "hub/login", timeout=30)
        s.post(hub.hub_url + "hub/login", data={"username": user, "password": "x",
                                                "_xsrf": s.cookies.get("_xsrf", path="/hub/")}, timeout=30)
        r = s.get(hub.hub_url + "services/gpupool/", headers={"Accept": "text/html"}, timeout=30)
        assert r.status_code == 200 and "<html" in r.text, r.text[:500]
        return r.text


def test_a_preempted_gang_keeps_its_attempts_and_every_view_shows_them(hub):
    from gpupool.widgets import render

    alice, bob = hub.token("alice"), hub.token("bob")
    r = hub.api("POST", "jobs", bob, json={"script": "train.py", "args": ["60"], "pods": 2, "gpus": 2})
    assert r.status_code == 201, r.text
    gang = r.json()["id"]
    first = hub.wait_job(bob, gang, {"running"}, 60)  # both workers, borrowing vision's two GPUs
    placed = {(w["rank"], w["node"], tuple(w["gpus"])) for w in first["workers"]}
    ckpt = Path(hub.job_root) / gang / "checkpoints"
    hub.wait_for(lambda: len(list(ckpt.glob("ckpt-*"))) >= 2, 60, message="the gang saved no checkpoint")
    mine = hub.api("POST", "jobs", alice, json={"command": ["sleep", "2"], "gpus": 2}).json()["id"]
    victim = hub.wait_preempted(bob, [gang], 60)
    assert victim["status"] in ("preempting", "queued")
    assert hub.wait_job(alice, mine, {"succeeded", "failed"}, 90)["status"] == "succeeded"

    # the second attempt runs: the list marks it, describe tells both attempts, the widget too
    job = hub.wait_job(bob, gang, {"running"}, 90)
    assert job["attempts"] == 2 and job["exit_code"] is None, job  # not the last attempt's exit code
    one, two = job["history"]
    assert (one["attempt"], one["outcome"], one["stop_cause"], one["exit_code"]) == (1, "preempted", "preempt", 0), one
    assert one["reason"].startswith("requeued after preemption (") and "reclaim" in one["reason"], one
    assert {(p["rank"], p["node"], tuple(p["gpus"])) for p in one["placement"]} == placed
    assert one["started_at"] <= one["ended_at"] <= two["started_at"] and two["ended_at"] is None
    assert two["outcome"] is None and two["resumed_from"]["step"] >= 2, two
    step = two["resumed_from"]["step"]
    assert two["resumed_from"]["checkpoint"].endswith(f"ckpt-{step:06d}.pkl")
    assert re.search(rf"^{gang}\s.*running \(resumed x1\)", cli(hub, "bob", "list"), re.M)
    desc = cli(hub, "bob", "describe", gang)
    assert "exit code:" not in desc, desc
    assert re.search(r"^  1\. \S+ - \S+: preempted, exit 0$", desc, re.M), desc
    assert re.search(r"^     on: rank 0 on box GPU \d,\d; rank 1 on box GPU \d,\d$", desc, re.M), desc
    assert re.search(r"^  2\. \S+ - now: running$", desc, re.M) and f"resumed from: ckpt-{step:06d}.pkl (step {step})" \
        in desc, desc
    assert "why: requeued after preemption (" in desc
    html = render.job_html(job)
    assert "resumed x1" in html and 'data-attempt="1"' in html and 'data-attempt="2"' in html
    assert f"ckpt-{step:06d}.pkl (step {step})" in html and "preempted" in html
    # the preempted run's job token was revoked; the running one's works
    tokens = [(hub.home("bob") / f"token-{n}").read_text() for n in (1, 2)]
    assert [hub.api("GET", f"jobs/{gang}", t).status_code for t in tokens] == [401, 200]
    assert "resumed x1" in render.jobs_html([job])
    page = dashboard_page(hub, "bob")
    assert re.search(rf"{gang} train <span class=\"marker\" title=\"attempt 1: requeued after preemption [^\"]*\">"
                     r"resumed x1</span>", page), page

    final = hub.wait_job(bob, gang, {"succeeded", "failed"}, 120)
    assert final["status"] == "succeeded", final
    assert [a["outcome"] for a in final["history"]] == ["preempted", "succeeded"]
    assert final["history"][1]["exit_code"] == 0 and final["history"][1]["ended_at"] == final["finished_at"]
    # a finished gang still says where each worker ran (its last attempt)
    assert [(w["rank"], w["node"], len(w["gpus"])) for w in final["workers"]] == [(0, "box", 2), (1, "box", 2)]
    desc = cli(hub, "bob", "describe", gang)
    assert re.search(r"^exit code: +0$", desc, re.M) and "(not running)" not in desc, desc
    assert re.search(rf"^  rank 1: box GPUs \d,\d  \(gpupool logs {gang} --rank 1\)$", desc, re.M), desc
    log = hub.api("GET", f"jobs/{gang}/log", bob).text
    assert f"rank 0 attempt 2 starts at step {step}" in log


def test_a_kernel_that_dies_before_the_code_runs_is_retried_with_the_cause_in_its_history(hub):
    alice = hub.token("alice")
    nb = notebook("print('the code ran')")
    nb["metadata"]["kernelspec"] = {"name": "flaky", "display_name": "flaky", "language": "python"}
    job = hub.api("POST", "jobs", alice, json={"notebook_content": nb}).json()
    job = hub.wait_job(alice, job["id"], {"succeeded", "failed"}, 120)
    assert job["status"] == "succeeded" and job["attempts"] == 2, (job, hub.api("GET", f"jobs/{job['id']}/log", alice).text)
    first = job["history"][0]
    assert first["outcome"] == "retried" and first["exit_code"] == 1, first
    assert first["reason"] == ("requeued: its run died before its code ran (RuntimeError: Kernel died before replying "
                               "to kernel_info), a failure of the machinery, not of the job; retry 1 of at most 1")
    assert "the code ran" in hub.api("GET", f"jobs/{job['id']}/log", alice).text
    # a kernel that never starts: retried startup_retries times, then failed, saying so
    nb["metadata"]["kernelspec"]["name"] = "dead"
    job = hub.api("POST", "jobs", alice, json={"notebook_content": nb}).json()
    job = hub.wait_job(alice, job["id"], {"succeeded", "failed"}, 120)
    assert job["status"] == "failed" and [a["outcome"] for a in job["history"]] == ["retried", "failed"], job
    assert job["reason"] == ("failed: RuntimeError: Kernel died before replying to kernel_info; it died before its "
                             "code ran in 2 attempts")
    # the user's own error is not retried
    job = hub.api("POST", "jobs", alice, json={"notebook_content": notebook("raise ValueError('mine')")}).json()
    job = hub.wait_job(alice, job["id"], {"succeeded", "failed"}, 120)
    assert job["status"] == "failed" and job["attempts"] == 1 and job["history"][0]["outcome"] == "failed", job


def test_a_job_token_is_revoked_when_its_run_ends(hub):
    """After success, failure and cancel (a preemption: above) the run's token reads nothing and
    posts no metric: 401."""
    alice = hub.token("alice")
    ids = {mode: hub.api("POST", "jobs", alice, json={"script": "probe.py", "args": [mode]}).json()["id"]
           for mode in ("ok", "fail", "wait")}
    token_file = hub.home("alice") / f"token-{ids['wait']}"
    hub.wait_for(token_file.exists, 60, message="the job to cancel never ran")
    assert hub.api("DELETE", f"jobs/{ids['wait']}", alice).status_code == 200
    for mode, status in (("ok", "succeeded"), ("fail", "failed"), ("wait", "cancelled")):
        job = hub.wait_job(alice, ids[mode], {status}, 90)
        hub.wait_for(lambda: hub.api("GET", f"jobs/{ids[mode]}", alice).json()["allocation"] == [], 30)
        log = hub.api("GET", f"jobs/{job['id']}/log", alice).text
        assert "while running: 200 201" in log, log
        token = (hub.home("alice") / f"token-{job['id']}").read_text()
        assert hub.api("GET", f"jobs/{job['id']}", token).status_code == 401, mode
        r = hub.api("POST", f"jobs/{job['id']}/metrics", token, json={"name": "x", "value": 2})
        assert r.status_code == 401 and "job token" in r.json()["message"], (mode, r.text)
