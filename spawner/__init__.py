"""GPU-aware JupyterHub spawners: servers start only when the gpupool scheduler grants their GPUs.

``GPUPoolSpawnerMixin`` adds admission to any spawner; ``LocalGPUSpawner`` is the mixin on
JupyterHub's LocalProcessSpawner. See docs/workspaces.md.
"""
from .mixin import GPUPoolError, GPUPoolSpawnerMixin
from .local import LocalGPUSpawner

__all__ = ["GPUPoolSpawnerMixin", "LocalGPUSpawner", "GPUPoolError"]
