"""GPU truth through the real hub (the local backend, NVML's stand-in): the tier that holds a
fractional job is chosen by the service, recorded on the job and named by the API and
``gpupool describe``; where the machine allows the driver's limits (root, cgroup v2, r615, no MIG)
the service gives the job's cgroup the limits, checked here by the stand-in's record of the call."""
from __future__ import annotations

import os

import pytest

from gpupool_cli import cli
from hub_harness import Hub, hub_leak_check  # noqa: F401 (leak check fixtures)

pytestmark = pytest.mark.hub

GiB = 2**30
SLEEP = ["python", "-c", "import time; time.sleep(120)"]


def test_the_tier_of_a_fractional_job_is_recorded_and_named(tmp_path):
    import nvml_standin

    (tmp_path / "cgroups").mkdir()
    (tmp_path / "cgroups" / "cgroup.controllers").write_text("cpu memory\n")  # a cgroup v2 root (a test's)
    parent = str(tmp_path / "cgroups" / "gpupool")
    gp = {"nodes": None, "nvml_module": "nvml_standin", "usage_sample_seconds": 0, "gpu_memory_cgroup": parent}
    with nvml_standin.for_services(tmp_path / "nvml.json", [0.0, 0.0], driver="615.10") as readings, \
            Hub(tmp_path, gpupool=gp, users=["alice"], managed=False) as hub:
        alice = hub.token("alice")
        half = hub.api("POST", "jobs", alice, json={"command": SLEEP, "gpus": 0.5}).json()["id"]
        whole = hub.api("POST", "jobs", alice, json={"command": SLEEP, "gpus": 1}).json()["id"]
        job = hub.wait_job(alice, half, {"running"}, 60)
        assert hub.wait_job(alice, whole, {"running"}, 60)["enforcement"] is None
        usable = 24 * GiB - max(-(-24 * GiB * 3 // 100), 256 * 2**20)  # the stand-in's 24Gi less the driver's part
        if os.geteuid() == 0:  # the service runs as root: the driver caps the job's cgroup
            assert job["enforcement"] == "driver", job
            [call] = nvml_standin.limit_calls(readings)
            gpu = job["allocation"][0]["gpus"][0]
            assert call["nameSpace"].startswith(os.path.join(parent, f"{half}.1."))
            assert call == {"uuid": f"GPU-{gpu:08d}-0000", "nameSpace": call["nameSpace"],
                            "softLimit": int(usable * 0.5), "hardLimit": int(usable * 0.5)}
            runner = int(open(os.path.join(call["nameSpace"], "cgroup.procs")).read())
            assert f"GPUPOOL_JOB_ID={half}".encode() in open(f"/proc/{runner}/environ", "rb").read()
            words = "driver: its own cgroup; the NVIDIA driver refuses GPU memory past its share"
        else:  # NVML works here, so its watch holds the job
            assert job["enforcement"] == "watch", job
            words = "watch: NVML readings checked against its share"
        out = cli(hub, "describe", half, token=alice).stdout
        assert "memory cap:" in out and words in out, out
        for jid in (half, whole):
            hub.api("DELETE", f"jobs/{jid}", alice)
            hub.wait_job(alice, jid, {"cancelled"}, 30)
