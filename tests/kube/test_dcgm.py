"""Utilisation on Kubernetes (gpupool/backends/dcgm.py): the DCGM exporter's metrics read through
a real Prometheus server (tests/support/dcgm_standin.py: Debian's prometheus scraping a stand-in exporter
every second), mapped to nodes and GPUs by UUID, by the exporter's pod labels and by host name;
the utilisation history, the idle rules and the used GPU-hours work from them."""
from __future__ import annotations

import pytest

import dcgm_standin
from gpupool.backends import dcgm

MiB, GiB = 2**20, 2**30
A100 = {"modelName": "NVIDIA A100-SXM4-80GB", "DCGM_FI_DRIVER_VERSION": "615.10"}


def gpu(index, uuid, util, used, free=81000, **labels):
    return {"gpu": str(index), "UUID": uuid, "device": f"nvidia{index}", **A100, "Hostname": "dcgm-exporter-x7k2p",
            **labels, "util": util, "used": used, "free": free}


def test_series_are_mapped_by_uuid_pod_labels_and_host_name(tmp_path):
    uuids = {"n1": ["GPU-aaa", "GPU-bbb"], "n2": ["GPU-ccc"]}
    pods = dcgm.pod_nodes([({"namespace": "gpupool", "pod": "j-000002-1-x", "node": "n2"}, []),
                           ({"namespace": "gpupool", "pod": "j-000003-1-x", "workers": [{"namespace": "gpupool",
                                                                                        "pod": "j-000003-1-x-r1"}]},
                            [{"node": "n1"}, {"node": "n3"}])])
    assert pods == {("gpupool", "j-000002-1-x"): "n2", ("gpupool", "j-000003-1-x"): "n1",
                    ("gpupool", "j-000003-1-x-r1"): "n3"}
    exporter = dcgm_standin.Exporter([
        gpu(1, "GPU-bbb", 87, 40960, 40000, namespace="gpupool", pod="j-000001-1-x", container="notebook"),
        gpu(1, "GPU-bbb", 87, 40960, 40000, namespace="gpupool", pod="j-000009-1-x", container="notebook"),  # shared
        gpu(0, "GPU-unknown", 12, 1024, namespace="gpupool", pod="j-000002-1-x", container="notebook"),
        gpu(3, "GPU-elsewhere", 50, 2048, Hostname="n3"),  # an exporter on the host network
        gpu(0, "GPU-nobody", 99, 1),  # a GPU gpupool does not know: left out
    ])
    try:
        with dcgm_standin.prometheus(tmp_path, exporter, wait_for=5) as url:
            out = dcgm.readings(url, {**uuids, "n3": []}, pods)
    finally:
        exporter.close()
    assert out == {
        "n1": {1: {"utilization": 87.0, "memory_used": 40960 * MiB, "memory_total": 80960 * MiB}},
        "n2": {0: {"utilization": 12.0, "memory_used": 1024 * MiB, "memory_total": 82024 * MiB}},
        "n3": {3: {"utilization": 50.0, "memory_used": 2048 * MiB, "memory_total": 83048 * MiB}},
    }


def test_prometheus_unreachable_is_no_reading(caplog):
    assert dcgm.readings("http://127.0.0.1:9", {"n1": ["GPU-aaa"]}) == {}
    assert "no GPU readings from Prometheus at http://127.0.0.1:9" in caplog.text


async def test_idle_rules_and_used_gpu_hours_work_from_prometheus(tmp_path):
    """A job on n1's GPU 1 at 50 % for two minutes, then at 0 % with its 8Gi still allocated: its
    used GPU-hours are half its allocated ones while busy, and the idle rule flags it as idle-held
    once the exporter reads 0 %."""
    from sqlalchemy import select

    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.domain import usage
    from gpupool.hub_ext.runtime.idle import IdleChecker
    from gpupool.hub_ext.runtime.sampling import Sampler
    from gpupool.hub_ext.store import ledger
    from hubless_service import QUEUES, service_parts

    t0 = 1_800_000_000.0
    now = [t0]
    settings, sessions, loop = service_parts(tmp_path, [{"name": "n1", "gpus": 2}], QUEUES,
                                             {"q": {"train": {"after": 60}}})
    with sessions() as s:
        s.add(D.Workload(type=D.JOB, kind="train", user="bob", queue="q", gpus=1.0, submitted_at=t0, started_at=t0,
                         parameters={}, status="running", attempt=1, reason="running on n1 GPU 1",
                         handle={"namespace": "gpupool", "pod": "j-000001-1-x", "node": "n1"},
                         allocation=[{"pod": 0, "node": "n1", "gpus": [1], "fraction": 1.0}]))
        s.commit()
    with sessions() as s:  # the ledger's record starts when the test's clock does
        s.execute(ledger.TABLE.update().values(start=t0))
        s.commit()
    exporter = dcgm_standin.Exporter([gpu(1, "GPU-unknown", 50, 8192, namespace="gpupool", pod="j-000001-1-x")])
    try:
        with dcgm_standin.prometheus(tmp_path, exporter) as url:
            def read():
                with sessions() as s:
                    held = s.execute(select(D.Workload.handle, D.Workload.allocation)).all()
                return dcgm.readings(url, {"n1": []}, dcgm.pod_nodes(held))

            sampler = Sampler(sessions, read, 10, 86400, 300, 86400, clock=lambda: now[0])
            checker = IdleChecker(loop, sessions, settings.idle_rules, 30, clock=lambda: now[0])
            for _ in range(12):  # two minutes of readings, 10 s apart (the test's clock)
                now[0] += 10
                sampler.sample()
            with sessions() as s:
                doc = usage.report(s, t0, now[0], "user", now[0])
            assert doc["total"]["allocated_gpu_hours"] == pytest.approx(120 / 3600, abs=1e-6)
            assert doc["total"]["used_gpu_hours"] == pytest.approx(60 / 3600, abs=1e-6)  # half of it, at 50 %
            assert await checker.tick() == [] and checker.idle == {}  # busy: not idle
            exporter.gpus[0].update(util=0)
            dcgm_standin.wait_for_value(url, "DCGM_FI_DEV_GPU_UTIL", 0)
            for _ in range(7):
                now[0] += 10
                sampler.sample()
            await checker.tick()
            assert checker.idle["j-000001"]["state"] == "held"  # its 8Gi still allocated: idle-held
            with sessions() as s:
                assert ("idle: its GPU stayed idle (0 % utilisation) while holding GPU memory (idle-held) for 1 min"
                        in s.get(D.Workload, 1).reason)
    finally:
        exporter.close()
        await loop.backend.close()
