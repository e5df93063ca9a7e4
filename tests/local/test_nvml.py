"""gpupool.backends.nvml.

This machine has no GPU, so the NVML calls are exercised against ``FakeNVML``
(tests/support/nvml_standin.py): a stand-in for the ``pynvml`` module with the same function
names, return shapes (``.total``/``.used``, ``.gpu``, process objects with
``.pid``/``.usedGpuMemory``) and error class. The real library path is the
same code with ``nvml=None``; the last tests check that on this machine it says "no GPU" without
crashing.
"""
from __future__ import annotations

import pytest

from gpupool.backends import nvml
from nvml_standin import FakeNVML, FakeNVMLError, GiB, device


def test_gpus_and_node():
    fake = FakeNVML([device(0), device(1, used=3 * GiB, util=55)])
    assert nvml.available(nvml=fake)
    listed = nvml.gpus(nvml=fake)
    assert listed == [
        {"index": 0, "uuid": "GPU-00000000-0000", "name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GiB},
        {"index": 1, "uuid": "GPU-00000001-0000", "name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * GiB},
    ]
    [node] = nvml.discover_nodes("box", nvml=fake)
    assert (node.name, node.gpus, node.gpu_memory, node.gpu_model) == ("box", 2, 80 * GiB, "NVIDIA A100-SXM4-80GB")
    assert node.labels == {}
    assert fake.inits == fake.shutdowns  # every session is closed


def test_mixed_gpus_use_smallest_memory(caplog):
    fake = FakeNVML([device(0, "A100", 80 * GiB), device(1, "T4", 16 * GiB)], bytes_names=True)
    [node] = nvml.discover_nodes("mixed", nvml=fake)
    assert node.gpus == 2 and node.gpu_memory == 16 * GiB
    assert node.gpu_model == "A100+T4"
    assert node.labels["gpupool/mixed-gpus"] == "true"
    assert "smallest memory" in caplog.text


def test_default_node_name_is_hostname():
    import socket
    [node] = nvml.discover_nodes(nvml=FakeNVML([device(0)]))
    assert node.name == socket.gethostname()


def test_utilization_and_unsupported_reading():
    fake = FakeNVML([device(0, used=GiB, util=37), device(1, util=None)])
    u = nvml.utilization(nvml=fake)
    assert u[0] == {"utilization": 37.0, "memory_used": GiB, "memory_total": 80 * GiB}
    assert u[1] == {"utilization": None, "memory_used": 0, "memory_total": 80 * GiB}


def test_process_memory():
    fake = FakeNVML([device(0, procs=[(101, 2 * GiB), (202, None)]), device(1)])
    assert nvml.process_memory(0, nvml=fake) == {101: 2 * GiB, 202: 0}
    assert nvml.process_memory(1, nvml=fake) == {}
    assert nvml.process_memory(7, nvml=fake) == {}  # bad index: NVML error -> empty, no crash
    assert fake.inits == fake.shutdowns


def test_driver_missing_is_not_an_error():
    fake = FakeNVML([device(0)], init_error=FakeNVMLError("NVML Shared Library Not Found"))
    assert nvml.available(nvml=fake) is False
    assert nvml.gpus(nvml=fake) == []
    assert nvml.discover_nodes(nvml=fake) == []
    assert nvml.utilization(nvml=fake) == {}
    assert nvml.process_memory(0, nvml=fake) == {}


def test_zero_gpus():
    fake = FakeNVML([])
    assert nvml.available(nvml=fake) is False
    assert nvml.discover_nodes(nvml=fake) == []


def test_this_machine_has_no_gpu_and_nothing_crashes():
    """The real pynvml on this GPU-less machine (nvml=None: the library path)."""
    pytest.importorskip("pynvml")
    if nvml.available():  # pragma: no cover - only on a GPU machine
        [node] = nvml.discover_nodes()
        assert node.gpus == len(nvml.gpus()) > 0
        assert set(nvml.utilization()) == set(range(node.gpus))
        return
    assert nvml.gpus() == []
    assert nvml.discover_nodes() == []
    assert nvml.utilization() == {}
    assert nvml.process_memory(0) == {}
