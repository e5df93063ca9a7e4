"""Idle-held GPUs: memory allocated while compute stays at 0 % for a whole window (an open
notebook keeping a tensor on the GPU) is its own state, apart from busy and idle, in the
utilisation history, the idle rules (their reason, the dashboard's list) and per reading."""
from __future__ import annotations

from gpupool.contract import GPU_BUSY, GPU_HELD, GPU_IDLE, HELD_MEMORY, gpu_state
from hubless_service import QUEUES, service_parts

GiB = 2**30


def test_the_state_of_a_reading():
    assert gpu_state(None, 8 * GiB) is None  # no utilisation reading: unknown
    assert gpu_state(3.0, 0) == GPU_BUSY and gpu_state(3.0, 8 * GiB) == GPU_BUSY
    assert gpu_state(0.0, 300 * 2**20) == GPU_IDLE  # a CUDA context alone is not holding the GPU
    assert gpu_state(0.0, HELD_MEMORY) == GPU_HELD and gpu_state(0.0, 8 * GiB) == GPU_HELD


async def test_an_idle_held_gpu_is_told_apart_by_the_rules_and_the_history(tmp_path):
    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.domain import usage
    from gpupool.hub_ext.runtime.idle import IdleChecker
    from gpupool.hub_ext.runtime.sampling import Sampler

    t0 = 1_800_000_000.0
    now = [t0]
    settings, sessions, loop = service_parts(tmp_path, [{"name": "box", "gpus": 2}], QUEUES,
                                             {"q": {"train": {"after": 60}}})
    with sessions() as s:
        for gpu in (0, 1):
            s.add(D.Workload(type=D.JOB, kind="train", user="bob", queue="q", gpus=1.0, submitted_at=t0, started_at=t0,
                             parameters={}, status="running", attempt=1, reason=f"running on box GPU {gpu}",
                             handle={"pid": 0}, allocation=[{"pod": 0, "node": "box", "gpus": [gpu], "fraction": 1.0}]))
        s.commit()
    # GPU 0: 0 % with 8Gi held (a notebook's tensor); GPU 1: 0 % with only a context
    mem = {0: 8 * GiB, 1: 300 * 2**20}
    sampler = Sampler(sessions, lambda: {"box": {g: {"utilization": 0.0, "memory_used": mem[g]} for g in (0, 1)}},
                      10, 86400, 300, 86400, clock=lambda: now[0])
    checker = IdleChecker(loop, sessions, settings.idle_rules, 30, clock=lambda: now[0])
    for _ in range(7):
        now[0] += 10
        sampler.sample()
    await checker.tick()
    assert {k: v["state"] for k, v in checker.idle.items()} == {"j-000001": GPU_HELD, "j-000002": GPU_IDLE}
    with sessions() as s:
        held, idle = s.get(D.Workload, 1).reason, s.get(D.Workload, 2).reason
        points = {g["gpu"]: {p["state"] for p in g["points"]} for g in usage.history(s, t0, now[0] + 1)}
    assert "stayed idle (0 % utilisation) while holding GPU memory (idle-held) for 1 min" in held, held
    assert "stayed idle (0 % utilisation) for 1 min" in idle and "idle-held" not in idle, idle
    assert points == {0: {GPU_HELD}, 1: {GPU_IDLE}}
    mem[0] = 200 * 2**20  # the tensor freed for one reading: the window was not held all along
    now[0] += 10
    sampler.sample()
    await checker.tick()
    assert checker.idle["j-000001"]["state"] == GPU_IDLE
    await loop.backend.close()


def test_the_dashboard_names_idle_held_gpus():
    """The dashboard's template rendered with an idle list as dashboard_data gives it."""
    import re

    from gpupool.hub_ext.web.dashboard import _env

    idle = [{"id": "j-000001", "user": "bob", "queue": "q", "gpus": 1.0, "since": "2027-01-15T08:00:00Z",
             "action": "flag", "rule": "queue q's rule", "state": "held"},
            {"id": "j-000002", "user": "bob", "queue": "q", "gpus": 1.0, "since": "2027-01-15T08:00:00Z",
             "action": "flag", "rule": "queue q's rule", "state": "idle"}]
    data = {"user": "admin", "admin": True, "now": "2027-01-15T09:00:00Z", "gpus_total": 2, "queues": [],
            "timeline": [], "pending": [], "running": [], "idle": idle, "since_week": "2027-01-08T09:00:00Z",
            "pools": [{"name": "default"}], "fairness": False, "policies": [], "idle_note": ""}
    total = {"allocated_gpu_hours": 0.0, "used_gpu_hours": None, "utilization": None, "workloads": 0}
    data["week"] = {by: {"rows": [], "total": dict(total, **{by: "total"})} for by in ("user", "queue")}
    try:
        html = _env.get_template("dashboard.html").render(data=data, data_json="{}", prefix="/", static="/static/")
    except Exception as e:  # the page needs more of dashboard_data than this test gives: say which
        raise AssertionError(f"the dashboard did not render: {e!r}") from None
    section = html[html.index('<section id="idle">'):]
    section = section[:section.index("</section>")]
    assert "Idle GPUs and their holders (2, 1 idle-held)" in section
    rows = re.findall(r"<tr><td>(j-\d+)</td>.*?<td>(idle[^<]*)</td>", section, re.S)
    assert rows == [("j-000001", "idle-held (memory allocated, 0 % compute)"), ("j-000002", "idle")]
