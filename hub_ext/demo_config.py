"""The one-command demo hub: a ``jupyterhub_config.py`` written into ``./.gpupool-demo/``.

``gpupool hub --demo`` calls :func:`write_demo`, then runs ``jupyterhub`` in that directory.
Everything the demo creates (config, databases, user homes, job files) stays there; delete the
directory to start over.

* Login: JupyterHub's DummyAuthenticator; users ``alice``, ``bob`` and ``carol`` (admin), password
  ``gpupool`` (:data:`DEMO_PASSWORD`).
* Queues: ``vision`` (deserves 4 GPUs; alice) and ``nlp`` (deserves 4 GPUs; bob); carol is an
  admin.
* GPUs: this machine's GPUs when NVML finds some (``--gpus real``), else two declared nodes with
  four GPUs each (``--gpus declared``: scheduling is real, the GPUs are not, so
  ``CUDA_VISIBLE_DEVICES`` names devices that do not exist here), in two node pools: a build
  environment (``build``: 24Gi GPUs, where workspaces go first) and a train environment
  (``train``: 80Gi GPUs, where jobs go first); each queue deserves 2 GPUs in each pool.
* Idle GPUs: a workspace whose GPUs read 0 % for 30 minutes is suspended (one click on the hub's
  home page resumes it); the declared GPUs get simulated readings (``simulated_gpu_readings``:
  busy while a job runs or the server is active, 0 % otherwise), labelled so wherever shown.
* Servers: :class:`gpupool.spawner.LocalGPUSpawner` with homes in ``.gpupool-demo/homes/<user>``,
  seeded with the welcome notebook, ``train.ipynb`` (a checkpointing training loop: a first job
  that survives a preemption, and trains the model ``serve_model.py`` serves as an endpoint);
  JupyterLab opens on the welcome notebook at a user's first start (:func:`welcome_on_first_start`),
  on the launcher afterwards; ``slow_spawn_timeout`` is short so the queue position shows on the
  spawn page at once.
"""
from __future__ import annotations

import json
import secrets
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEMO_DIR = ".gpupool-demo"
DEMO_PASSWORD = "gpupool"
DEMO_USERS = ("alice", "bob", "carol")
DEMO_ADMINS = ("carol",)
DEMO_QUEUES = [
    {"name": "vision", "deserved": {"gpu": 4}, "users": ["alice"]},
    {"name": "nlp", "deserved": {"gpu": 4}, "users": ["bob"]},
]
# the declared demo: a build environment of small GPUs and a train environment of big ones
# (docs/admin.md, build and train environments), each queue with half its quota in each
DEMO_NODES = [{"name": "build-node", "gpus": 4, "gpu_memory": "24Gi", "gpu_model": "demo-24GB", "pool": "build"},
              {"name": "train-node", "gpus": 4, "gpu_memory": "80Gi", "gpu_model": "demo-80GB", "pool": "train"}]
DEMO_POOL_QUEUES = [{"name": q["name"], "users": q["users"],
                     "pools": {"build": {"deserved": {"gpu": 2}}, "train": {"deserved": {"gpu": 2}}}}
                    for q in DEMO_QUEUES]
DEMO_POOL_PREFERENCE = {"interactive": ["build", "train"], "train": ["train", "build"],
                        "hpo-trial": ["train", "build"]}
EXAMPLE_NOTEBOOK = "demo.ipynb"
EXAMPLE_DDP = "ddp_train.py"  # a 2-worker job: gpupool submit --pods 2 --gpus 1 ddp_train.py (needs torch)
TRAIN_NOTEBOOK = "train.ipynb"  # examples/train_checkpoint.ipynb: a first job that survives preemption
EXAMPLE_SERVE = "serve_model.py"  # serves the model train.ipynb writes: gpupool serve serve_model.py
WELCOMED = ".gpupool-welcomed"  # in a home: JupyterLab has opened on the welcome notebook once


@dataclass
class DemoOptions:
    port: int = 8000
    ip: str = "127.0.0.1"
    gpus: str = "declared"  # "real" or "declared" (the CLI resolves "auto")
    proxy_command: str = "configurable-http-proxy"
    singleuser: str = ""  # path of jupyterhub-singleuser; default: next to this Python
    admission_timeout: float = 600.0
    idle_after: str = "30m"  # the idle rule of workspaces
    simulated_activity: float = 600.0  # declared GPUs: seconds a server's GPUs read busy after its last activity
    control_token: str = field(default_factory=lambda: secrets.token_hex(32))  # the CLI stops servers with it
    extra: dict = field(default_factory=dict)

    @property
    def proxy_api_port(self) -> int:
        return self.port + 1

    @property
    def hub_port(self) -> int:
        return self.port + 2

    @property
    def service_port(self) -> int:
        return self.port + 3


def _example_notebook() -> dict:
    """examples/demo.ipynb from the source tree; a minimal built-in one when installed from a wheel."""
    src = Path(__file__).resolve().parents[1] / "examples" / EXAMPLE_NOTEBOOK
    if src.is_file():
        return json.loads(src.read_text())
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Your GPU workspace\n",
                                                              "The GPUs the scheduler gave this server:"]},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
         "source": ["import os\n", "{k: v for k, v in os.environ.items() if k.startswith(('CUDA', 'GPUPOOL'))}"]},
    ]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                          "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def _train_notebook() -> dict:
    """examples/train_checkpoint.ipynb from the source tree; a minimal checkpointing loop when
    installed from a wheel."""
    src = Path(__file__).resolve().parents[1] / "examples" / "train_checkpoint.ipynb"
    if src.is_file():
        return json.loads(src.read_text())
    params = {"cell_type": "code", "metadata": {"tags": ["parameters"]}, "execution_count": None, "outputs": [],
              "source": ["steps = 20\n", "step_seconds = 0.2"]}
    loop = {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
            "source": ["import time\n", "from gpupool import checkpoint\n",
                       "state = checkpoint.load(default={'step': 0})\n",
                       "for step in range(state['step'], steps):\n", "    time.sleep(step_seconds)\n",
                       "    checkpoint.save({'step': step + 1}, step=step + 1)\n",
                       "    if checkpoint.should_stop():\n", "        break"]}
    return {"cells": [params, loop], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                  "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def welcome_on_first_start(spawner) -> None:
    """The demo's ``Spawner.pre_spawn_hook``: a user's first server opens JupyterLab on the welcome
    notebook; later ones on the launcher (``/lab``). The first start leaves ``.gpupool-welcomed`` in
    the home (delete it to see the welcome again)."""
    home = Path(spawner.home_dir)
    marker = home / WELCOMED
    if (home / EXAMPLE_NOTEBOOK).is_file() and not marker.exists():
        spawner.default_url = f"/lab/tree/{EXAMPLE_NOTEBOOK}"
        marker.write_text("JupyterLab opened on the welcome notebook once; delete this file to see it again\n")
    else:
        spawner.default_url = "/lab"


def nodes_for(gpus: str, nvml_module=None) -> list[dict]:
    """Node entries for ``c.GPUPool.nodes``: this machine's GPUs (NVML) or the declared demo nodes.
    ``nvml_module``: the pynvml module to use (default: the real one)."""
    if gpus == "real":
        from ..backends import nvml

        found = nvml.discover_nodes(nvml=nvml_module)
        return [{"name": n.name, "gpus": n.gpus, "gpu_memory": n.gpu_memory, "gpu_model": n.gpu_model}
                for n in found]
    return DEMO_NODES


def config_text(root: Path, opts: DemoOptions) -> str:
    """The demo's jupyterhub_config.py (a plain Python file an admin can read and copy from)."""
    root = root.resolve()
    singleuser = opts.singleuser or str(Path(sys.executable).parent / "jupyterhub-singleuser")
    settings = {
        "port": opts.port, "ip": opts.ip, "proxy_api_port": opts.proxy_api_port, "hub_port": opts.hub_port,
        "service_port": opts.service_port, "proxy_command": opts.proxy_command, "singleuser": singleuser,
        "root": str(root), "nodes": nodes_for(opts.gpus), "queues": DEMO_QUEUES,
    }
    pools = ""
    readings = ""
    if opts.gpus != "real":  # declared GPUs have no readings: simulated ones show the idle rules at work
        readings = ("# The declared GPUs are not measured: SIMULATED readings (labelled so everywhere) let the idle rules\n"
                    "# be seen at work. A GPU reads busy while a running job holds it, or while the hub saw its\n"
                    "# workspace's server active in the last simulated_activity_seconds; 0 % otherwise.\n"
                    "c.GPUPool.simulated_gpu_readings = True\n"
                    f"c.GPUPool.simulated_activity_seconds = {opts.simulated_activity!r}\n")
    if opts.gpus != "real":  # the declared nodes are two pools: a build and a train environment
        settings["queues"] = DEMO_POOL_QUEUES
        pools = ("# build and train environments (docs/admin.md): workspaces prefer the small GPUs of pool build,\n"
                 "# jobs the big ones of pool train, each falling back on the other\n"
                 f"c.GPUPool.pool_preference = {DEMO_POOL_PREFERENCE!r}\n")
    return f'''# Generated by `gpupool hub --demo` ({opts.gpus} GPUs). Rewritten at every demo start:
# copy it elsewhere to make your own hub config, then run `gpupool hub --config FILE`.
import os

from gpupool.hub_ext import add_idle_culler, configure
from gpupool.hub_ext.demo_config import welcome_on_first_start

c = get_config()  # noqa: F821
ROOT = {settings["root"]!r}

# -- the hub -------------------------------------------------------------------------------
c.JupyterHub.ip = {opts.ip!r}
c.JupyterHub.port = {opts.port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {opts.hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{opts.proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{opts.proxy_command!r}]
c.JupyterHub.db_url = "sqlite:///" + os.path.join(ROOT, "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(ROOT, "jupyterhub_cookie_secret")
c.JupyterHub.cleanup_servers = True  # stopping the demo stops every server

# -- logins: JupyterHub's dummy authenticator, one shared password (demo only!) ------------------
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {DEMO_PASSWORD!r}
c.Authenticator.allowed_users = {set(DEMO_USERS)!r}
c.Authenticator.admin_users = {set(DEMO_ADMINS)!r}

# -- servers: local processes whose GPUs the gpupool scheduler grants --------------------------
c.JupyterHub.spawner_class = "gpupool.spawner.LocalGPUSpawner"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.default_url = "/lab"
c.Spawner.pre_spawn_hook = welcome_on_first_start  # the first start opens the welcome notebook
c.LocalGPUSpawner.home_root = os.path.join(ROOT, "homes")
c.LocalGPUSpawner.home_skeleton = os.path.join(ROOT, "skel")
c.LocalGPUSpawner.admission_timeout = {opts.admission_timeout!r}
# show the spawn page with its progress (the queue position) after 1 s instead of 10
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 1}}

# -- `gpupool hub` stops every server through this token before the hub shuts down (and lists the
# jobs that outlive it) ------------------------------------------------------------------------
c.JupyterHub.services = [{{"name": "gpupool-demo-control", "api_token": {opts.control_token!r}}}]
c.JupyterHub.load_roles = [{{"name": "gpupool-demo-control",
                            "scopes": ["list:users", "read:servers", "servers", "custom:gpupool:admin"],
                            "services": ["gpupool-demo-control"]}}]

# -- the gpupool service: queues and GPUs --------------------------------------------------------
c.GPUPool.port = {opts.service_port}
c.GPUPool.queues = {settings["queues"]!r}
c.GPUPool.nodes = {settings["nodes"]!r}
{pools}c.GPUPool.run_as_user = False  # demo users have no system accounts
c.GPUPool.work_dir = os.path.join(ROOT, "homes", "{{user}}")
c.GPUPool.db_url = "sqlite:///" + os.path.join(ROOT, "gpupool.sqlite")
c.GPUPool.job_root = os.path.join(ROOT, "jobs")
# idle GPUs (docs/admin.md): suspend a workspace whose GPUs read 0 % for 30 minutes, flag idle jobs.
c.GPUPool.idle_rules = {{"*": {{"interactive": {{"after": "{opts.idle_after}"}}, "train": {{"after": "1h", "action": "flag"}}}}}}
{readings}configure(c)

# -- servers idle for an hour are stopped, so their GPUs go back to the pool (jupyterhub-idle-culler) --
add_idle_culler(c, timeout=3600)
'''


def write_demo(root: Path | str = DEMO_DIR, opts: DemoOptions | None = None) -> Path:
    """Create the demo directory (config, skeleton home with the example notebook, homes of the
    demo users seeded with it); returns the config file's path."""
    opts = opts or DemoOptions()
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    skel = root / "skel"
    skel.mkdir(exist_ok=True)
    (skel / EXAMPLE_NOTEBOOK).write_text(json.dumps(_example_notebook(), indent=1))
    (skel / TRAIN_NOTEBOOK).write_text(json.dumps(_train_notebook(), indent=1))
    for user in DEMO_USERS:
        home = root / "homes" / user
        home.mkdir(parents=True, exist_ok=True)
        for name in (EXAMPLE_NOTEBOOK, TRAIN_NOTEBOOK):
            if not (home / name).exists():
                shutil.copy2(skel / name, home / name)
        for name in (EXAMPLE_DDP, EXAMPLE_SERVE):
            src = Path(__file__).resolve().parents[1] / "examples" / name  # source tree only
            if src.is_file() and not (home / name).exists():
                shutil.copy2(src, home / name)
    path = root / "jupyterhub_config.py"
    path.write_text(config_text(root, opts))
    return path


def banner(opts: DemoOptions) -> str:
    url = f"http://{opts.ip}:{opts.port}/"
    gpus = ("this machine's GPUs (NVML)" if opts.gpus == "real"
            else "2 declared nodes x 4 GPUs (no real GPUs: scheduling is real, devices are not) in two pools: "
                 "build (24Gi, workspaces go there first) and train (80Gi, jobs go there first)")
    return (f"\ngpupool demo hub is up: {url}\n"
            f"  log in as alice (queue vision), bob (queue nlp) or carol (admin); password: {DEMO_PASSWORD}\n"
            f"  GPUs: {gpus}\n"
            + (f"  idle workspaces are suspended after {opts.idle_after} of 0 % (SIMULATED readings of the declared GPUs: "
               "busy while a job runs or the server is in use)\n" if opts.gpus != "real" else "") +
            f"  dashboard (queues, GPU-hours, idle GPUs): {url}services/gpupool/  ·  `gpupool report --since ...`\n"
            f"  files: {DEMO_DIR}/ (delete it to start over); Ctrl-C stops the hub and every server\n"
            f"  (running jobs keep running; the next start re-adopts them)\n")
