"""The Kubernetes job backend end to end against a real HTTP Kubernetes API (kmock + the fake
kubelet of tests/support/kube_fixture.py), the job pod manifests against the official schemas, and the
job pod's entrypoint running real papermill with a real kernel."""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time

import kubernetes_validate
import nbformat
import pytest
from kube_fixture import kube  # noqa: F401  (fixture)
from kube_harness import K8S_VERSION, Settings, env_of, job_spec, wait_for

from gpupool.backends import kube_manifests as km
from gpupool.backends.base import EXITED, LOST, RUNNING
from gpupool.backends.kubernetes import GPUPoolKubernetes, KubeJobBackend
from gpupool.scheduler.model import PodPlacement


@pytest.fixture
async def backend(kube, tmp_path):
    kube.add_node("n1", 4, uuids=["GPU-aaa", "GPU-bbb", "GPU-ccc", "GPU-ddd"])
    kube.add_node("n2", 2)
    settings = Settings()
    b = KubeJobBackend(settings, kube=GPUPoolKubernetes(api_host=kube.url, namespace="jobs", image="lab/notebook:1",
                                                         pending_timeout=1.0, runtime_class="nvidia"))
    # the service's node table was filled from the API when the backend was made
    assert [(n.name, n.gpus) for n in settings.nodes] == [("n1", 4), ("n2", 2)]
    assert settings.gpu_uuids == {"n1": ["GPU-aaa", "GPU-bbb", "GPU-ccc", "GPU-ddd"]}
    await b.start_watching()
    yield b
    await b.close()


# -- manifests ---------------------------------------------------------------------------------

def _pod(placement: PodPlacement, **kw) -> dict:
    base = dict(job_id="j-000042", run_id="j-000042.3", user="alice@example.org", queue="vision", image="img",
                placement=placement, notebook="/srv/j/input.ipynb", output="/srv/j/output.ipynb", log="/srv/j/log.txt",
                job_dir="/srv/j", checkpoint_dir="/srv/j/checkpoints", stop_file="/srv/j/STOP", attempt=3,
                gpu_uuids=["GPU-a", "GPU-b"], gpu_memory=80 * 2**30, cpu=2, memory=8 * 2**30, home_claim="claim-alice",
                jobs_claim="gpupool-jobs", jobs_mount="/srv", run_as_uid=1000, fs_gid=100, runtime_class="nvidia",
                env={"CUDA_VISIBLE_DEVICES": "1", "GPUPOOL_API_URL": "http://hub/services/gpupool/",
                     "GPUPOOL_API_TOKEN": "t0ken"})
    base.update(kw)
    return km.job_pod_manifest(km.JobPodSpec(**base))


def test_job_pod_manifests_are_valid_kubernetes():
    whole = _pod(PodPlacement(0, "node-a", (0, 1), 1.0))
    frac = _pod(PodPlacement(0, "node-a", (1,), 0.25))
    cpu = _pod(PodPlacement(0, "node-b", (), 1.0), runtime_class=None, gpu_uuids=None)
    unknown_uuid = _pod(PodPlacement(0, "node-a", (1,), 0.5), gpu_uuids=None, gpu_memory=0)
    for manifest in (whole, frac, cpu, unknown_uuid):
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        assert "t0ken" not in json.dumps(manifest)
    created = json.loads(json.dumps(whole))
    created["metadata"]["uid"] = "0b5a3f9e-8d6c-4a1e-9f3b-2c7d1e0a4b6f"
    secret = km.job_secret_manifest(created, {"GPUPOOL_API_TOKEN": "t0ken"})
    kubernetes_validate.validate(secret, K8S_VERSION, strict=True)
    assert secret["metadata"]["name"] == env_of(whole)["GPUPOOL_API_TOKEN"]["secretKeyRef"]["name"]

    c = whole["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(whole)  # the device plugin chooses and isolates
    assert env_of(whole)["GPUPOOL_GPUS"] == "0,1" and env_of(whole)["GPUPOOL_NODE"] == "node-a"
    assert "CUDA_VISIBLE_DEVICES" not in env_of(whole)  # a host index means nothing in the pod
    term = whole["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]
    assert whole["spec"]["runtimeClassName"] == "nvidia"
    assert whole["spec"]["terminationGracePeriodSeconds"] == 35  # 30 s grace + 5 s kill_after
    labels = whole["metadata"]["labels"]
    assert labels["gpupool.io/managed"] == "true" and labels["gpupool.io/job-id"] == "j-000042"
    assert labels["gpupool.io/queue"] == "vision" and labels["gpupool.io/user"].startswith("alice-example.org-")
    assert whole["metadata"]["annotations"]["gpupool.io/user"] == "alice@example.org"
    assert whole["metadata"]["name"] == "gpupool-j-000042-3"
    assert {"name": "home", "mountPath": "/home/jovyan"} in c["volumeMounts"]
    assert {"name": "gpupool-jobs", "mountPath": "/srv"} in c["volumeMounts"]

    fe = env_of(frac)
    assert "nvidia.com/gpu" not in json.dumps(frac["spec"]["containers"][0].get("resources", {}))
    assert fe["NVIDIA_VISIBLE_DEVICES"] == "GPU-b" and fe["GPUPOOL_GPU_FRACTION"] == "0.25"
    assert fe["GPUPOOL_GPU_MEMORY_LIMIT"] == str(20 * 2**30) and fe["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.250"
    assert frac["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert env_of(unknown_uuid)["NVIDIA_VISIBLE_DEVICES"] == "1"  # index when the UUID is unknown
    assert env_of(cpu)["NVIDIA_VISIBLE_DEVICES"] == "void" and "affinity" in cpu["spec"]
    assert "runtimeClassName" not in cpu["spec"] and "tolerations" not in cpu["spec"]


def test_label_values_and_names_are_always_valid():
    for raw in ("alice", "Alice@Example.org", "x" * 100, "-weird-", "ünïcode user", "a.b_c"):
        v = km.label_value(raw)
        assert len(v) <= 63 and km._LABEL_OK.match(v), raw
        n = km.dns_name(raw)
        assert len(n) <= 63 and km._DNS_OK.match(n), raw
    assert km.label_value("a@b") != km.label_value("a#b")  # cleaned values keep distinct names apart
    assert km.placement_from_json(km.placement_to_json([PodPlacement(0, "n", (1, 2), 1.0)])) == (PodPlacement(0, "n", (1, 2), 1.0),)
    assert km.placement_from_json("not json") == ()


# -- the backend against the API ----------------------------------------------------------------

async def test_job_pod_lifecycle(backend, kube, tmp_path):
    spec = job_spec(tmp_path)
    handle = await backend.start(spec)
    pod = kube.pod(handle["pod"], "jobs")
    assert pod["metadata"]["labels"]["gpupool.io/job-id"] == "j-000001"
    assert pod["metadata"]["labels"]["gpupool.io/run-id"] == "j-000001.0"
    assert pod["spec"]["containers"][0]["image"] == "lab/notebook:1"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    env = env_of(pod)
    assert env["GPUPOOL_CHECKPOINT_DIR"] == spec.checkpoint_dir and env["GPUPOOL_STOP_FILE"] == spec.stop_file
    assert env["GPUPOOL_API_URL"] == "http://127.0.0.1:10101/services/gpupool/"
    # the job's API token is in a Secret owned by the pod, never in the pod spec
    assert "gpj-secret-token" not in json.dumps(pod)
    ref = env["GPUPOOL_API_TOKEN"]["secretKeyRef"]
    assert kube.api.secret_value("jobs", ref["name"], "GPUPOOL_API_TOKEN") == "gpj-secret-token"
    secret = kube.call(lambda: _async(kube.api._objects[(kube_fixture_secrets(), "jobs", ref["name"])].raw))
    assert secret["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    kubernetes_validate.validate(secret, K8S_VERSION, strict=True)
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["home"]["persistentVolumeClaim"]["claimName"] == "claim-alice"
    assert vols["gpupool-jobs"]["persistentVolumeClaim"]["claimName"] == "gpupool-jobs"
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["gpupool-jobs"] == str(tmp_path)  # the job paths are the same in the pod
    kubernetes_validate.validate(pod, K8S_VERSION, strict=False)

    async def running():
        st = await backend.poll(handle)
        return st.state == RUNNING and st.detail == "" and st
    await wait_for(running)
    assert kube.pod(handle["pod"], "jobs")["spec"]["nodeName"] == "n1"

    kube.finish_pod(handle["pod"], 0, "jobs", log="Executing: 100%\n")
    assert "Executing" in await backend.pod_log(handle)

    async def exited():
        st = await backend.poll(handle)
        return st.state == EXITED and st
    st = await wait_for(exited)
    assert st.exit_code == 0 and st.detail == "the notebook ran to the end"
    await wait_for(lambda: _async(kube.pod(handle["pod"], "jobs") is None))  # finished pods are cleaned up
    assert kube.api.secret_value("jobs", ref["name"], "GPUPOOL_API_TOKEN") is None  # and their Secret with them
    assert (await backend.poll(handle)).exit_code == 0  # still known after the pod is gone


async def _async(v):
    return v


async def test_container_failure_before_the_log_reaches_the_job_log(backend, kube, tmp_path):
    spec = job_spec(tmp_path)
    handle = await backend.start(spec)
    await wait_for(lambda: _poll_is(backend, handle, RUNNING))
    kube.finish_pod(handle["pod"], 1, "jobs", log="/usr/bin/python3: No module named gpupool\n")
    st = await wait_for(lambda: _poll_is(backend, handle, EXITED))
    assert st.exit_code == 1 and st.detail.endswith("No module named gpupool")
    with open(spec.log) as f:
        assert "No module named gpupool" in f.read()


async def test_a_pod_the_watch_has_not_shown_yet_is_not_lost(backend, kube, tmp_path):
    """Right after start (or after a relist) the watch may not have shown the pod: poll reads it
    from the API instead of declaring the run lost (which would requeue a running job)."""
    await backend._jobs.stop()  # the watch sees nothing from now on
    handle = await backend.start(job_spec(tmp_path))
    backend._jobs.items.clear()
    assert (await backend.poll(handle)).state == RUNNING
    kube.delete_pod(handle["pod"], "jobs")  # gone behind our back: the API says 404
    st = await backend.poll(handle)
    assert st.state == LOST and "gone" in st.detail


async def test_fraction_pod_pinned_to_gpu_uuid(backend, kube, tmp_path):
    spec = job_spec(tmp_path, placements=[{"pod": 0, "node": "n1", "gpus": [2], "fraction": 0.5}])
    handle = await backend.start(spec)
    pod = kube.pod(handle["pod"], "jobs")
    env = env_of(pod)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "GPU-ccc" and env["GPUPOOL_GPU_FRACTION"] == "0.5"
    assert env["GPUPOOL_GPU_MEMORY_LIMIT"] == str(40960 * 2**20)  # half of the node's 80 GiB GPU
    assert "nvidia.com/gpu" not in json.dumps(pod["spec"]["containers"][0].get("resources", {}))
    assert pod["spec"]["runtimeClassName"] == "nvidia"
    assert pod["metadata"]["annotations"]["gpupool.io/gpu-ids"] == "GPU-ccc"


async def test_preemption_checkpoint_requeue_and_resume(backend, kube, tmp_path):
    spec = job_spec(tmp_path)
    handle = await backend.start(spec)
    await wait_for(lambda: _poll_is(backend, handle, RUNNING))
    kube.behave("j-000001", exit_on_term_after=0.3, exit_code=0)  # it saves and exits on the stop request
    await backend.request_checkpoint(handle, spec, reason="preempted: reclaimed by queue nlp")
    with open(spec.stop_file) as f:
        assert json.load(f)["reason"] == "preempted: reclaimed by queue nlp"
    assert kube.deletions[-1]["name"] == handle["pod"] and kube.deletions[-1]["grace"] == 4  # 3 s grace + 1 s kill_after
    assert kube.pod(handle["pod"], "jobs")["metadata"].get("deletionTimestamp")
    assert (await backend.poll(handle)).state == RUNNING  # still saving within its grace
    st = await wait_for(lambda: _poll_is(backend, handle, EXITED))
    assert st.exit_code == 0

    # requeued: the next attempt is a new pod that mounts the same checkpoint directory
    spec2 = job_spec(tmp_path, attempt=1, placements=[{"pod": 0, "node": "n2", "gpus": [0], "fraction": 1.0}])
    h2 = await backend.start(spec2)
    assert not os.path.exists(spec2.stop_file)  # a stale stop request does not stop the new attempt
    pod2 = kube.pod(h2["pod"], "jobs")
    assert h2["pod"] != handle["pod"] and pod2["metadata"]["labels"]["gpupool.io/run-id"] == "j-000001.1"
    assert env_of(pod2)["GPUPOOL_CHECKPOINT_DIR"] == spec.checkpoint_dir
    await wait_for(lambda: _poll_is(backend, h2, RUNNING))
    assert kube.pod(h2["pod"], "jobs")["spec"]["nodeName"] == "n2"


async def _poll_is(backend, handle, state):
    """The run's state once it is ``state`` (RUNNING: its container runs, not just created)."""
    st = await backend.poll(handle)
    if state == RUNNING and st.detail:
        return None
    return st if st.state == state else None


async def test_terminate_shortens_grace_then_kills(backend, kube, tmp_path):
    spec = job_spec(tmp_path)
    handle = await backend.start(spec)
    await wait_for(lambda: _poll_is(backend, handle, RUNNING))
    await backend.request_checkpoint(handle, spec)  # the job ignores it (no behaviour set)
    await backend.terminate(handle)  # grace over: kill_after seconds left
    assert kube.deletions[-1]["grace"] == 1
    await backend.terminate(handle, force=True)
    assert kube.deletions[-1]["grace"] == 0
    st = await wait_for(lambda: _poll_is(backend, handle, EXITED))
    assert st.detail  # a sentence, whatever the code


async def test_restart_adopts_running_pods(kube, tmp_path):
    kube.add_node("n1", 4)
    cfg = dict(api_host=kube.url, namespace="jobs", image="img")
    first = KubeJobBackend(Settings(), kube=GPUPoolKubernetes(**cfg))
    spec = job_spec(tmp_path)
    gone = job_spec(tmp_path, job_id="j-000002")
    finished = job_spec(tmp_path, job_id="j-000003")
    handle = await first.start(spec)
    await first.start(gone)
    h3 = await first.start(finished)
    await wait_for(lambda: _poll_is(first, handle, RUNNING))
    await first.close()  # the service stops; its pods keep running

    kube.delete_pod("gpupool-j-000002-0", "jobs")  # lost while the service was down
    kube.delete_pod(h3["pod"], "jobs")
    os.makedirs(os.path.dirname(h3["exit_file"]), exist_ok=True)
    with open(h3["exit_file"], "w") as f:  # ...but it wrote its exit status on the shared volume
        json.dump({"exit_code": 3}, f)

    second = KubeJobBackend(Settings(), kube=GPUPoolKubernetes(**cfg))
    try:
        new, st = await second.adopt(spec, None)  # no handle: found by its labels
        assert st.state == RUNNING and new["pod"] == handle["pod"] and new["uid"] == handle["uid"]
        _, st = await second.adopt(gone, None)
        assert st.state == LOST and "gone" in st.detail
        _, st = await second.adopt(finished, h3)
        assert st.state == EXITED and st.exit_code == 3
        runs = await second.list_runs()
        assert {r["run_id"] for r in runs} == {"j-000001.0"}
        kube.finish_pod(handle["pod"], 1, "jobs")
        st = await wait_for(lambda: _poll_is(second, new, EXITED))
        assert st.exit_code == 1 and "status 1" in st.detail
    finally:
        await second.close()


async def test_unschedulable_pod_is_requeued_and_bad_image_fails(backend, kube, tmp_path):
    kube.add_pod("hog", node="n2", gpus=2, phase="Running")  # the GPUs went to someone else meanwhile
    spec = job_spec(tmp_path, placements=[{"pod": 0, "node": "n2", "gpus": [0], "fraction": 1.0}])
    handle = await backend.start(spec)

    async def waiting():
        st = await backend.poll(handle)
        return st.state == RUNNING and "Insufficient nvidia.com/gpu" in st.detail and st
    await wait_for(waiting)
    st = await wait_for(lambda: _poll_is(backend, handle, LOST))  # after pending_timeout: requeue
    assert "could not place" in st.detail
    assert kube.pod(handle["pod"], "jobs") is None  # and it cannot start later behind the new attempt

    kube.behave("j-000009", waiting_reason="ImagePullBackOff", waiting_message="lab/missing:1 not found")
    spec2 = job_spec(tmp_path, job_id="j-000009", placements=[{"pod": 0, "node": "n1", "gpus": [0], "fraction": 1.0}])
    h2 = await backend.start(spec2)
    st = await wait_for(lambda: _poll_is(backend, h2, EXITED))
    assert "ImagePullBackOff" in st.detail and st.exit_code is None


def kube_fixture_pods():
    import kube_fixture

    return kube_fixture.PODS


def kube_fixture_secrets():
    import kube_fixture

    return kube_fixture.SECRETS


async def test_image_of_the_users_notebook_server(backend, kube, tmp_path):
    kube.add_pod("jupyter-alice", namespace="jobs", labels={"component": "singleuser-server", "hub.jupyter.org/username": "alice"},
                 annotations={"hub.jupyter.org/username": "alice"})
    kube.call(lambda: kube.api.patch_object(kube_fixture_pods(), "jobs", "jupyter-alice", {
        "spec": {"containers": [{"name": "notebook", "image": "lab/pytorch:2.4"}]}}))
    handle = await backend.start(job_spec(tmp_path))
    assert kube.pod(handle["pod"], "jobs")["spec"]["containers"][0]["image"] == "lab/pytorch:2.4"
    h2 = await backend.start(job_spec(tmp_path, job_id="j-000005", user="bob"))
    assert kube.pod(h2["pod"], "jobs")["spec"]["containers"][0]["image"] == "lab/notebook:1"


# -- the job pod's entrypoint, for real ----------------------------------------------------------

def test_entrypoint_sends_sigterm_to_the_notebook_when_the_grace_is_over(tmp_path):
    """A notebook that ignores the stop request gets SIGTERM (papermill and its kernel) once the
    grace period is over; the run ends with a failure code and says why."""
    jdir = tmp_path / "j-000008"
    jdir.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import time\nprint('ready', flush=True)\nfor _ in range(600):\n    time.sleep(0.1)")],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}),
        str(jdir / "input.ipynb"))
    spec = km.JobPodSpec(job_id="j-000008", run_id="j-000008.0", user="u", queue="q", image="-",
                         placement=PodPlacement(0, "n", ()), notebook=str(jdir / "input.ipynb"),
                         output=str(jdir / "output.ipynb"), log=str(jdir / "log.txt"), job_dir=str(jdir),
                         checkpoint_dir=str(jdir / "checkpoints"), stop_file=str(jdir / "STOP"),
                         home_mount=str(tmp_path), grace_seconds=1, python=sys.executable)
    c = km.job_pod_manifest(spec)["spec"]["containers"][0]
    env = {**os.environ, **{k: v for k, v in env_of({"spec": {"containers": [c]}}).items() if isinstance(v, str)}}
    env.pop("NVIDIA_VISIBLE_DEVICES", None)
    proc = subprocess.Popen([*c["command"], *c["args"]], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 90
        while not ((jdir / "log.txt").exists() and "ready" in (jdir / "log.txt").read_text(errors="replace")):
            assert time.time() < deadline and proc.poll() is None, "the notebook did not start"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.decode(errors="replace")
    assert "grace period over: SIGTERM to the notebook" in text, text
    assert proc.returncode != 0 and (jdir / "STOP").exists()
    assert json.loads((jdir / "runs" / "0" / "exit.json").read_text())["exit_code"] != 0


def test_entrypoint_turns_sigterm_into_a_checkpoint(tmp_path):
    """What runs in the pod: run-job -> the local runner -> papermill -> a real kernel. SIGTERM to
    the entrypoint (the kubelet deleting the pod) writes the stop request; the notebook saves and
    finishes; the log reaches stdout (kubectl logs) and the job's log file."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("steps = 1000", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            "import time\nfrom gpupool import checkpoint\nstate = checkpoint.load() or {'step': 0}\n"
            "print('ready', flush=True)\n"
            "for step in range(state['step'], steps):\n"
            "    time.sleep(0.05)\n"
            "    if checkpoint.should_stop():\n"
            "        checkpoint.save({'step': step}, step=step)\n"
            "        print('saved at', step, flush=True)\n"
            "        break\n"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    jdir = tmp_path / "j-000007"
    jdir.mkdir()
    nbformat.write(nb, str(jdir / "input.ipynb"))
    spec = km.JobPodSpec(job_id="j-000007", run_id="j-000007.0", user="u", queue="q", image="-",
                         placement=PodPlacement(0, "n", ()), notebook=str(jdir / "input.ipynb"),
                         output=str(jdir / "output.ipynb"), log=str(jdir / "log.txt"), job_dir=str(jdir),
                         checkpoint_dir=str(jdir / "checkpoints"), stop_file=str(jdir / "STOP"),
                         home_mount=str(tmp_path), grace_seconds=20, python=sys.executable)
    manifest = km.job_pod_manifest(spec)
    c = manifest["spec"]["containers"][0]
    env = dict(os.environ)
    env.update(env_of(manifest))
    env.pop("NVIDIA_VISIBLE_DEVICES", None)
    cmd = [sys.executable if c["command"][0] == sys.executable else c["command"][0], *c["command"][1:], *c["args"]]
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 90
        while "ready" not in (jdir / "log.txt").read_text(errors="replace") if (jdir / "log.txt").exists() else True:
            assert time.time() < deadline and proc.poll() is None, "the notebook did not start"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # the kubelet deletes the pod
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    assert json.loads((jdir / "STOP").read_text())["reason"].startswith("the job's pod is being stopped")
    assert "saved at" in text and "saved at" in (jdir / "log.txt").read_text()
    assert "grace period over" not in text  # it stopped within its grace: no signal needed
    assert json.loads((jdir / "runs" / "0" / "exit.json").read_text())["exit_code"] == 0
    assert any(p.name.startswith("ckpt") or p.suffix for p in (jdir / "checkpoints").iterdir())
    assert (jdir / "output.ipynb").exists()


def test_unreachable_api_is_a_clear_startup_error():
    with pytest.raises(RuntimeError, match=r"cannot read the nodes from the Kubernetes API \(http://127.0.0.1:9\)"):
        KubeJobBackend(Settings(), kube=GPUPoolKubernetes(api_host="http://127.0.0.1:9", request_timeout=2))


# -- the real gpupool service with the Kubernetes backend -----------------------------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kube_hub(tmp_path_factory):
    """A real JupyterHub + gpupool service whose jobs run as pods on the test API; the kubelet
    runs each job pod's command (the real entrypoint, papermill, a kernel) as a local process."""
    import shutil

    from hub_harness import Hub
    from kube_fixture import KubeCluster, service_config

    tmp = tmp_path_factory.mktemp("kubejobs")
    with KubeCluster(run_jobs=True) as cluster:
        cluster.add_node("box", 2, product="NVIDIA-L4", memory_mib=16384, labels={"topology.gpupool.io/rack": "r1"})
        extra = service_config(cluster, tmp, "bob")
        queues = [{"name": "vision", "deserved": {"gpu": 1}, "users": ["alice"]},
                  {"name": "nlp", "deserved": {"gpu": 1}, "users": ["bob"]}]
        hub = Hub(tmp, gpupool={"queues": queues, "nodes": [], "preemption_grace": 10,
                                "backend": "gpupool.backends.kubernetes.KubeJobBackend"}, extra_config=extra)
        with hub:
            shutil.copy(ROOT / "examples" / "train_checkpoint.ipynb", hub.home("bob") / "train_checkpoint.ipynb")
            yield hub, cluster


@pytest.mark.hub
@pytest.mark.slow
def test_service_runs_jobs_as_pods_reclaims_and_resumes(kube_hub):
    import re

    from hub_harness import notebook

    hub, cluster = kube_hub
    admin = hub.admin_token
    nodes = hub.api("GET", "nodes", admin).json()["nodes"]  # the inventory came from the Kubernetes API
    assert [(n["name"], n["gpu_model"], n["gpu_memory"], len(n["gpus"])) for n in nodes] == [
        ("box", "NVIDIA-L4", 16384 * 2**20, 2)]

    alice, bob = hub.token("alice"), hub.token("bob")
    jobs = []
    for i in range(2):
        r = hub.api("POST", "jobs", bob, json={
            "notebook": "train_checkpoint.ipynb", "gpus": 1, "name": f"bob-{i}",
            "parameters": {"steps": 30, "step_seconds": 0.25, "steps_file": f"steps-{i}.txt"},
            **({"cpu": 2, "memory": "3Gi"} if i == 0 else {})})
        assert r.status_code == 201, r.text
        jobs.append(r.json()["id"])
    for j in jobs:
        hub.wait_job(bob, j, {"running"}, 60)
    pods = cluster.pods("jobs", "gpupool.io/managed=true")
    assert sorted(p["metadata"]["labels"]["gpupool.io/job-id"] for p in pods) == sorted(jobs)
    for p in pods:
        assert p["metadata"]["labels"]["gpupool.io/user"] == "bob"
        assert p["metadata"]["labels"]["gpupool.io/queue"] == "nlp"  # the service hands the queue to the backend
        assert p["metadata"]["labels"]["gpupool.io/kind"] == "train"
        res = p["spec"]["containers"][0]["resources"]
        if p["metadata"]["labels"]["gpupool.io/job-id"] == jobs[0]:  # the job's own CPU/memory request
            assert res["requests"]["cpu"] == "2000m" and res["requests"]["memory"] == str(3 * 2**30), res
            assert res["limits"]["memory"] == str(3 * 2**30), res
        else:  # none asked: the backend's defaults (none set here)
            assert "cpu" not in res.get("requests", {}) and "memory" not in res.get("requests", {}), res
        assert p["spec"]["nodeName"] == "box"
        assert p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        kubernetes_validate.validate(p, K8S_VERSION)
    home = hub.home("bob")
    hub.wait_for(lambda: all((home / f"steps-{i}.txt").exists() and len((home / f"steps-{i}.txt").read_text().splitlines()) >= 3
                             for i in range(2)), 90)

    r = hub.api("POST", "jobs", alice, json={"notebook_content": notebook("import time; time.sleep(1)"), "gpus": 1})
    mine = r.json()["id"]

    victim = hub.wait_preempted(bob, jobs)
    assert hub.wait_job(alice, mine, {"succeeded", "failed"}, 120)["status"] == "succeeded"
    finals = [hub.wait_job(bob, j, {"succeeded", "failed"}, 150) for j in jobs]
    assert [f["status"] for f in finals] == ["succeeded", "succeeded"], [
        (f["id"], f["status"], f["reason"], f["attempts"], hub.api("GET", f"jobs/{f['id']}/log", bob).text[-3000:])
        for f in finals]
    v = next(f for f in finals if f["id"] == victim["id"])
    assert v["preemptions"] == 1 and v["attempts"] == 2, v
    # preemption deleted the victim's pod with the grace period (10 s grace + 2 s kill_after)
    victim_deletions = [d for d in cluster.deletions if d["labels"].get("gpupool.io/job-id") == v["id"]]
    assert victim_deletions and victim_deletions[0]["grace"] == 12, victim_deletions
    log = hub.api("GET", f"jobs/{v['id']}/log", bob).text
    assert "asked to stop (preempted" in log
    record = [tuple(map(int, re.search(r"attempt=(\d+) step=(\d+)", line).groups()))
              for line in (home / f"steps-{jobs.index(v['id'])}.txt").read_text().splitlines()]
    assert [s for _, s in record] == list(range(30)), record  # every step once: resumed from the checkpoint
    assert len({a for a, _ in record}) == 2
    hub.wait_for(lambda: not cluster.pods("jobs", "gpupool.io/managed=true"), 30, message="finished pods were not removed")


@pytest.mark.hub
def test_service_runs_a_distributed_job_as_worker_pods(kube_hub):
    """pods: 2 through the real service on the Kubernetes backend: one pod per worker with the
    rendezvous environment, the headless Service, every worker's log, success of the whole."""
    hub, cluster = kube_hub
    bob = hub.token("bob")
    r = hub.api("POST", "jobs", bob, json={"pods": 2, "gpus": 1, "command": [
        "python", "-c", "import os; print('worker', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'master', "
                        "os.environ['MASTER_ADDR'], os.environ['MASTER_PORT'], 'node', os.environ['NODE_RANK'])"]})
    assert r.status_code == 201, r.text
    job = hub.wait_job(bob, r.json()["id"], {"succeeded", "failed"}, 90)
    assert job["status"] == "succeeded", job
    pod0 = f"gpupool-{job['id']}-1-"
    logs = [hub.api("GET", f"jobs/{job['id']}/log" + (f"?rank={k}" if k else ""), bob).text for k in (0, 1)]
    for k, log in enumerate(logs):
        m = re.search(r"worker (\d) of 2 master (\S+) 29500 node 0", log)
        assert m and m.group(1) == str(k), log
        assert m.group(2).startswith(pod0) and m.group(2).endswith(".jobs.svc"), m.group(2)  # rank 0's pod in its Service
    posted = [q for q in cluster.requests if q.method == "POST" and q.resource is not None
              and q.resource.plural == "services"]
    assert len(posted) == 1 and posted[0].data["spec"]["clusterIP"] == "None"
    gone = [d for d in cluster.deletions if d["labels"].get("gpupool.io/job-id") == job["id"]]
    assert sorted(d["labels"]["gpupool.io/rank"] for d in gone) == ["0", "1"]  # finished worker pods removed


@pytest.mark.hub
@pytest.mark.slow
def test_node_changes_apply_while_the_service_runs(kube_hub):
    """The loop takes the node list from the backend's watched inventory every cycle and runs a
    cycle when it changes: a node added, cordoned, uncordoned, its GPU count changed or removed
    takes effect without a service restart."""
    from kube_fixture import NODES

    from hub_harness import notebook

    hub, cluster = kube_hub
    admin, alice = hub.admin_token, hub.token("alice")

    def nodes():
        return {n["name"]: n for n in hub.api("GET", "nodes", admin).json()["nodes"]}

    def submit(seconds):
        r = hub.api("POST", "jobs", alice, json={"notebook_content": notebook(f"import time; time.sleep({seconds})"),
                                                 "gpus": 1})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def remove_box2():
        async def go():
            async with cluster.api._lock:
                await cluster.api.remove_object(NODES, None, "box2")
        cluster.call(go)

    try:
        cluster.add_node("box2", 1, product="NVIDIA-L4", memory_mib=16384)
        hub.wait_for(lambda: "box2" in nodes(), 10, 0.1, message="the added node did not appear in /nodes")
        cluster.patch_node("box", {"spec": {"unschedulable": True}})  # cordoned
        hub.wait_for(lambda: not nodes()["box"]["schedulable"], 10, 0.1, message="the cordon was not seen")
        assert nodes()["box"]["unschedulable_reason"] == "cordoned" and "unschedulable_reason" not in nodes()["box2"]

        first = submit(3)  # box is cordoned: the job goes to box2
        view = hub.wait_job(alice, first, {"running", "succeeded", "failed"}, 60)
        assert [a["node"] for a in view["allocation"]] == ["box2"], view
        assert hub.wait_job(alice, first, {"succeeded", "failed"}, 90)["status"] == "succeeded"

        cluster.patch_node("box2", {"spec": {"unschedulable": True}})  # nothing schedulable is left
        hub.wait_for(lambda: not nodes()["box2"]["schedulable"], 10, 0.1, message="the cordon was not seen")
        second = submit(1)
        cycles = hub.api("GET", "health").json()["cycles"]
        hub.wait_for(lambda: hub.api("GET", "health").json()["cycles"] >= cycles + 3, 30, 0.1)
        waiting = hub.api("GET", f"jobs/{second}", alice).json()
        assert waiting["status"] == "queued" and waiting["allocation"] == [], waiting
        assert waiting["reason"] and "running" not in waiting["reason"], waiting
        assert not cluster.pods("jobs", f"gpupool.io/job-id={second}")

        cluster.patch_node("box", {"spec": {"unschedulable": False}})  # uncordoned: used again
        view = hub.wait_job(alice, second, {"running", "succeeded", "failed"}, 60)
        assert [a["node"] for a in view["allocation"]] in (["box"], []), view
        assert hub.wait_job(alice, second, {"succeeded", "failed"}, 90)["status"] == "succeeded"

        # a GPU count change (e.g. the device plugin reports more GPUs) and a removed node
        cluster.patch_node("box2", {"status": {"allocatable": {"nvidia.com/gpu": "3"}, "capacity": {"nvidia.com/gpu": "3"}}})
        hub.wait_for(lambda: len(nodes()["box2"]["gpus"]) == 3, 10, 0.1, message="the new GPU count was not seen")

        # a run on GPUs 0-2 of box2, then another tool's pod takes one of box2's GPUs (the node
        # shows 2 free): the run keeps counting as holding 3, so nothing else goes to box2
        cluster.patch_node("box", {"spec": {"unschedulable": True}})
        cluster.patch_node("box2", {"spec": {"unschedulable": False}})
        hub.wait_for(lambda: nodes()["box2"]["schedulable"] and not nodes()["box"]["schedulable"], 10, 0.1)
        r = hub.api("POST", "jobs", alice, json={"notebook_content": notebook("import time; time.sleep(15)"), "gpus": 3})
        assert r.status_code == 201, r.text
        big = r.json()["id"]
        view = hub.wait_job(alice, big, {"running"}, 60)
        assert view["allocation"] == [{"node": "box2", "gpus": [0, 1, 2], "fraction": 1.0}], view
        cluster.add_pod("other-tool", namespace="default", node="box2", gpus=1, phase="Running")
        hub.wait_for(lambda: len(nodes()["box2"]["gpus"]) == 2, 10, 0.1, message="the foreign pod was not counted")
        small = submit(1)
        cycles = hub.api("GET", "health").json()["cycles"]
        hub.wait_for(lambda: hub.api("GET", "health").json()["cycles"] >= cycles + 3, 30, 0.1)
        waiting = hub.api("GET", f"jobs/{small}", alice).json()
        assert waiting["status"] == "queued" and hub.api("GET", f"jobs/{big}", alice).json()["status"] == "running", waiting
        hub.api("DELETE", f"jobs/{big}", alice)
        hub.api("DELETE", f"jobs/{small}", alice)
        cluster.delete_pod("other-tool", "default")
        hub.wait_job(alice, big, {"cancelled"}, 30)
        hub.wait_for(lambda: hub.api("GET", f"jobs/{big}", alice).json()["allocation"] == [], 60, 0.2,
                     message="the cancelled run did not end")
        remove_box2()
        hub.wait_for(lambda: "box2" not in nodes(), 10, 0.1, message="the removed node is still listed")
    finally:
        cluster.patch_node("box", {"spec": {"unschedulable": False}})
        if cluster.call(_node_exists(cluster, "box2")):
            remove_box2()


def _node_exists(cluster, name):
    from kube_fixture import NODES

    def go():
        async def inner():
            key = (NODES, None, name)
            return key in cluster.api._objects and not cluster.api._objects[key].deleted
        return inner()
    return go
