"""A pynvml stand-in for a gpupool service started by a test (``c.GPUPool.nvml_module =
"nvml_standin"``, with this directory on ``PYTHONPATH``).

It is ``test_nvml.FakeNVML`` whose devices come from the JSON file named by
``GPUPOOL_TEST_NVML_FILE``, read again at every ``nvmlInit``: a test writes the utilisation it
wants there (:func:`write`) and the service's next reading returns it.
"""
from __future__ import annotations

import contextlib
import json
import os

from test_nvml import FakeNVML, FakeNVMLError, device  # noqa: F401 (NVMLError is looked up on the module)

ENV = "GPUPOOL_TEST_NVML_FILE"
NVMLError = FakeNVMLError
_fake = FakeNVML([])


def write(path, utilizations: list[float | None], name: str = "NVIDIA L4", total: int = 24 * 2**30,
          used: int = 2**30, **more) -> None:
    """The devices the service will see: one per utilisation value (None: not supported); ``more``:
    keys of every device (``driver="615.10"``, ``mig=0``)."""
    devices = [device(i, name=name, total=total, used=used, util=u, **more) for i, u in enumerate(utilizations)]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(devices, f)
    os.replace(tmp, path)


def nvmlInit():
    try:
        with open(os.environ[ENV]) as f:
            _fake.devices = json.load(f)
    except (KeyError, OSError, ValueError) as e:
        raise FakeNVMLError(f"NVML Shared Library Not Found ({e})") from None
    _fake.nvmlInit()


def nvmlDeviceSetMemoryLimits_v1(handle, limits):
    """The stand-in's call, also appended to ``<file>.limits.jsonl`` (the test reads the arguments)."""
    call = _fake.nvmlDeviceSetMemoryLimits_v1(handle, limits)
    with open(os.environ[ENV] + ".limits.jsonl", "a") as f:
        f.write(json.dumps(call) + "\n")


def limit_calls(path) -> list[dict]:
    try:
        with open(f"{path}.limits.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


c_nvmlSetMemoryLimits_v1_t = FakeNVML.c_nvmlSetMemoryLimits_v1_t


def __getattr__(name):  # every other pynvml function: the stand-in's
    return getattr(_fake, name)


@contextlib.contextmanager
def for_services(path, utilizations: list[float | None], **more):
    """Services started inside this block load this stand-in (``nvml_module = "nvml_standin"``) with
    these readings: the environment variable and ``PYTHONPATH`` are set (the harness hands its
    environment to a service it starts itself, ``Hub(managed=False)``)."""
    import pytest

    write(path, utilizations, **more)
    mp = pytest.MonkeyPatch()
    mp.setenv(ENV, str(path))
    here = os.path.dirname(os.path.abspath(__file__))
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    try:
        yield path
    finally:
        mp.undo()
