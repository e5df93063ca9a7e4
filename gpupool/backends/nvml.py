"""The GPUs of this machine, read through NVML (``pynvml`` from the ``nvidia-ml-py`` package).

Used by the hub for a real inventory (``gpupool hub --demo --gpus real``, or an admin's
``c.GPUPool.nodes`` left empty) and for live readings on ``GET nodes`` (utilization, memory used,
memory held by each process).

Every function takes an optional ``nvml`` argument: the module to call, ``pynvml`` by default.
Tests pass a small stand-in object with the same functions because this machine has no GPU; the
code path is the same one that runs against the real library on a GPU machine.

Nothing here raises when there is no GPU, no driver or no ``pynvml``: :func:`available` says
False, :func:`gpus` and :func:`discover_nodes` return empty lists, :func:`utilization` and
:func:`process_memory` empty dicts.
"""
from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any, Iterator

from ..scheduler.model import NodeSpec

log = logging.getLogger(__name__)


def _module(nvml: Any = None) -> Any | None:
    if nvml is not None:
        return nvml
    try:
        import pynvml  # nvidia-ml-py
    except Exception:  # not installed, or a broken install
        return None
    return pynvml


def _error_types(nvml: Any) -> tuple[type[BaseException], ...]:
    err = getattr(nvml, "NVMLError", None)
    types: list[type[BaseException]] = [_NoNVML, OSError, RuntimeError]
    if isinstance(err, type) and issubclass(err, BaseException):
        types.append(err)
    return tuple(types)


class _NoNVML(Exception):
    """NVML could not start (no driver, no library): not worth a warning, there is just no GPU."""


@contextlib.contextmanager
def _session(nvml: Any) -> Iterator[Any]:
    """nvmlInit ... nvmlShutdown (NVML counts inits, so nested sessions are fine)."""
    try:
        nvml.nvmlInit()
    except Exception as e:
        raise _NoNVML(str(e)) from e
    try:
        yield nvml
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # shutting down must never hide the real result
            pass


def _log_failure(error: BaseException, message: str, *args: Any) -> None:
    (log.debug if isinstance(error, _NoNVML) else log.warning)("NVML: " + message, *args)


def _text(value: Any) -> str:
    if isinstance(value, bytes):  # older pynvml versions return bytes
        return value.decode("utf-8", "replace")
    return str(value)


def available(nvml: Any = None) -> bool:
    """True when NVML loads and reports at least one GPU."""
    mod = _module(nvml)
    if mod is None:
        return False
    try:
        with _session(mod):
            return int(mod.nvmlDeviceGetCount()) > 0
    except Exception as e:  # no driver (NVMLError_LibraryNotFound), no device, ...
        log.debug("NVML not available: %s", e)
        return False


def gpus(nvml: Any = None) -> list[dict]:
    """``[{"index", "uuid", "name", "memory_total"}]`` for every GPU NVML sees (empty without)."""
    mod = _module(nvml)
    if mod is None:
        return []
    try:
        with _session(mod):
            out = []
            for i in range(int(mod.nvmlDeviceGetCount())):
                h = mod.nvmlDeviceGetHandleByIndex(i)
                out.append({
                    "index": i,
                    "uuid": _text(mod.nvmlDeviceGetUUID(h)),
                    "name": _text(mod.nvmlDeviceGetName(h)),
                    "memory_total": int(mod.nvmlDeviceGetMemoryInfo(h).total),
                })
            return out
    except _error_types(mod) as e:
        _log_failure(e, "could not list GPUs: %s", e)
        return []


def discover_nodes(node_name: str | None = None, nvml: Any = None) -> list[NodeSpec]:
    """This machine as one node with its GPUs, or ``[]`` when NVML finds none.

    The scheduler keeps one memory size and one model per node. When the GPUs differ, the node
    gets the smallest memory (so a ``gpu_memory`` request never lands on a GPU too small for it)
    and a model string naming all of them (``"A100-80GB+T4"``); a warning says so.
    """
    found = gpus(nvml)
    if not found:
        return []
    name = node_name or socket.gethostname()
    memory = min(g["memory_total"] for g in found)
    models = list(dict.fromkeys(g["name"] for g in found))
    if len(models) > 1 or len({g["memory_total"] for g in found}) > 1:
        log.warning("NVML: node %s has different GPUs (%s); using the smallest memory %d bytes for all",
                    name, ", ".join(f"{g['index']}: {g['name']} {g['memory_total']}" for g in found), memory)
    model = "+".join(models)
    labels = {"gpupool/mixed-gpus": "true"} if len(models) > 1 else {}
    return [NodeSpec(name=name, gpus=len(found), gpu_memory=memory, gpu_model=model, labels=labels)]


def utilization(nvml: Any = None) -> dict[int, dict]:
    """``{index: {"utilization": percent, "memory_used": bytes, "memory_total": bytes}}``.

    A GPU whose reading fails (e.g. utilization not supported on that model) gets ``None`` for
    that value rather than being left out."""
    mod = _module(nvml)
    if mod is None:
        return {}
    errors = _error_types(mod)
    try:
        with _session(mod):
            out: dict[int, dict] = {}
            for i in range(int(mod.nvmlDeviceGetCount())):
                h = mod.nvmlDeviceGetHandleByIndex(i)
                reading: dict[str, Any] = {"utilization": None, "memory_used": None, "memory_total": None}
                try:
                    reading["utilization"] = float(mod.nvmlDeviceGetUtilizationRates(h).gpu)
                except errors as e:
                    log.debug("NVML: no utilization for GPU %d: %s", i, e)
                try:
                    mem = mod.nvmlDeviceGetMemoryInfo(h)
                    reading["memory_used"] = int(mem.used)
                    reading["memory_total"] = int(mem.total)
                except errors as e:
                    log.debug("NVML: no memory info for GPU %d: %s", i, e)
                out[i] = reading
            return out
    except errors as e:
        _log_failure(e, "could not read utilization: %s", e)
        return {}


def process_memory(index: int, nvml: Any = None) -> dict[int, int]:
    """``{pid: bytes}`` of GPU memory held by each compute process on GPU ``index``.

    NVML reports ``None`` (NVML_VALUE_NOT_AVAILABLE) for processes in another container or
    under some drivers; those are reported as 0 bytes so the pid is still visible."""
    mod = _module(nvml)
    if mod is None:
        return {}
    try:
        with _session(mod):
            h = mod.nvmlDeviceGetHandleByIndex(int(index))
            out: dict[int, int] = {}
            for p in mod.nvmlDeviceGetComputeRunningProcesses(h):
                used = getattr(p, "usedGpuMemory", None)
                out[int(p.pid)] = out.get(int(p.pid), 0) + (int(used) if used is not None else 0)
            return out
    except _error_types(mod) as e:
        _log_failure(e, "could not list processes on GPU %s: %s", index, e)
        return {}


def load_module(path: str = "") -> Any | None:
    """The NVML module to call: ``""`` or ``"pynvml"`` = the real library (None here, so every function
    above imports it), else a dotted import path of a pynvml-compatible module, or ``module:attribute``
    for an object in a module (``c.GPUPool.nvml_module``; tests use a stand-in)."""
    if not path or path == "pynvml":
        return None
    import importlib

    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


class Reader:
    """This module's readings bound to one NVML module (what the hub service calls)."""

    def __init__(self, nvml: Any = None):
        self.nvml = nvml

    def available(self) -> bool:
        return available(nvml=self.nvml)

    def gpus(self) -> list[dict]:
        return gpus(nvml=self.nvml)

    def discover_nodes(self, node_name: str | None = None) -> list[NodeSpec]:
        return discover_nodes(node_name, nvml=self.nvml)

    def utilization(self) -> dict[int, dict]:
        return utilization(nvml=self.nvml)

    def process_memory(self, index: int) -> dict[int, int]:
        return process_memory(index, nvml=self.nvml)
