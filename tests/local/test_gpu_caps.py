"""Tier 1 of fraction enforcement: a fractional job's frameworks are told its cap before they
touch the GPU (gpupool.protocol.gpu_env, the start-up hook gpupool/startup/).

On this machine (no GPU, the CPU build of PyTorch) what can be shown is: the environment a real
job process sees, that the hook runs in that process before the program's code, that PyTorch's
allocator setting is added where the installed version knows the key, and that
``torch.cuda.set_per_process_memory_fraction`` is reached with the job's share once CUDA starts
(the queued call is run by hand, with the function replaced by a recorder, since CUDA never
starts here). That the driver then refuses memory past the cap is benchmarks/gpu_check.py's, on a
GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from gpupool import protocol as P
from gpupool.protocol import Env
from gpupool.startup import gpupool_caps as caps

GiB = 2**30


def test_the_cap_leaves_out_the_drivers_reserve_and_names_every_framework():
    from gpupool.hub_ext.runtime.jobspec import JobSpecs

    pool = SimpleNamespace(job_root="/tmp/jobs", work_dir="/tmp/work", run_as_user=False, kernel_name="",
                           job_python="python", gpu_memory_reserve=0.03, gpu_memory_reserve_min="256Mi")
    nodes = {"box": SimpleNamespace(name="box", gpu_memory=16 * GiB)}
    specs = JobSpecs(pool, {"box": ["GPU-a", "GPU-b"]}, nodes.get)
    quarter = {"pod": 0, "node": "box", "gpus": [1], "fraction": 0.25}
    env = specs.gpu_env([quarter])
    usable = 16 * GiB - max(-(-16 * GiB * 3 // 100), 256 * 2**20)  # 3 %, at least 256Mi, stays with the driver
    assert P.usable_memory(16 * GiB, 0.03, 256 * 2**20) == usable
    assert env[Env.GPU_MEMORY_LIMIT] == str(int(usable * 0.25))
    share = f"{int(usable * 0.25 / (16 * GiB) * 1000) / 1000:.3f}"  # of the whole GPU, rounded down: 0.242
    assert share == "0.242"
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION", Env.GPU_MEMORY_FRACTION):
        assert env[name] == share, name
    # a memory request is the cap itself: 4Gi of a 16Gi GPU is a quarter of its memory
    env = specs.gpu_env([quarter], gpu_memory=4 * GiB)
    assert env[Env.GPU_MEMORY_LIMIT] == str(4 * GiB) and env["XLA_CLIENT_MEM_FRACTION"] == "0.250"
    # whole GPUs and unknown GPUs: no cap to hand on (the share alone, for JAX, when the size is unknown)
    assert Env.GPU_MEMORY_FRACTION not in specs.gpu_env([dict(quarter, fraction=1.0)])
    unknown = specs.gpu_env([dict(quarter, node="elsewhere")])
    assert Env.GPU_MEMORY_LIMIT not in unknown and unknown[Env.GPU_MEMORY_FRACTION] == "0.250"


def test_a_pod_keeps_the_cap_the_service_computed():
    from gpupool.backends import kube_manifests as km
    from gpupool.scheduler.model import PodPlacement

    half = PodPlacement(0, "n1", (0,), 0.5)
    spec = km.JobPodSpec(job_id="j-000001", run_id="j-000001.1.x", user="ann", queue="q", image="img",
                         placement=half, notebook="/j/in.ipynb", output="/j/out.ipynb", log="/j/log.txt",
                         job_dir="/j", checkpoint_dir="/j/checkpoints", stop_file="/j/control/stop",
                         gpu_memory=80 * GiB, env={Env.GPU_MEMORY_LIMIT: str(10 * GiB)})
    env = {e["name"]: e.get("value") for e in km.job_pod_manifest(spec)["spec"]["containers"][0]["env"]}
    assert env[Env.GPU_MEMORY_LIMIT] == str(10 * GiB) and env[Env.GPU_MEMORY_FRACTION] == "0.125"
    assert env["XLA_CLIENT_MEM_FRACTION"] == env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.125"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"


def test_allocator_setting_only_where_pytorch_knows_it(monkeypatch):
    assert caps.alloc_conf("", 0.25) == "per_process_memory_fraction:0.25"
    assert caps.alloc_conf("expandable_segments:True", 0.25) == "expandable_segments:True,per_process_memory_fraction:0.25"
    assert caps.alloc_conf("per_process_memory_fraction:0.1", 0.25) == "per_process_memory_fraction:0.1"  # the user's wins
    monkeypatch.setenv(caps.FRACTION, "0.25")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for version, expect in (((2, 9), False), ((2, 10), True), ((3, 0), True), (None, False)):
        env: dict[str, str] = {}
        monkeypatch.setattr(caps, "_version", lambda dist, v=version: v)
        done = caps.install(env)
        assert (caps.ALLOC_CONF in env) is expect, version
        assert done["share"] == 0.25
    monkeypatch.setenv(caps.FRACTION, "1")  # a whole GPU (or no cap): nothing is touched
    env = {}
    assert caps.install(env) == {} and env == {}


def test_the_hooks_reach_the_frameworks_functions():
    calls = []
    lazy = []
    cuda = SimpleNamespace(_lazy_call=lazy.append, is_initialized=lambda: False,
                           set_per_process_memory_fraction=lambda f, device=None: calls.append(("torch", f)))
    assert caps.torch_hook(SimpleNamespace(cuda=cuda), 0.242)
    assert calls == []  # nothing until CUDA starts: a CPU-only process makes no CUDA context
    lazy[0]()
    assert calls == [("torch", 0.242)]

    class Config:
        LogicalDeviceConfiguration = staticmethod(lambda memory_limit: ("logical", memory_limit))

        def list_physical_devices(self, kind):
            return ["GPU:0"] if kind == "GPU" else []

        def set_logical_device_configuration(self, device, configs):
            calls.append(("tensorflow", device, configs))

    assert caps.tensorflow_hook(SimpleNamespace(config=Config()), 10 * GiB)
    assert calls[-1] == ("tensorflow", "GPU:0", [("logical", 10240)])


def test_an_import_hook_runs_after_the_module_and_never_breaks_it(tmp_path, monkeypatch):
    (tmp_path / "fakefw.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = caps._AfterImport({"fakefw": lambda m: seen.append(m.VALUE + 1) or 1 / 0})
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    sys.modules.pop("fakefw", None)
    import fakefw  # noqa: F401

    assert seen == [42] and sys.modules["fakefw"].VALUE == 41  # the hook's error did not undo the import
    sys.modules.pop("fakefw", None)


PROGRAM = r"""
import json, os, sys
out = {"env": {k: os.environ.get(k) for k in ("GPUPOOL_GPU_MEMORY_FRACTION", "PYTORCH_CUDA_ALLOC_CONF",
                                             "XLA_CLIENT_MEM_FRACTION", "PYTHONPATH")}}
out["hook_loaded"] = "gpupool_caps" in sys.modules
import torch
queued = [c for c, _ in torch.cuda._queued_calls]
reached = []
torch.cuda.set_per_process_memory_fraction = lambda f, device=None: reached.append(f)
for call in queued:  # what torch.cuda._lazy_init runs as CUDA starts (never, on this CPU)
    try:
        call()
    except Exception as e:
        reached.append(repr(e))
out["reached"] = reached
open(sys.argv[1], "w").write(json.dumps(out))
"""


def _run_job_process(tmp_path, env):
    """A worker as the local backend starts it: its runner, then the program (the environment of
    protocol.gpu_env on top of this process's)."""
    exit_file, log, result = tmp_path / "exit.json", tmp_path / "log.txt", tmp_path / "result.json"
    (tmp_path / "prog.py").write_text(PROGRAM)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "PYTORCH_", "XLA_"))}
    subprocess.run([sys.executable, "-m", "gpupool.backends.local", "run", "--exit-file", str(exit_file),
                    "--log", str(log), "--run-id", "test-caps", "--", sys.executable, str(tmp_path / "prog.py"),
                    str(result)], env={**base, **env}, check=True, timeout=120)
    assert P.read_exit(str(exit_file)) == 0, log.read_text()
    return json.loads(result.read_text())


def test_a_real_job_process_gets_the_cap_before_its_code_runs(tmp_path):
    pytest.importorskip("torch")
    env = P.gpu_env({"node": "box", "gpus": [0], "fraction": 0.25}, memory=int(3.9 * GiB), total=16 * GiB)
    out = _run_job_process(tmp_path, env)
    assert out["hook_loaded"]  # before the program's first line
    assert out["env"]["GPUPOOL_GPU_MEMORY_FRACTION"] == "0.243" == out["env"]["XLA_CLIENT_MEM_FRACTION"]
    assert out["env"]["PYTHONPATH"].split(os.pathsep)[0] == P.STARTUP_DIR
    import torch

    if caps._version("torch") >= caps.ALLOC_KEY_SINCE:  # the installed PyTorch (2.13 in the test deps)
        assert "per_process_memory_fraction:0.243" in out["env"]["PYTORCH_CUDA_ALLOC_CONF"], torch.__version__
    assert out["reached"] == [0.243]  # torch.cuda.set_per_process_memory_fraction, with the job's share


def test_a_whole_gpu_job_is_left_alone(tmp_path):
    pytest.importorskip("torch")
    out = _run_job_process(tmp_path, P.gpu_env({"node": "box", "gpus": [0], "fraction": 1.0}))
    assert out["reached"] == [] and out["env"]["PYTORCH_CUDA_ALLOC_CONF"] is None


def test_the_environments_own_sitecustomize_still_runs(tmp_path):
    """The hook hides any other ``sitecustomize`` on the path; it runs that one after itself."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    env = P.with_startup_hook({"PYTHONPATH": str(theirs)})
    assert env["PYTHONPATH"] == os.pathsep.join([P.STARTUP_DIR, str(theirs)])
    assert P.with_startup_hook(env) == env  # once is enough
    code = "import os, sys; print(os.environ.get('THEIRS_RAN'), 'gpupool_caps' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env, caps.FRACTION: "0.5"},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["yes", "True"], out.stderr


def test_a_broken_hook_never_stops_the_program(tmp_path):
    env = P.with_startup_hook({})
    out = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env, caps.FRACTION: "0.5", caps.LIMIT: "not-a-number"})
    assert out.stdout.strip() == "ran"


def test_a_fractional_pod_carries_kais_memory_annotations():
    """KAI-Scheduler's names (pkg/common/constants/constants.go): gpu-memory in MiB, or
    gpu-fraction when the cap is unknown (its validator refuses both), and the container."""
    from gpupool.backends import kube_manifests as km
    from gpupool.scheduler.model import PodPlacement

    def annotations(placement, gpu_memory=0, env=None):
        spec = km.JobPodSpec(job_id="j-000001", run_id="j-000001.1.x", user="ann", queue="q", image="img",
                             placement=placement, notebook="/j/in.ipynb", output="/j/out.ipynb", log="/j/log.txt",
                             job_dir="/j", checkpoint_dir="/j/checkpoints", stop_file="/j/control/stop",
                             gpu_memory=gpu_memory, env=env or {})
        pod = km.job_pod_manifest(spec)
        assert pod["spec"]["containers"][0]["name"] == "notebook"
        return pod["metadata"]["annotations"]

    half = PodPlacement(0, "n1", (0,), 0.5)
    ann = annotations(half, 80 * GiB, {Env.GPU_MEMORY_LIMIT: str(10 * GiB)})
    assert (ann["gpu-memory"], ann["gpu-fraction-container-name"]) == ("10240", "notebook")
    assert "gpu-fraction" not in ann and ann[km.ANN_PLACEMENT]  # gpupool's own placement annotation stays
    assert annotations(half, 80 * GiB)["gpu-memory"] == "40960"  # its share of the GPU
    unknown = annotations(half)  # a GPU of unknown size
    assert unknown["gpu-fraction"] == "0.5" and "gpu-memory" not in unknown
    whole = annotations(PodPlacement(0, "n1", (0, 1), 1.0), 80 * GiB)
    assert not {"gpu-memory", "gpu-fraction", "gpu-fraction-container-name"} & set(whole)
