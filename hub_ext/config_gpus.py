"""The ``c.GPUPool`` knobs of what GPUs really do (``GPUPool`` inherits them): the driver's memory
limits for fractional jobs (tier 2 of fraction enforcement) and the Prometheus that reads the DCGM
exporter on a cluster. docs/admin.md says how to use them."""
from __future__ import annotations

from traitlets import Unicode
from traitlets.config import Configurable


class GpuTruthSettings(Configurable):
    """GPU enforcement and utilisation on a cluster (``c.GPUPool.*``)."""

    gpu_memory_cgroup = Unicode(
        "/sys/fs/cgroup/gpupool",
        help="""The parent cgroup of fractional jobs' cgroups (local backend): where the service
        runs as root, on cgroup v2, with NVIDIA driver r615 or later and a GPU not in MIG mode,
        each fractional worker runs in a cgroup of its own whose GPU memory the driver caps
        (``nvmlDeviceSetMemoryLimits_v1``: hard limit its fraction, soft limit its request). Where
        any of that is missing, the NVML watch (``memory_enforcement``) and the frameworks' own
        caps hold it. "" turns the driver's limits off (docs/admin.md).""",
    ).tag(config=True)

    prometheus_url = Unicode(
        "",
        help="""The Prometheus that scrapes NVIDIA's DCGM exporter (e.g.
        ``http://prometheus-operated.monitoring:9090``): the GPUs' utilisation and memory on a
        cluster, where NVML sees only the service's machine. They feed the utilisation history,
        the idle rules and the used GPU-hours. "" reads NVML alone (docs/admin.md).""",
    ).tag(config=True)
