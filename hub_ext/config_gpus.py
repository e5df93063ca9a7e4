"""The ``c.GPUPool`` knobs of what GPUs really do (``GPUPool`` inherits them): the driver's memory
limits for fractional jobs (tier 2 of fraction enforcement) and the Prometheus that reads the DCGM
exporter on a cluster, and the demo's simulated readings of a declared inventory. docs/admin.md says
how to use them."""
from __future__ import annotations

from traitlets import Bool, Float, Unicode
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

    simulated_gpu_readings = Bool(
        False,
        help="""Give the declared GPUs (``c.GPUPool.nodes`` that NVML does not read) simulated
        readings, so that the idle rules and the utilisation history work without GPUs: a GPU
        reads busy while a running job holds it, or a workspace whose server the hub saw active in
        the last ``simulated_activity_seconds``; otherwise 0 %. For demos and trials only
        (``gpupool hub --demo`` turns it on for its declared GPUs): ``GET nodes`` says
        ``readings: simulated``, the dashboard and ``gpupool top`` label them, and the idle
        reasons say "simulated". GPUs that NVML or DCGM reads keep their real readings.""",
    ).tag(config=True)

    simulated_activity_seconds = Float(
        600.0,
        help="""With ``simulated_gpu_readings``: how long after the hub's last activity of a server
        (its ``last_activity``: the server reports it every 5 minutes by default, the service asks
        the hub every ``workspace_reconcile_seconds``) its GPUs read busy. Longer than the hub's
        reporting delay, so that a server in use is never read idle.""",
    ).tag(config=True)
