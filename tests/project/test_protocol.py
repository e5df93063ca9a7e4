"""The job protocol (gpupool/protocol.py) and the allocation codec (gpupool/contract.py): each
writer is read back by its reader, the way the other side of the protocol reads it."""
from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool import checkpoint, contract, protocol as P
from source_tree import parse
from gpupool.backends import kube_manifests as km
from gpupool.backends.base import JobSpec
from gpupool.protocol import Env
from gpupool.scheduler.model import PodPlacement

ENV_NAMES = [v for k, v in vars(Env).items() if k.isupper() and isinstance(v, str)]
placements = st.lists(st.builds(PodPlacement, pod=st.integers(0, 4096), node=st.text(min_size=1, max_size=20),
                                gpus=st.lists(st.integers(0, 63), max_size=8).map(tuple),
                                fraction=st.sampled_from([1.0, 0.5, 0.25, 0.125, 0.3])), max_size=6).map(tuple)


@given(placements)
def test_allocation_codec_round_trips(ps):
    stored = contract.encode_allocation(ps)
    assert contract.decode_allocation(stored) == ps
    # what the database (JSON) and a pod's annotation hold decode the same
    assert contract.decode_allocation(json.loads(json.dumps(stored))) == ps
    assert km.placement_from_json(km.placement_to_json(ps)) == ps
    # and the API's view of it is the same placement without the pod index
    assert [(p.node, p.gpus, p.fraction) for p in contract.allocation_from_api(stored)] == \
           [(p.node, p.gpus, p.fraction) for p in ps]


def test_decode_fills_what_an_older_writer_left_out():
    assert contract.decode_allocation([{"node": "a", "gpus": ["1"]}, {"node": "b", "fraction": None}]) == (
        PodPlacement(0, "a", (1,), 1.0), PodPlacement(1, "b", (), 1.0))
    assert contract.decode_allocation(None) == ()
    with pytest.raises(KeyError):
        contract.decode_allocation([{"gpus": [0]}])
    assert km.placement_from_json('[{"gpus": [0]}]') == ()  # a broken annotation: nothing, not an error


def test_job_dir_layout(tmp_path):
    d = P.JobDir.of(str(tmp_path), "j-000042")
    assert d.path == str(tmp_path / "j-000042")
    assert (d.notebook, d.output, d.log) == tuple(str(tmp_path / "j-000042" / f)
                                                  for f in ("input.ipynb", "output.ipynb", "log.txt"))
    assert d.stop_file == str(tmp_path / "j-000042" / "control" / "stop")
    assert d.warning_file == str(tmp_path / "j-000042" / "control" / "warning")
    assert d.exit_file(3) == str(tmp_path / "j-000042" / "runs" / "3" / "exit.json")
    assert d.exit_file(3, rank=2) == str(tmp_path / "j-000042" / "runs" / "3" / "exit-rank2.json")
    assert d.worker_log(1).endswith("log-rank1.txt") and d.worker_output(0) == d.output
    # the Kubernetes backend and the local one agree on where a worker's exit status is
    assert km.exit_file(d.path + "/", 3, 2) == d.exit_file(3, 2)
    spec = JobSpec(job_id="j-000042", run_id="r", attempt=3, user="u", notebook=d.notebook, output=d.output,
                   log=d.log, parameters={}, workdir=str(tmp_path), job_dir=d.path, checkpoint_dir=d.checkpoints,
                   stop_file=d.stop_file)
    assert spec.files == d and spec.worker_log(1) == d.worker_log(1)


def test_stop_request_reaches_the_job_helpers(tmp_path, monkeypatch):
    d = P.JobDir(str(tmp_path / "j-1"))
    monkeypatch.setenv(Env.STOP_FILE, d.stop_file)
    assert not checkpoint.should_stop() and checkpoint.stop_reason() is None and checkpoint.warning() is None
    P.write_warning(d.stop_file, "reaches its maximum run time soon", at=123.0)
    assert checkpoint.warning() == "reaches its maximum run time soon" and not checkpoint.should_stop()
    assert P.write_stop(d.stop_file, "preempted: reclaimed by queue vision")
    assert checkpoint.should_stop() and checkpoint.stop_reason() == "preempted: reclaimed by queue vision"
    # readable by a job that runs as another user, and no temporary file left behind
    assert stat.S_IMODE(os.stat(d.stop_file).st_mode) & 0o044 == 0o044
    assert sorted(os.listdir(os.path.dirname(d.stop_file))) == ["stop", "warning"]
    # the pod's own request (on SIGTERM) keeps the service's, with its reason
    assert not P.write_stop(d.stop_file, "the pod is being stopped", replace=False)
    assert P.read_stop(d.stop_file) == "preempted: reclaimed by queue vision"
    assert P.write_stop(d.stop_file, "cancelled")
    assert checkpoint.stop_reason() == "cancelled"


def test_checkpoint_pointer(tmp_path, monkeypatch):
    ckpt = tmp_path / "checkpoints"
    monkeypatch.setenv(Env.CHECKPOINT_DIR, str(ckpt))
    assert P.read_latest(str(ckpt)) is None and P.latest_mtime(str(ckpt)) is None
    saved = checkpoint.save({"step": 7}, step=7)
    assert P.read_latest(str(ckpt)) == str(saved) == str(checkpoint.latest())
    assert P.latest_mtime(str(ckpt)) is not None
    assert json.loads((ckpt / P.LATEST).read_text())["step"] == 7
    P.write_latest(str(ckpt), "gone.pkl", 8)  # names a checkpoint that is not there: none
    assert P.read_latest(str(ckpt)) is None and checkpoint.latest() is None


def test_exit_status(tmp_path):
    path = str(tmp_path / "runs" / "1" / "exit.json")
    assert P.read_exit(path) is None
    P.write_exit(path, 137, 15)
    assert P.read_exit(path) == 137 and json.loads(open(path).read())["signal"] == 15
    with open(path, "w") as f:
        f.write("{broken")
    assert P.read_exit(path) is None


def test_job_env_names_the_files_and_the_resume_point(tmp_path):
    d = P.JobDir(str(tmp_path / "j-000007"))
    env = P.job_env(d, "j-000007", 2, api_url="http://svc/api/v1/", token="gpj_x")
    assert env == {Env.JOB_ID: "j-000007", Env.ATTEMPT: "2", Env.CHECKPOINT_DIR: d.checkpoints,
                   Env.STOP_FILE: d.stop_file, Env.JOB_DIR: d.path, Env.API_URL: "http://svc/api/v1/",
                   Env.API_TOKEN: "gpj_x"}
    os.makedirs(d.checkpoints)
    open(os.path.join(d.checkpoints, "ckpt-000001.pkl"), "wb").close()
    P.write_latest(d.checkpoints, "ckpt-000001.pkl", 1)
    assert P.job_env(d, "j-000007", 3)[Env.RESUME_FROM] == os.path.join(d.checkpoints, "ckpt-000001.pkl")
    assert ENV_NAMES and all(name.startswith("GPUPOOL_") for name in ENV_NAMES)


def test_gpu_env_of_a_process_and_of_a_pod():
    whole = PodPlacement(0, "box", (1, 3), 1.0)
    half = {"pod": 0, "node": "box", "gpus": [2], "fraction": 0.5}  # a stored entry works as well
    local = P.gpu_env(whole, uuids=["GPU-a", "GPU-b", "GPU-c"])
    assert local["CUDA_VISIBLE_DEVICES"] == "GPU-b,3" == local["NVIDIA_VISIBLE_DEVICES"]
    assert (local[Env.GPUS], local[Env.NODE], local[Env.GPU_FRACTION]) == ("1,3", "box", "1")
    assert Env.GPU_MEMORY_LIMIT not in local and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in local
    pod = P.gpu_env(whole, uuids=["GPU-a", "GPU-b"], container=True)
    assert "CUDA_VISIBLE_DEVICES" not in pod and "NVIDIA_VISIBLE_DEVICES" not in pod  # the device plugin's
    limit = P.memory_limit(0.5, 80 * 2**30)
    shared = P.gpu_env(half, memory=limit, container=True)
    assert shared["NVIDIA_VISIBLE_DEVICES"] == "2" and shared[Env.GPU_MEMORY_LIMIT] == str(40 * 2**30)
    assert shared["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.500" and shared["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert shared["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
    assert km.gpu_env(contract.decode_allocation([half])[0], None, 80 * 2**30) == shared
    for none in (None, PodPlacement(0, "box", (), 1.0)):
        assert P.gpu_env(none) == P.gpu_env(none, container=True) == {
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void",
            Env.GPUS: "", Env.GPU_FRACTION: "0"}
    assert P.memory_limit(1.0, 80) == 0 and P.memory_limit(0.25, 0) == 0 and P.memory_limit(0.25, 80, 7) == 7


def test_the_service_builds_a_runs_environment_from_the_protocol(tmp_path):
    """hub_ext's JobSpecs (runtime/jobspec.py) on protocol.gpu_env / job_env / JobDir: the values a
    run got when the service wrote them itself, spelled out here."""
    from types import SimpleNamespace

    from gpupool.hub_ext.runtime.jobspec import JobSpecs

    root = str(tmp_path / "jobs")
    pool = SimpleNamespace(job_root=root, work_dir=str(tmp_path / "work"), run_as_user=False, kernel_name="python3",
                           job_python="python")
    nodes = {"box": SimpleNamespace(name="box", gpu_memory=16 * 2**30)}
    specs = JobSpecs(pool, {"box": ["GPU-a", "GPU-b"]}, nodes.get, "http://svc/api/v1/")
    cpu = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void",
           "GPUPOOL_GPUS": "", "GPUPOOL_GPU_FRACTION": "0"}
    for nothing in (None, [], [{"pod": 0, "node": "box", "gpus": [], "fraction": 1.0}]):
        assert specs.gpu_env(nothing) == cpu
    quarter = {"pod": 0, "node": "box", "gpus": [1], "fraction": 0.25}
    assert specs.gpu_env([quarter]) == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "CUDA_VISIBLE_DEVICES": "GPU-b", "NVIDIA_VISIBLE_DEVICES": "GPU-b",
        "GPUPOOL_GPUS": "1", "GPUPOOL_NODE": "box", "GPUPOOL_GPU_FRACTION": "0.25",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.250", "XLA_CLIENT_MEM_FRACTION": "0.250",
        "GPUPOOL_GPU_MEMORY_FRACTION": "0.250", "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "GPUPOOL_GPU_MEMORY_LIMIT": str(4 * 2**30)}  # no reserve in this pool (tests/local/test_gpu_caps.py has one)
    assert specs.gpu_env([quarter], gpu_memory=3 * 2**30)["GPUPOOL_GPU_MEMORY_LIMIT"] == str(3 * 2**30)  # asked for
    assert "GPUPOOL_GPU_MEMORY_LIMIT" not in specs.gpu_env([dict(quarter, node="elsewhere")])  # its GPU unknown
    # whole GPUs: no UUID known for GPU 3; the first placement with GPUs counts
    whole = [{"pod": 0, "node": "box", "gpus": [], "fraction": 1.0}, {"pod": 1, "node": "box", "gpus": [0, 3],
                                                                       "fraction": 1.0}]
    assert specs.gpu_env(whole) == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "CUDA_VISIBLE_DEVICES": "GPU-a,3",
        "NVIDIA_VISIBLE_DEVICES": "GPU-a,3", "GPUPOOL_GPUS": "0,3", "GPUPOOL_NODE": "box", "GPUPOOL_GPU_FRACTION": "1"}

    # a gang's second attempt, with a checkpoint to resume from
    jdir = os.path.join(root, "j-000042")
    P.write_latest(os.path.join(jdir, "checkpoints"), "ckpt.pkl", 3)
    open(os.path.join(jdir, "checkpoints", "ckpt.pkl"), "w").close()
    gang = [{"pod": 1, "node": "box", "gpus": [1], "fraction": 1.0}, {"pod": 0, "node": "box", "gpus": [0],
                                                                      "fraction": 1.0}]
    row = SimpleNamespace(public_id="j-000042", allocation=gang, gpu_memory=0, attempt=2, user="alice", pods=2,
                          parameters={"lr": 1}, queue="vision", kind="train", cpu=2, memory=0, command=None,
                          script="train.py", args=["--fast"])
    spec = specs.job_spec(row, token="gpj_x")
    assert spec.env == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "CUDA_VISIBLE_DEVICES": "GPU-b", "NVIDIA_VISIBLE_DEVICES": "GPU-b",
        "GPUPOOL_GPUS": "1", "GPUPOOL_NODE": "box", "GPUPOOL_GPU_FRACTION": "1",
        "GPUPOOL_JOB_ID": "j-000042", "GPUPOOL_ATTEMPT": "2",
        "GPUPOOL_CHECKPOINT_DIR": os.path.join(jdir, "checkpoints"),
        "GPUPOOL_STOP_FILE": os.path.join(jdir, "control", "stop"), "GPUPOOL_JOB_DIR": jdir,
        "GPUPOOL_API_URL": "http://svc/api/v1/", "GPUPOOL_API_TOKEN": "gpj_x",
        "GPUPOOL_RESUME_FROM": os.path.join(jdir, "checkpoints", "ckpt.pkl")}
    assert specs.resumes_from(spec) == os.path.join(jdir, "checkpoints", "ckpt.pkl")
    assert (spec.notebook, spec.output, spec.log, spec.job_dir, spec.checkpoint_dir, spec.stop_file) == (
        os.path.join(jdir, "input.ipynb"), os.path.join(jdir, "output.ipynb"), os.path.join(jdir, "log.txt"), jdir,
        os.path.join(jdir, "checkpoints"), os.path.join(jdir, "control", "stop"))
    assert spec.placements == sorted(gang, key=lambda p: p["pod"]) and spec.pods == 2
    assert spec.command == ["python", "train.py", "--fast"] and spec.run_id == f"j-000042.2.{specs.instance}"
    assert [(w["GPUPOOL_GPUS"], w["CUDA_VISIBLE_DEVICES"]) for w in spec.worker_env] == [("0", "GPU-a"), ("1", "GPU-b")]
    assert "GPUPOOL_API_TOKEN" not in specs.job_spec(row).env  # a token only when it starts


def test_the_job_helpers_stay_cheap_to_import():
    code = ("import sys, gpupool.checkpoint, gpupool.distributed; "
            "extra = sorted(m for m in sys.modules if m.startswith('gpupool') and m not in "
            "('gpupool', 'gpupool.protocol', 'gpupool.checkpoint', 'gpupool.distributed')); assert not extra, extra")
    subprocess.run([sys.executable, "-c", code], check=True)


def spelled_out(source: str) -> list[str]:
    """The ``GPUPOOL_*`` names of :class:`Env` that ``source`` spells itself: a string that is one
    of them (``env["GPUPOOL_JOB_ID"]``), a keyword argument (``env.update(GPUPOOL_GPUS=...)``) or
    a name. Comments and docstrings that mention one are prose, not a use."""
    found = []
    for node in ast.walk(parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value
        elif isinstance(node, ast.keyword):
            name = node.arg
        elif isinstance(node, ast.Name):
            name = node.id
        else:
            continue
        if name in ENV_NAMES:
            found.append((node.lineno, name))
    return [f"line {line}: {name}" for line, name in sorted(found)]


def test_the_check_finds_each_way_of_spelling_a_name():
    assert spelled_out('env["GPUPOOL_JOB_ID"] = j\nenv.update(GPUPOOL_GPUS="")\nGPUPOOL_NODE = 1\n') == [
        "line 1: GPUPOOL_JOB_ID", "line 2: GPUPOOL_GPUS", "line 3: GPUPOOL_NODE"]
    assert spelled_out('"""Reads ``GPUPOOL_JOB_ID``."""\n# GPUPOOL_GPUS\nx = Env.JOB_ID\ny = "GPUPOOL_CONFIG"\n') == []


def test_no_adapter_spells_out_the_protocol():
    """The GPUPOOL_* names of the job protocol appear in gpupool/protocol.py and nowhere else in
    the modules that speak it: the job helpers, the backends, the spawner and every module of the
    service (hub_ext)."""
    root = Path(P.__file__).resolve().parents[1]
    speakers = ["gpupool/checkpoint.py", "gpupool/distributed.py", "gpupool/client/metrics.py",
                "gpupool/client/config.py", "gpupool/backends/local.py", "gpupool/backends/kubernetes.py",
                "gpupool/backends/kube_manifests.py", "gpupool/backends/base.py", "spawner/kube.py"]
    service = sorted(str(p.relative_to(root)) for p in (root / "hub_ext").rglob("*.py"))
    assert "hub_ext/runtime/jobspec.py" in service
    for rel in speakers + service:
        spelled = spelled_out((root / rel).read_text())
        assert not spelled, f"{rel} spells out the job protocol: {spelled}"


def test_a_runs_processes_are_found_by_the_run_id_in_their_environment():
    """The local backend finds a run's processes by ``GPUPOOL_RUN_ID`` (psutil): exactly that run
    (not worker 1's ``.r1``), and never a zombie."""
    import time

    import psutil

    from gpupool.backends import local

    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    run, worker = "j-000001.1.test", "j-000001.1.test.r1"
    mine = subprocess.Popen(sleep, env={**os.environ, Env.RUN_ID: run})
    other = subprocess.Popen(sleep, env={**os.environ, Env.RUN_ID: worker})
    try:
        assert local.run_pids(run) == [mine.pid] and local.run_pids(worker) == [other.pid]
        assert local.run_alive(mine.pid, run) and not local.run_alive(mine.pid, worker)
        assert not local.run_alive(None, run) and not local.run_alive(other.pid, run)
        mine.kill()  # not reaped: a zombie until wait()
        deadline = time.monotonic() + 10
        while psutil.Process(mine.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.05)  # (the kernel takes a moment to tear it down)
        assert psutil.Process(mine.pid).status() == psutil.STATUS_ZOMBIE  # still there, unreaped
        assert not local.run_alive(mine.pid, run) and local.run_pids(run) == []
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()
