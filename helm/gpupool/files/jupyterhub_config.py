# jupyterhub_config.py of the gpupool chart. Reads the chart's values from
# $GPUPOOL_CHART_CONFIG_DIR/values.json (the ConfigMap, mounted at /etc/gpupool) and the secrets from the environment.
import json
import os

from gpupool.hub_ext import add_idle_culler, configure

c = get_config()  # noqa: F821
CONF_DIR = os.environ.get("GPUPOOL_CHART_CONFIG_DIR", "/etc/gpupool")  # the ConfigMap's mount
V = json.load(open(os.path.join(CONF_DIR, "values.json")))
POD_IP = os.environ["POD_IP"]
names = V["names"]
pool = V["gpupool"]

# -- JupyterHub behind its own configurable-http-proxy pod --------------------------------------
c.JupyterHub.hub_ip = "0.0.0.0"
c.JupyterHub.hub_port = 8081
c.JupyterHub.hub_connect_ip = names["hub"]
c.ConfigurableHTTPProxy.should_start = False
c.ConfigurableHTTPProxy.api_url = f"http://{names['proxyApi']}:8001"
c.ConfigurableHTTPProxy.auth_token = os.environ["CONFIGPROXY_AUTH_TOKEN"]
c.JupyterHub.cookie_secret = bytes.fromhex(os.environ["JPY_COOKIE_SECRET"])
c.JupyterHub.db_url = os.environ.get("JUPYTERHUB_DB_URL") or "sqlite:////srv/gpupool/data/jupyterhub.sqlite"
c.JupyterHub.authenticator_class = V["hub"]["authenticatorClass"]
if V["hub"]["adminUsers"]:
    c.Authenticator.admin_users = set(V["hub"]["adminUsers"])
if V["hub"]["allowedUsers"]:
    c.Authenticator.allowed_users = set(V["hub"]["allowedUsers"])
c.JupyterHub.cleanup_servers = False  # notebook pods survive hub restarts and upgrades
c.JupyterHub.log_level = V["hub"]["logLevel"]

# -- the gpupool service, inside the hub pod ----------------------------------------------------
c.GPUPool.port = pool["port"]
c.GPUPool.api_token = os.environ["GPUPOOL_API_TOKEN"]
configure(c, spawner=False)
c.GPUPool.queues = pool["queues"]
c.GPUPool.db_url = os.environ.get("GPUPOOL_DB_URL") or "sqlite:////srv/gpupool/data/gpupool.sqlite"
c.GPUPool.job_root = "/srv/gpupool/jobs"
c.GPUPool.work_dir = "/srv/gpupool/jobs/.homes/{user}"
c.GPUPool.run_as_user = False
c.GPUPool.preemption_grace = float(pool["preemptionGrace"])
c.GPUPool.kill_after = float(pool["killAfter"])
c.GPUPool.min_runtime = float(pool["minRuntime"])
c.GPUPool.cycle_seconds = float(pool["cycleSeconds"])
c.GPUPool.cycle_in_process = bool(pool.get("cycleInProcess", True))
c.GPUPool.cycle_timeout = float(pool.get("cycleTimeout", 60))
c.GPUPool.placement = pool["placement"]
c.GPUPool.pool_preference = pool.get("poolPreference") or {}  # build and train environments
c.GPUPool.fairness = pool.get("fairness") or {}  # fairness over time (empty: off)
c.GPUPool.gpu_memory_reserve = float(pool.get("gpuMemoryReserve", 0.03))
c.GPUPool.gpu_memory_reserve_min = pool.get("gpuMemoryReserveMin", "256Mi")
c.GPUPool.prometheus_url = pool.get("prometheusUrl", "") or ""
c.GPUPool.backend = "gpupool.backends.kubernetes.KubeJobBackend"
# jobs reach the service through the hub Service (port 'gpupool')
c.GPUPool.api_url = f"http://{names['hub']}.{names['namespace']}.svc:{pool['port']}/services/gpupool/api/v1/"
inventory = pool["inventory"]
# kubernetes discovery: the Kubernetes backend fills the node list from the API at service start
c.GPUPool.nodes = inventory["nodes"] if inventory["discovery"] == "declared" else []

# The proxy pod routes /services/gpupool/ to the service at this pod's IP; the service binds it.
for svc in c.JupyterHub.services:
    if svc.get("name") == "gpupool":
        svc["url"] = f"http://{POD_IP}:{pool['port']}"
        env = dict(svc.get("environment") or {})
        for key in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "GPUPOOL_KUBE_CONFIG", "GPUPOOL_JOB_IMAGE",
                    "POD_NAMESPACE"):
            if key in os.environ:
                env[key] = os.environ[key]
        svc["environment"] = env

# -- users' notebook servers: KubeSpawner with gpupool admission --------------------------------
su = V["singleuser"]
c.JupyterHub.spawner_class = "gpupool.spawner.kube.GPUPoolKubeSpawner"
c.KubeSpawner.namespace = names["namespace"]
c.KubeSpawner.image = su["image"]
c.KubeSpawner.start_timeout = su["startTimeout"]
# Helm drops null values: a missing key means "not set"
for trait, value in (("uid", su.get("uid")), ("fs_gid", su.get("fsGid")),
                     ("cpu_guarantee", (su.get("cpu") or {}).get("guarantee")),
                     ("cpu_limit", (su.get("cpu") or {}).get("limit")),
                     ("mem_guarantee", (su.get("memory") or {}).get("guarantee")),
                     ("mem_limit", (su.get("memory") or {}).get("limit"))):
    if value is not None:
        setattr(c.KubeSpawner, trait, value)
c.KubeSpawner.extra_labels = {"gpupool.io/release": names["release"]}
c.GPUPoolKubeSpawner.gpupool_url = f"http://{POD_IP}:{pool['port']}/services/gpupool/"
c.GPUPoolKubeSpawner.gpu_runtime_class = su["gpuRuntimeClassName"]
if su.get("profiles"):
    c.KubeSpawner.profile_list = su["profiles"]
if su["storage"]["type"] == "dynamic":
    c.KubeSpawner.storage_pvc_ensure = True
    c.KubeSpawner.pvc_name_template = "claim-{username}"
    c.KubeSpawner.storage_capacity = su["storage"]["capacity"]
    if su["storage"]["storageClass"]:
        c.KubeSpawner.storage_class = su["storage"]["storageClass"]
    c.KubeSpawner.volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-{username}"}}]
    c.KubeSpawner.volume_mounts = [{"name": "home", "mountPath": su["storage"]["homeMountPath"]}]

if su.get("extraEnv"):
    c.KubeSpawner.environment = dict(su["extraEnv"])

# -- cull: idle servers are stopped, so their GPUs go back to the pool ------------------------------
cull = V["cull"]
if cull.get("enabled"):
    add_idle_culler(c, timeout=cull["timeout"], every=cull.get("every", 0), concurrency=cull.get("concurrency", 10),
                    max_age=cull.get("maxAge", 0), users=cull.get("users", False),
                    admin_users=cull.get("adminUsers", True), remove_named_servers=cull.get("removeNamedServers", False))

# -- hub.config (z2jh): {Class: {trait: value}} ---------------------------------------------------
for _cls, _traits in (V["hub"].get("config") or {}).items():
    for _trait, _value in _traits.items():
        setattr(getattr(c, _cls), _trait, _value)

# -- hub.extraConfig ------------------------------------------------------------------------------
_extra = os.path.join(CONF_DIR, "extra_config.py")
if os.path.exists(_extra):
    exec(compile(open(_extra).read(), _extra, "exec"))
