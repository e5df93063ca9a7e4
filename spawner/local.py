"""LocalGPUSpawner: the gpupool mixin on JupyterHub's LocalProcessSpawner.

Single-user servers run as local processes on the hub's machine, with the GPUs the scheduler
granted (``CUDA_VISIBLE_DEVICES`` and friends in their environment).

Users without system accounts (the default, ``system_users = False``): JupyterHub's
LocalProcessSpawner looks each user up with ``pwd.getpwnam`` and switches to that uid before
starting the server; with the dummy/first-use/OAuth authenticators those accounts usually do not
exist. Here each user instead gets a home directory ``home_root/<name>`` (created on first start,
seeded from ``home_skeleton``) and the server runs **as the hub's own user** there, with
``HOME``/``USER`` set. This is for single-tenant labs, demos and tests: users are not isolated
from each other or from the hub. Set ``c.LocalGPUSpawner.system_users = True`` to get
LocalProcessSpawner's behaviour (setuid to the user's system account, its home directory).

When the server process would run as root (a container, CI), ``--allow-root`` is added to its
arguments, because jupyter-server refuses to start as root otherwise.
"""
from __future__ import annotations

import os
import shutil

from jupyterhub.spawner import LocalProcessSpawner, SpawnException
from traitlets import Bool, Unicode, default

from ..protocol import Env, with_startup_hook
from .mixin import GPUPoolSpawnerMixin


class LocalGPUSpawner(GPUPoolSpawnerMixin, LocalProcessSpawner):
    """Local processes with GPUs granted by the gpupool scheduler."""

    system_users = Bool(
        False,
        help="""Run each server as the user's system account (LocalProcessSpawner's setuid, home from
        /etc/passwd). Off: no system accounts needed; servers run as the hub's user in
        home_root/<name> (no isolation between users: for demos and single-tenant machines).""",
    ).tag(config=True)

    home_root = Unicode(
        help="""Directory holding one home directory per user when system_users is off.
        Default: ./gpupool-homes under the hub's working directory.""",
    ).tag(config=True)

    @default("home_root")
    def _default_home_root(self) -> str:
        return os.path.abspath("gpupool-homes")

    home_skeleton = Unicode(
        "",
        help="""A directory whose contents are copied into each user's home when a server starts
        (files already there are never overwritten), e.g. example notebooks. Empty: none.""",
    ).tag(config=True)

    allow_root = Bool(
        True,
        help="""Add --allow-root to the server's arguments when it would run as root (jupyter-server
        refuses to run as root without it).""",
    ).tag(config=True)

    @property
    def home_dir(self) -> str:
        if self.system_users:
            import pwd
            return pwd.getpwnam(self.user.name).pw_dir
        name = self.user.name
        if not name or name in (".", "..") or "/" in name or "\0" in name or (os.altsep and os.altsep in name):
            raise SpawnException(f"User name {name!r} cannot be used as a directory name",
                                 reason="bad-username")
        return os.path.join(os.path.abspath(self.home_root), name)

    def _prepare_home(self) -> str:
        home = self.home_dir
        os.makedirs(home, 0o755, exist_ok=True)
        skel = self.home_skeleton
        if skel:
            if not os.path.isdir(skel):
                self.log.warning("home_skeleton %s is not a directory; nothing copied", skel)
            else:
                for root, dirs, files in os.walk(skel):
                    rel = os.path.relpath(root, skel)
                    target_dir = os.path.normpath(os.path.join(home, rel))
                    os.makedirs(target_dir, exist_ok=True)
                    for f in files:
                        target = os.path.join(target_dir, f)
                        if not os.path.exists(target):
                            shutil.copy2(os.path.join(root, f), target)
        return home

    def make_preexec_fn(self, name):
        if self.system_users:
            return super().make_preexec_fn(name)
        home = self.home_dir

        def preexec():  # runs in the child between fork and exec: no logging, no allocation-heavy work
            os.chdir(home)

        return preexec

    def get_env(self) -> dict:
        """With a fraction of a GPU, gpupool's start-up hook first on ``PYTHONPATH`` (as every job
        worker has it): the server's kernels tell PyTorch and TensorFlow the cap before they touch
        the GPU (``protocol.with_startup_hook``; the server runs this very gpupool)."""
        env = super().get_env()
        if Env.GPU_MEMORY_FRACTION in (self.gpu_env or {}):
            env = with_startup_hook(env)
        return env

    def user_env(self, env):
        if self.system_users:
            return super().user_env(env)
        env["USER"] = self.user.name
        env["HOME"] = self.home_dir
        env["SHELL"] = os.environ.get("SHELL", "/bin/bash")
        return env

    async def move_certs(self, paths):
        if self.system_users:
            return await super().move_certs(paths)
        return paths  # the server runs as the hub's user: it can read the hub's certs in place

    def get_args(self):
        args = super().get_args()
        if self.allow_root and not self.system_users and os.geteuid() == 0 and "--allow-root" not in args:
            args.append("--allow-root")
        return args

    async def start(self):
        if not self.system_users:
            self._prepare_home()
        return await super().start()
