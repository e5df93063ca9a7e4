"""The Helm chart helm/gpupool: rendered with Helm's own library (helm-python-sdk bundles Helm v4),
every manifest validated against the official Kubernetes 1.32 schemas, values.schema.json
enforced, lint clean, and the rendered jupyterhub_config.py executed to check it configures the
hub, the gpupool service and the Kubernetes backend as the values say."""
from __future__ import annotations

import json
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from traitlets.config.loader import PyFileConfigLoader

from gpupool.backends.kubernetes import load_settings

CHART = Path(__file__).resolve().parents[2] / "helm" / "gpupool"
CI = sorted(p.stem.replace("-values", "") for p in (CHART / "ci").glob("*-values.yaml"))
K8S = "1.32.0"


def values(name: str) -> dict:
    return yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text()) or {}


@pytest.fixture(scope="module")
def chart():
    return helm.Chart.load(str(CHART))


def render(chart, vals: dict, namespace: str = "jhub") -> list[dict]:
    out = chart.render(vals, name="lab", namespace=namespace, is_install=True)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):  # as helm install would set it
                    doc.setdefault("metadata", {}).setdefault("namespace", namespace)
                docs.append(doc)
    return docs


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_ci_values_cover_the_main_configurations():
    assert CI == ["declared-inventory", "default", "postgres", "z2jh"]


@pytest.mark.parametrize("name", CI)
def test_every_rendered_manifest_is_valid_kubernetes(chart, name):
    docs = render(chart, values(name))
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "ServiceAccount", "Role", "RoleBinding"} <= kinds
    for doc in docs:
        kubernetes_validate.validate(doc, K8S, strict=True)


@pytest.mark.parametrize("name", CI)
def test_lint_is_clean(name):
    report = helm.lint(str(CHART), values(name), strict=True, namespace="jhub", kube_version="v1.32.0")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_notes_tell_how_to_log_in(chart):
    notes = chart.render(values("default"), name="lab", namespace="jhub", is_install=True)["gpupool/templates/NOTES.txt"]
    assert "kubectl -n jhub get service lab-gpupool-proxy-public" in notes
    assert 'The authenticator is "dummy"' in notes
    notes = chart.render(values("postgres"), name="lab", namespace="jhub", is_install=True)["gpupool/templates/NOTES.txt"]
    assert "<any node IP>:<node port>" in notes and "admins: alice" in notes


def test_rbac_is_least_privilege(chart):
    docs = render(chart, values("default"))
    role = by_kind(docs, "Role")[0]
    rules = {(tuple(r["resources"]), tuple(sorted(r["verbs"]))) for r in role["rules"]}
    assert rules == {(("pods",), ("create", "delete", "get", "list", "watch")), (("pods/log",), ("get",)),
                     (("events",), ("get", "list", "watch")), (("persistentvolumeclaims",), ("create", "get", "list")),
                     (("secrets",), ("create",)), (("services",), ("create",))}
    cluster = by_kind(docs, "ClusterRole")[0]
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in cluster["rules"])  # read-only cluster-wide
    assert {tuple(r["resources"]) for r in cluster["rules"]} == {("nodes",), ("pods",)}
    # declared inventory, no foreign pods: nothing cluster-wide at all
    docs = render(chart, values("declared-inventory"))
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    assert not by_kind(docs, "NetworkPolicy")


def test_storage_and_database(chart):
    docs = render(chart, values("default"))
    claims = {d["metadata"]["name"]: d for d in by_kind(docs, "PersistentVolumeClaim")}
    assert set(claims) == {"lab-gpupool-hub-data", "lab-gpupool-jobs"}
    assert claims["lab-gpupool-jobs"]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert all(c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for c in claims.values())
    hub = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "lab-gpupool-hub")
    pod = hub["spec"]["template"]["spec"]
    assert hub["spec"]["strategy"]["type"] == "Recreate" and hub["spec"]["replicas"] == 1
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == "lab-gpupool-hub-data"
    assert vols["jobs"]["persistentVolumeClaim"]["claimName"] == "lab-gpupool-jobs"
    assert pod["serviceAccountName"] == "lab-gpupool-hub"

    docs = render(chart, values("postgres"))
    assert [c["metadata"]["name"] for c in by_kind(docs, "PersistentVolumeClaim")] == ["lab-gpupool-jobs"]
    db = next(d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == "lab-gpupool-db")
    assert db["stringData"]["gpupool-db-url"].startswith("postgresql+psycopg2://")
    hub = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "lab-gpupool-hub")
    env = {e["name"]: e for e in hub["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUPOOL_DB_URL"]["valueFrom"]["secretKeyRef"] == {"name": "lab-gpupool-db", "key": "gpupool-db-url"}
    assert env["JUPYTERHUB_DB_URL"]["valueFrom"]["secretKeyRef"]["key"] == "hub-db-url"
    svc = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "lab-gpupool-proxy-public")
    assert svc["spec"]["type"] == "NodePort" and svc["spec"]["ports"][0]["nodePort"] == 30080

    docs = render(chart, values("declared-inventory"))
    assert not by_kind(docs, "PersistentVolumeClaim") or all(
        c["metadata"]["name"] != "lab-gpupool-jobs" for c in by_kind(docs, "PersistentVolumeClaim"))
    hub = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "lab-gpupool-hub")
    vols = {v["name"]: v for v in hub["spec"]["template"]["spec"]["volumes"]}
    assert vols["jobs"]["persistentVolumeClaim"]["claimName"] == "lab-nfs-jobs"


@pytest.mark.parametrize("name", CI)
def test_rendered_hub_config_runs_and_configures_gpupool(chart, name, tmp_path, monkeypatch):
    """Execute the chart's jupyterhub_config.py (as the hub would) with the rendered ConfigMap."""
    docs = render(chart, values(name))
    cm = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "lab-gpupool-hub")
    for key, text in cm["data"].items():
        (tmp_path / key).write_text(text)
    monkeypatch.setenv("GPUPOOL_CHART_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    monkeypatch.setenv("CONFIGPROXY_AUTH_TOKEN", "proxy-token")
    monkeypatch.setenv("JPY_COOKIE_SECRET", "ab" * 32)
    monkeypatch.setenv("GPUPOOL_API_TOKEN", "svc-token")
    monkeypatch.setenv("GPUPOOL_KUBE_CONFIG", str(tmp_path / "kube.json"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    c = PyFileConfigLoader(str(tmp_path / "jupyterhub_config.py")).load_config()
    assert c.JupyterHub.spawner_class == "gpupool.spawner.kube.GPUPoolKubeSpawner"
    assert c.GPUPool.backend == "gpupool.backends.kubernetes.KubeJobBackend"
    assert c.ConfigurableHTTPProxy.api_url == "http://lab-gpupool-proxy-api:8001"
    assert c.JupyterHub.hub_connect_ip == "lab-gpupool-hub"
    assert c.GPUPool.api_url == "http://lab-gpupool-hub.jhub.svc:10101/services/gpupool/api/v1/"
    assert (c.GPUPool.gpu_memory_reserve, c.GPUPool.gpu_memory_reserve_min) == (0.03, "256Mi")  # the defaults
    assert c.GPUPool.prometheus_url == ""  # no DCGM readings unless the chart names a Prometheus
    from gpupool.hub_ext.config import check
    assert check(c, discover=False)[0] == []  # the service takes these settings
    svc = next(s for s in c.JupyterHub.services if s["name"] == "gpupool")
    assert svc["url"] == "http://10.1.2.3:10101"  # the proxy pod reaches the service at the hub pod's IP
    assert svc["environment"]["GPUPOOL_KUBE_CONFIG"] == str(tmp_path / "kube.json")
    assert svc["environment"]["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"  # in-cluster API for the backend
    assert c.GPUPoolKubeSpawner.gpupool_url == "http://10.1.2.3:10101/services/gpupool/"
    # the service's role (from configure(c)): workspace reconciliation lists users and their servers
    from jupyterhub.scopes import scope_definitions

    svc_scopes = set().union(*(r.get("scopes", []) for r in c.JupyterHub.load_roles
                               if "gpupool" in r.get("services", [])))
    assert {"list:users", "read:servers", "custom:gpupool:admin"} <= svc_scopes, c.JupyterHub.load_roles
    assert all(sc in scope_definitions or sc in c.JupyterHub.custom_scopes for sc in svc_scopes), svc_scopes
    kube = load_settings()
    assert kube.namespace == "jhub" and kube.jobs_claim in ("lab-gpupool-jobs", "lab-nfs-jobs")
    assert kube.image == "ghcr.io/gpupool/hub:0.1.0" and kube.jobs_mount == c.GPUPool.job_root
    v = values(name)
    if name == "declared-inventory":
        assert c.GPUPool.nodes == v["gpupool"]["inventory"]["nodes"] and kube.discovery == "declared"
        assert c.GPUPool.queues == v["gpupool"]["queues"] and c.GPUPool.queues[1]["policy"]["train"]["limits"] == {
            "gpus": 4}  # the values carry workload policies to the service (checked above: check() == [])
        assert kube.home_claim == "" and not kube.count_foreign_pods
    else:
        assert c.GPUPool.nodes == [] and kube.discovery == "kubernetes"
        assert kube.home_claim == "claim-{username}"
    culler = [sv for sv in c.JupyterHub.services if sv["name"] == "idle-culler"]
    assert len(culler) == (0 if v.get("cull", {}).get("enabled") is False else 1)
    if name == "z2jh":  # z2jh's names and shapes
        assert c.JupyterHub.authenticator_class == "github" and c.JupyterHub.admin_access is True  # hub.config
        assert c.GitHubOAuthenticator.client_id == "the-client-id" and c.Authenticator.admin_users == ["alice"]
        assert c.JupyterHub.template_vars["announcement"].startswith("GPUs are shared")  # hub.extraConfig snippets,
        assert c.Spawner.http_timeout == 120  # run in key order
        assert c.KubeSpawner.image == "quay.io/jupyter/pytorch-notebook:2024-12-09"  # singleuser.image.name
        assert [p["display_name"] for p in c.KubeSpawner.profile_list] == ["CPU only", "Half a GPU (vision)"]
        assert c.KubeSpawner.environment == {"HF_HOME": "/home/jovyan/.cache/huggingface"}  # singleuser.extraEnv
        assert c.KubeSpawner.cpu_limit == 4 and c.KubeSpawner.mem_guarantee == "4G"
        cmd = culler[0]["command"]  # cull: jupyterhub-idle-culler as a hub service with its role
        assert cmd[1:3] == ["-m", "jupyterhub_idle_culler"] and "--timeout=1800" in cmd and "--cull-every=300" in cmd
        role = next(r for r in c.JupyterHub.load_roles if r["name"] == "idle-culler")
        assert {"list:users", "read:users:activity", "delete:servers"} <= set(role["scopes"])
        assert role["services"] == ["idle-culler"]
    if name == "postgres":
        assert c.KubeSpawner.profile_list[1]["kubespawner_override"]["gpupool"] == {"gpus": 0.5, "queue": "vision"}
        assert c.GPUPoolKubeSpawner.gpu_runtime_class == "nvidia" and kube.runtime_class == "nvidia"
        assert kube.memory == "16Gi" and kube.cpu == 4.0
        assert c.GitHubOAuthenticator.oauth_callback_url.startswith("https://")  # hub.extraConfig ran
        assert c.Authenticator.admin_users == {"alice"}


def test_z2jh_values_render_ingress_and_proxy_tls(chart):
    docs = render(chart, values("z2jh"))
    (ing,) = by_kind(docs, "Ingress")
    assert ing["spec"]["ingressClassName"] == "nginx"
    assert ing["metadata"]["annotations"] == {"cert-manager.io/cluster-issuer": "letsencrypt"}
    assert ing["spec"]["tls"] == [{"hosts": ["hub.example.org"], "secretName": "hub-tls"}]
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "hub.example.org"
    assert rule["http"]["paths"][0]["backend"]["service"] == {"name": "lab-gpupool-proxy-public", "port": {"name": "http"}}
    proxy = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "lab-gpupool-proxy")
    pod = proxy["spec"]["template"]["spec"]
    chp = pod["containers"][0]
    assert "--ssl-port=8443" in chp["command"] and "--ssl-cert=/etc/chp/tls/tls.crt" in chp["command"]
    assert pod["volumes"] == [{"name": "tls", "secret": {"secretName": "hub-tls"}}]
    svc = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "lab-gpupool-proxy-public")
    assert {"name": "https", "port": 443, "targetPort": "https"} in svc["spec"]["ports"]
    # the defaults render no ingress and no TLS
    docs = render(chart, values("default"))
    assert not by_kind(docs, "Ingress")
    proxy = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "lab-gpupool-proxy")
    assert not any("ssl" in a for a in proxy["spec"]["template"]["spec"]["containers"][0]["command"])


def test_pools_and_fairness_reach_the_service(chart, tmp_path, monkeypatch):
    """The declared-inventory values: nodes in two pools, quotas per pool, the pool preference and
    fairness over time reach c.GPUPool as the service takes them; the pool label reaches the
    Kubernetes settings (its default, gpupool.io/pool)."""
    docs = render(chart, values("declared-inventory"))
    cm = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "lab-gpupool-hub")
    for key, text in cm["data"].items():
        (tmp_path / key).write_text(text)
    for key, value in (("GPUPOOL_CHART_CONFIG_DIR", str(tmp_path)), ("POD_IP", "10.1.2.3"),
                       ("CONFIGPROXY_AUTH_TOKEN", "t"), ("JPY_COOKIE_SECRET", "ab" * 32), ("GPUPOOL_API_TOKEN", "t"),
                       ("GPUPOOL_KUBE_CONFIG", str(tmp_path / "kube.json"))):
        monkeypatch.setenv(key, value)
    c = PyFileConfigLoader(str(tmp_path / "jupyterhub_config.py")).load_config()
    from gpupool.hub_ext.config import load
    st = load(c, cwd=str(tmp_path), discover=False)
    assert {n.pool for n in st.nodes} == {"build", "train"}
    assert next(q for q in st.queues if q.name == "nlp").pools["train"].over_quota_weight == 2
    assert st.pool.pool_preference == {"interactive": ["build", "train"], "train": ["train", "build"]}
    assert st.pool.fairness == {"window": "7d", "half_life": "1d", "k": 1}
    assert load_settings().pool_label == "gpupool.io/pool"
    docs = render(chart, {**values("default"), "gpupool": {"inventory": {"poolLabel": "site/pool"}}})
    cm = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "lab-gpupool-hub")
    assert json.loads(cm["data"]["kube.json"])["GPUPoolKubernetes"]["pool_label"] == "site/pool"


@pytest.mark.parametrize("bad, words", [
    ({"gpupool": {"queues": [{"name": "vision", "deserved": {"gpu": "lots"}}]}}, "gpu"),
    ({"gpupool": {"queues": [{"deserved": {"gpu": 1}}]}}, "name"),
    ({"gpupool": {"queue": []}}, "queue"),
    ({"gpupool": {"preemptionGrace": -1}}, "preemptionGrace"),
    ({"gpupool": {"gpuMemoryReserve": 1}}, "gpuMemoryReserve"),
    ({"gpupool": {"gpuMemoryReserveMin": "lots"}}, "gpuMemoryReserveMin"),
    ({"gpupool": {"prometheusUrl": "prometheus:9090"}}, "prometheusUrl"),
    ({"gpupool": {"inventory": {"discovery": "nvml"}}}, "discovery"),
    ({"gpupool": {"inventory": {"discovery": "declared"}}}, "nodes"),
    ({"proxy": {"service": {"type": "Ingress"}}}, "type"),
    ({"database": {"type": "postgres"}}, "postgres"),
    ({"database": {"type": "postgres", "postgres": {"gpupoolUrl": "mysql://x"}}}, "gpupoolUrl"),
    ({"singleuser": {"profiles": [{"display_name": "x", "kubespawner_override": {"gpupool": {"gpus": 0}}}]}}, "gpus"),
    ({"proxy": {"https": {"enabled": True, "type": "letsencrypt"}}}, "type"),
    ({"proxy": {"https": {"enabled": True, "type": "secret"}}}, "secret"),
    ({"cull": {"timeout": 0}}, "timeout"),
    ({"ingress": {"enabled": True, "tls": [{"hosts": ["x"]}]}}, "secretName"),
    ({"hub": {"extraConfig": {"00-x": 5}}}, "extraConfig"),
    ({"gpupool": {"queues": [{"name": "q", "policy": {"gpu-hog": {}}}]}}, "gpu-hog"),
    ({"gpupool": {"queues": [{"name": "q", "policy": {"train": {"limits": {"gpu": 2}}}}]}}, "gpu"),
    ({"gpupool": {"fairness": {"window_type": "rolling"}}}, "window_type"),
    ({"gpupool": {"fairness": {"halflife": 60}}}, "halflife"),
    ({"gpupool": {"fairness": {"k": -1}}}, "k"),
    ({"gpupool": {"poolPreference": {"notebook": ["build"]}}}, "notebook"),
    ({"gpupool": {"queues": [{"name": "q", "pools": {"build": {"weight": 2}}}]}}, "weight"),
    ({"gpupool": {"inventory": {"discovery": "declared", "nodes": [{"name": "n", "pool": ""}]}}}, "pool"),
])
def test_bad_values_fail_at_install(chart, bad, words):
    with pytest.raises(helm.HelmError) as e:
        chart.render(bad, name="lab", namespace="jhub", is_install=True)
    assert words in str(e.value), str(e.value)
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(bad)


def test_placement_choices_are_the_schedulers():
    import json

    from gpupool.scheduler.placement import POLICIES

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert tuple(schema["properties"]["gpupool"]["properties"]["placement"]["enum"]) == POLICIES
    assert all(f"`{p}`" in (CHART.parents[1] / "docs" / "hub.md").read_text() for p in POLICIES)


def test_grafana_dashboard_uses_the_services_metrics(chart):
    """The dashboard ConfigMap is there when enabled, with the sidecar's label, and every metric its
    panels query is one the gpupool service exports (hub_ext/runtime/metrics.py)."""
    import json
    import re

    from gpupool.hub_ext.runtime.metrics import Metrics

    assert not [d for d in by_kind(render(chart, values("default")), "ConfigMap") if "grafana" in d["metadata"]["name"]]
    docs = render(chart, {**values("default"), "grafana": {"dashboard": {"enabled": True}}})
    [cm] = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-grafana-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["gpupool.json"])
    families = list(Metrics().registry.collect())  # labelled series have no samples yet: use the families
    exported = {m.name + ("_total" if m.type == "counter" else "") for m in families} | {
        s.name for m in families for s in m.samples}
    used = {name for p in dash["panels"] for t in p["targets"] for name in re.findall(r"\bgpupool_\w+", t["expr"])}
    assert used and used <= exported | {n + "_bucket" for n in exported}, used - exported
    for want in ("gpupool_gpu_hours_allocated_total", "gpupool_gpu_hours_used_total", "gpupool_idle_gpus",
                 "gpupool_evictions_total", "gpupool_gpu_utilization"):
        assert want in used
