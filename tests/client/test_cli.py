"""The `gpupool` command, run as a subprocess against the real hub."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpupool_cli import run
from hub_harness import dead_port, notebook
from shared_hub import PASSWORD

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def env(hub):
    """alice's terminal: the hub URL and her token in the environment."""
    return {"GPUPOOL_URL": hub.hub_url, "GPUPOOL_TOKEN": hub.token("alice")}


def test_usage_errors_exit_2_without_traceback():
    res = run("submit")
    assert res.returncode == 2 and "notebook" in res.stderr
    res = run("submit", "train.ipynb", "-g", "lots")
    assert res.returncode == 2 and "'lots' is not a number of GPUs" in res.stderr
    res = run("submit", "train.ipynb", "-p", "lr", "--url", "http://127.0.0.1:1")
    assert res.returncode == 2 and "expected NAME=VALUE" in res.stderr
    res = run("sweep", "train.ipynb", "--objective", "acc", "--space", "lr=loguni(1,2)", "--url", "http://127.0.0.1:1")
    assert res.returncode == 2 and "unknown function 'loguni'" in res.stderr


def test_unreachable_service_and_missing_config_exit_1(tmp_path):
    port = dead_port()
    res = run("sweep", "train.ipynb", "--objective", "acc", "--space", "lr=1,2", "--url", f"http://127.0.0.1:{port}",
              cwd=tmp_path)
    assert res.returncode == 1 and "cannot reach the gpupool service" in res.stderr and "Is the hub running?" in res.stderr
    assert "started" not in res.stdout and not list(tmp_path.iterdir())  # no .gpupool-sweeps.db
    res = run("queues", "--url", f"http://127.0.0.1:{port}")
    assert res.returncode == 1 and f"127.0.0.1:{port}" in res.stderr and "connection refused" in res.stderr
    res = run("list")
    assert res.returncode == 1 and "does not know where the hub is: run `gpupool login https://your-hub`" in res.stderr


@pytest.mark.hub
@pytest.mark.slow
def test_submit_list_describe_logs_delete(hub, env):
    res = run("submit", "tiny.ipynb", "-g", "0.5", "-q", "vision", "-p", "lr=0.5", "-p", "steps=2", "--wait", env=env)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.split()[1]
    assert res.stdout.startswith(f"submitted {job_id} (tiny) to queue vision") and f"{job_id} succeeded" in res.stdout

    res = run("describe", job_id, env=env)
    assert res.returncode == 0 and re.search(r"^status: +succeeded$", res.stdout, re.M) and '"lr": 0.5' in res.stdout
    assert "acc: 2 points, last 0.5 at step 1" in res.stdout
    desc = json.loads(run("describe", job_id, "--json", env=env).stdout)
    assert desc["id"] == job_id and desc["metrics"]["acc"][1]["value"] == 0.5
    res = run("logs", job_id, env=env)
    assert res.returncode == 0 and "trained with lr 0.5" in res.stdout
    res = run("logs", job_id, "-f", env=env)  # a finished job: prints it all and returns
    assert res.returncode == 0 and "trained with lr 0.5" in res.stdout

    res = run("submit", "sleepy.ipynb", "--gpu-memory", "8Gi", "--kind", "inference", "--json", env=env)
    sleeper = json.loads(res.stdout)
    assert sleeper["kind"] == "inference" and sleeper["gpu_memory"] in ("8Gi", 8 * 2**30)
    listed = run("list", env=env).stdout
    assert sleeper["id"] in listed and job_id not in listed  # finished ones need --all
    assert job_id in run("list", "--all", env=env).stdout
    ids = [j["id"] for j in json.loads(run("list", "--all", "--json", env=env).stdout)]
    assert {job_id, sleeper["id"]} <= set(ids)
    hub.wait_job(env["GPUPOOL_TOKEN"], sleeper["id"], {"running"}, timeout=60)
    top = run("top", env=env).stdout
    assert "box" in top and f"alice:{sleeper['id']}(" in top
    res = run("delete", sleeper["id"], env=env)
    assert res.returncode == 0 and sleeper["id"] in res.stdout
    hub.wait_job(env["GPUPOOL_TOKEN"], sleeper["id"], {"cancelled"}, timeout=60)


@pytest.mark.hub
def test_queues_nodes_top_and_service_errors(hub, env):
    res = run("queues", env=env)
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and lines[0].split()[:5] == ["QUEUE", "PARENT", "DESERVED", "FAIR-SHARE", "ALLOCATED"]
    vision = next(line for line in lines if line.startswith("vision")).split()
    assert vision[2] == "2" and vision[-1] == "yes"
    assert next(line for line in lines if line.startswith("nlp")).split()[-1] == "no"
    assert {q["name"] for q in json.loads(run("queues", "--json", env=env).stdout)} == {"vision", "nlp"}
    nodes = run("nodes", env=env).stdout
    assert "box " in nodes and "box2" in nodes
    top = run("top", env=env).stdout.splitlines()
    assert top[0].startswith("NODE") and sum(1 for line in top[1:] if "[" in line) == 3  # 3 GPUs

    res = run("submit", "tiny.ipynb", "-g", "0.5", "-q", "nope", env=env)
    assert res.returncode == 1 and "queue: unknown queue 'nope'" in res.stderr
    res = run("submit", "tiny.ipynb", "-q", "nlp", env=env)
    assert res.returncode == 1 and "nlp" in res.stderr
    res = run("describe", "j-999999", env=env)
    assert res.returncode == 1 and "j-999999" in res.stderr
    res = run("list", "--url", hub.hub_url, "--token", "wrong", env={})
    assert res.returncode == 1 and "token" in res.stderr.lower()


@pytest.mark.hub
@pytest.mark.slow
def test_sweep_command(hub, env, tmp_path):
    res = run("sweep", "quad.ipynb", "--space", "x=2,3", "--space", "steps=2", "--objective", "score",
              "--sampler", "grid", "--parallel", "2", "-g", "0.25", "--name", "cli-sweep",
              "--storage", str(tmp_path / "sweeps.db"), "--poll", "0.5", env=env, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sweep cli-sweep: started (2 trials, 2 at a time" in res.stdout
    assert 'best: score=10 trial' in res.stdout and '{"x": 3}' in res.stdout
    assert "sweep cli-sweep finished: 2 of 2 trials done (2 complete)" in res.stdout
    trials = json.loads(run("list", "--all", "--sweep", "cli-sweep", "--json", env=env).stdout)
    assert len(trials) == 2 and {t["kind"] for t in trials} == {"hpo-trial"}
    assert sorted(t["parameters"]["x"] for t in trials) == [2, 3]
    assert all(t["parameters"]["steps"] == 2 for t in trials)


@pytest.mark.hub
@pytest.mark.slow
def test_a_local_notebook_from_a_laptop_shell(hub, env, tmp_path):
    """A notebook on this machine (not in the hub home, no kernelspec): its content is sent and it runs."""
    laptop = tmp_path / "laptop"
    (laptop / "work").mkdir(parents=True)
    nb = notebook("import gpupool\ngpupool.log_metric('acc', 0.75, step=0)\nprint('ran from the laptop')")
    del nb["metadata"]["kernelspec"]  # papermill would fail with "No kernel name found"
    (laptop / "work" / "local-only.ipynb").write_text(json.dumps(nb))
    res = run("submit", "work/local-only.ipynb", "-g", "0.5", "--wait", env=env, cwd=laptop)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"sent the content of the local file {laptop / 'work' / 'local-only.ipynb'}"
    assert re.match(r"submitted j-\d+ \(local-only\) to queue vision asking for 0\.5 GPU: queued", lines[1]), lines
    assert re.match(r"j-\d+ succeeded: the notebook ran to the end$", lines[-1]), lines
    job_id = lines[1].split()[1]
    assert "ran from the laptop" in run("logs", job_id, env=env).stdout
    res = run("output", job_id, env=env)  # the result, read without a browser
    assert res.returncode == 0 and "ran from the laptop" in res.stdout and "--- cell " in res.stdout
    res = run("output", job_id, "-o", str(laptop / "result.ipynb"), env=env)
    assert res.returncode == 0 and json.loads((laptop / "result.ipynb").read_text())["nbformat"] == 4
    assert "acc: 1 points, last 0.75" in run("describe", job_id, env=env).stdout

    # zero GPUs means a CPU-only job, said so; a memory slice is echoed and listed in Gi
    res = run("submit", "work/local-only.ipynb", "-g", "0", "--name", "cpu-only", env=env, cwd=laptop)
    assert res.returncode == 0 and "asking for 0 GPUs (CPU only)" in res.stdout, res.stdout + res.stderr
    res = run("submit", "sleepy.ipynb", "--gpu-memory", "8Gi", env=env, cwd=laptop)  # a path in the hub home
    assert res.returncode == 0 and "sent the content" not in res.stdout and "asking for 8Gi of one GPU" in res.stdout
    sleeper = res.stdout.split()[1]
    row = next(line for line in run("list", env=env).stdout.splitlines() if line.startswith(sleeper))
    assert " 8Gi " in row and "8589934592" not in row
    assert re.search(r"^gpus: +8Gi of one GPU$", run("describe", sleeper, env=env).stdout, re.M)
    run("delete", sleeper, env=env)

    # a path found on neither side says where it was looked up
    res = run("submit", "nowhere.ipynb", env=env, cwd=laptop)
    assert res.returncode == 1 and "no such file 'nowhere.ipynb' in your working directory on the hub" in res.stderr
    assert f"nor is it a file on this machine ({laptop / 'nowhere.ipynb'})" in res.stderr
    res = run("submit", str(laptop / "gone.ipynb"), env=env)
    assert res.returncode == 1 and f"there is no file {laptop / 'gone.ipynb'} on this machine" in res.stderr
    res = run("submit", "work/local-only.ipynb", "-g", "-1", env=env, cwd=laptop)
    assert res.returncode == 2 and "must be >= 0" in res.stderr


def _command_in(nb_path: Path) -> list[str]:
    """The `gpupool ...` command a notebook's first markdown cell shows (in a fenced block)."""
    import shlex

    md = "".join(json.loads(nb_path.read_text())["cells"][0]["source"])
    line = next(l.strip() for l in md.splitlines() if l.strip().startswith("gpupool "))
    return shlex.split(line)[1:]


@pytest.mark.hub
@pytest.mark.slow
def test_the_example_notebooks_own_command_runs_as_written(hub, env):
    args = _command_in(REPO / "examples" / "train_checkpoint.ipynb")
    res = run(*args, env=env, cwd=REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "sent the content of the local file" in res.stdout
    job = hub.wait_job(env["GPUPOOL_TOKEN"], res.stdout.splitlines()[1].split()[1], {"succeeded", "failed"}, timeout=120)
    assert job["status"] == "succeeded", job["reason"]


@pytest.mark.hub
def test_login_with_a_password_or_a_pasted_token(hub, tmp_path):
    cfg = tmp_path / "config" / "gpupool.json"
    e = {"GPUPOOL_CLIENT_CONFIG": str(cfg)}
    res = run("login", env=e)
    assert res.returncode == 2 and "give the hub's URL, e.g. `gpupool login https://hub.example.org`" in res.stderr
    res = run("login", hub.hub_url, "--user", "alice", env=e, input="wrong\n")
    assert res.returncode == 1 and "refused user 'alice' with that password" in res.stderr and not cfg.exists()
    # the password goes to the hub's token API; the token is stored for the next commands, owner-only
    res = run("login", hub.hub_url, env=e, input=f"alice\n{PASSWORD}\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"logged in to {hub.hub_url} as alice; the URL and token are in {cfg} (readable by you only)"
    assert cfg.stat().st_mode & 0o777 == 0o600
    stored = json.loads(cfg.read_text())
    assert stored["url"] == hub.hub_url and stored["user"] == "alice"
    res = run("queues", env=e)
    assert res.returncode == 0 and "vision" in res.stdout
    # or paste a token from /hub/token (empty password)
    token = hub.token("bob")
    res = run("login", "--user", "bob", env=e, input=f"\n{token}\n")  # the URL stored by the last login
    assert res.returncode == 0 and json.loads(cfg.read_text())["token"] == token, res.stderr
    cfg.chmod(0o644)
    res = run("login", "--token", "not-a-token", env=e)
    assert res.returncode == 1 and "run `gpupool login`" in res.stderr
    assert json.loads(cfg.read_text())["token"] == token  # a refused token is not stored
    cfg.write_text(json.dumps({"url": hub.hub_url, "token": "expired"}))
    res = run("list", env=e)
    assert res.returncode == 1 and "the token was not accepted: run `gpupool login` for a new one" in res.stderr
    res = run("login", "--token", token, env=e)
    assert res.returncode == 0 and cfg.stat().st_mode & 0o777 == 0o600
