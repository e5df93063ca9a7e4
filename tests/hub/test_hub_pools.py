"""Node pools and fairness over time in the hub service (docs/admin.md): the settings and their
checks, a request's ``pools`` (its own, or the preference of its kind), the column that stores
them (an existing database gains it, nothing lost), the cycle worker handing them to the core,
the ledger's pool and ``report --by pool``, and the service's usage history (fairness over time).

These tests drive the real loop and submissions in process (no hub); tests/hub/test_hub_pools_real.py
runs a real hub."""
from __future__ import annotations

import types
from typing import Any

import pytest
from sqlalchemy import Column, MetaData, Table, create_engine, inspect, text

from gpupool.hub_ext import store as D
from gpupool.hub_ext.config import check, load
from gpupool.hub_ext.domain.access import QueueAccess
from gpupool.hub_ext.domain.errors import APIError
from gpupool.hub_ext.domain.identity import Identity
from gpupool.hub_ext.domain.submission import Submissions
from gpupool.hub_ext.web.dashboard import _env
from gpupool.scheduler.model import CycleResult
from gpupool.hub_ext.web import schemas as S

NODES = [{"name": "small", "count": 2, "gpus": 2, "gpu_model": "T4", "gpu_memory": "16Gi", "pool": "build"},
         {"name": "big", "gpus": 4, "gpu_model": "H100", "gpu_memory": "80Gi", "pool": "train"}]
QUEUES = [{"name": "vision", "users": ["alice"],
           "pools": {"build": {"deserved": {"gpu": 2}}, "train": {"deserved": {"gpu": 2}, "limit": {"gpu": 4}}}},
          {"name": "nlp", "users": ["bob"],
           "pools": {"build": {"deserved": {"gpu": 2}}, "train": {"deserved": {"gpu": 2}}}}]
PREFERENCE = {"interactive": ["build", "train"], "train": ["train", "build"]}


def settings(tmp_path, **extra):
    return load({"nodes": NODES, "queues": QUEUES, "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}",
                 "job_root": str(tmp_path / "jobs"), "work_dir": str(tmp_path), "run_as_user": False, **extra})


# ---------------------------------------------------------------------------------- settings
def test_nodes_and_queues_take_pools_with_the_same_parser_and_messages(tmp_path):
    st = settings(tmp_path)
    assert {n.name: n.pool for n in st.nodes} == {"small-0": "build", "small-1": "build", "big": "train"}
    assert st.queues[0].pools["train"].limit == {"gpu": 4.0}
    errors, _ = check({"nodes": NODES, "queues": [{"name": "q", "pools": {"train": {"deserved": {"gpu": 2},
                                                                                   "limit": {"gpu": 1}}}}]})
    assert errors == ["c.GPUPool.queues[0].pools.train.limit.gpu: limit 1 is below deserved 2"]
    errors, _ = check({"nodes": [{"name": "n", "gpus": 1, "pool": ""}]})
    assert errors == ["c.GPUPool.nodes[0].pool: must be a non-empty pool name"]
    errors, _ = check({"nodes": NODES, "queues": [{"name": "q", "pools": {"train": {"weight": 2}}}]})
    assert errors and errors[0].startswith("c.GPUPool.queues[0].pools.train.weight: unknown field")


def test_check_warns_of_over_committed_quotas_per_pool_and_of_pools_without_nodes():
    queues = [{"name": "a", "pools": {"build": {"deserved": {"gpu": 3}}, "train": {"deserved": {"gpu": 4}}}},
              {"name": "b", "pools": {"build": {"deserved": {"gpu": 3}}, "trian": {"deserved": {"gpu": 1}}}}]
    errors, warnings = check({"nodes": NODES, "queues": queues})
    assert errors == []
    assert any(w.startswith("c.GPUPool.queues: in node pool build: the top-level queues deserve 6 GPUs but there "
                            "are 4 (over-committed") for w in warnings), warnings
    assert not any("node pool train:" in w for w in warnings)  # 4 of 4: exactly committed
    assert any("node pool 'trian' has no node" in w and "quotas of b" in w for w in warnings), warnings
    # one pool named default: the warnings read as before pools existed
    _, warnings = check({"nodes": [{"name": "n", "gpus": 2}], "queues": [{"name": "a", "deserved": {"gpu": 3}}]})
    assert warnings[0].startswith("c.GPUPool.queues: the top-level queues deserve 3 GPUs but there are 2")


@pytest.mark.parametrize("fairness, words", [
    ({"window": 0}, "c.GPUPool.fairness.window: must be > 0"),
    ({"window": "an hour"}, "c.GPUPool.fairness.window: 'an hour' is not a duration"),
    ({"window_type": "rolling"}, "c.GPUPool.fairness.window_type: must be one of sliding, tumbling"),
    ({"half_life": -5}, "c.GPUPool.fairness.half_life: must be > 0"),
    ({"k": -1}, "c.GPUPool.fairness.k: must be >= 0"),
    ({"k": "strong"}, "c.GPUPool.fairness.k: must be a number >= 0"),
    ({"halflife": 60}, "c.GPUPool.fairness.halflife: unknown field (allowed: window, window_type, half_life, k)"),
])
def test_fairness_settings_are_checked_with_the_field_named(fairness, words):
    errors, _ = check({"nodes": NODES, "queues": QUEUES, "fairness": fairness})
    assert len(errors) == 1 and errors[0].startswith(words), errors


@pytest.mark.parametrize("preference, words", [
    ({"notebook": ["build"]}, "c.GPUPool.pool_preference.notebook: unknown kind"),
    ({"train": "train"}, "c.GPUPool.pool_preference.train: must be a list of pool names"),
    ({"train": ["train", "train"]}, "c.GPUPool.pool_preference.train: lists a pool twice"),
])
def test_pool_preference_is_checked(preference, words):
    errors, _ = check({"nodes": NODES, "queues": QUEUES, "pool_preference": preference})
    assert len(errors) == 1 and errors[0].startswith(words), errors


def test_good_pool_settings_pass():
    errors, warnings = check({"nodes": NODES, "queues": QUEUES, "pool_preference": PREFERENCE,
                              "fairness": {"window": "7d", "window_type": "tumbling", "half_life": "1d", "k": 0.5}})
    assert (errors, warnings) == ([], [])


# ---------------------------------------------------------------------------------- requests
def submissions(st):
    return Submissions(st, None, QueueAccess(st), None, None)


ALICE = Identity(name="alice", groups=[], admin=False)


def resources(st, body: dict, kind="train", model=S.JobRequest):
    request = model.model_validate({"notebook": "x.ipynb", **body} if model is S.JobRequest else body)
    return submissions(st).resources(request, "vision", kind, "alice")


def test_a_request_names_its_pools_or_gets_the_preference_of_its_kind(tmp_path):
    plain = settings(tmp_path)
    assert resources(plain, {"gpus": 1}).pools == ()  # no preference: any pool (the core's choice)
    assert resources(plain, {"gpus": 1, "pools": ["build"]}).pools == ("build",)
    st = settings(tmp_path, pool_preference=PREFERENCE)
    assert resources(st, {"gpus": 1}).pools == ("train", "build")
    assert resources(st, {"gpus": 1}, kind="interactive", model=S.WorkspaceRequest).pools == ("build", "train")
    assert resources(st, {"gpus": 1}, kind="hpo-trial").pools == ()  # a kind not listed
    assert resources(st, {"gpus": 1, "pools": ["build"]}).pools == ("build",)  # the request's own wins
    # a preferred pool without a node big enough is left out: 4 GPUs fit only the train pool
    assert resources(st, {"gpus": 4}, kind="interactive", model=S.WorkspaceRequest).pools == ("train",)
    # a preferred pool no node is in is left out
    st = settings(tmp_path, pool_preference={"train": ["gone", "build"]})
    assert resources(st, {"gpus": 1}).pools == ("build",)


@pytest.mark.parametrize("body, field, words", [
    ({"pools": ["gpu-farm"]}, "pools", "pools: no node is in pool 'gpu-farm' (the pools: build, train)"),
    ({"pools": ["build"], "gpus": 4}, "gpus", "gpus: no node in pools build has 4 GPUs (the largest there has 2)"),
    ({"pools": ["build", "build"]}, "pools", "pools: lists a pool twice"),
])
def test_a_bad_pool_is_a_400_naming_the_field(tmp_path, body, field, words):
    with pytest.raises(APIError) as e:
        resources(settings(tmp_path), body)
    assert (e.value.status, e.value.field, str(e.value.message)) == (400, field, words)


def test_the_request_models_validate_pools():
    from gpupool.hub_ext.web.validation import Invalid, parse

    for bad in ({"pools": "build"}, {"pools": [""]}, {"pools": [3]}, {"pools": ["p"] * 65}):
        with pytest.raises(Invalid) as e:
            parse(S.JobRequest, {"notebook": "x.ipynb", **bad})
        assert e.value.field == "pools" and e.value.message.startswith("pools: "), (bad, e.value.message)


# ---------------------------------------------------------------------------------- the store
def test_an_existing_database_gains_the_pool_columns_and_keeps_its_rows(tmp_path):
    """A database made before pools: its workloads table lacks ``pools`` and its ledger ``pool``;
    the next start adds both (NULL: any pool; the default pool), and every row is still there."""
    url = f"sqlite:///{tmp_path / 'old.sqlite'}"
    old = MetaData()
    for table, drop in ((D.Workload.__table__, "pools"), (D.Base.metadata.tables["usage"], "pool")):
        Table(table.name, old, *[Column(c.name, c.type, primary_key=c.primary_key) for c in table.columns
                                 if c.name != drop])
    engine = create_engine(url)
    old.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO workloads (id, type, user, queue, kind, gpus, status, reason, submitted_at, "
                          "parameters, allocation) VALUES (7, 'job', 'alice', 'vision', 'train', 1, 'running', '', 1, "
                          "'{}', '[{\"pod\": 0, \"node\": \"n\", \"gpus\": [0], \"fraction\": 1.0}]')"))
        conn.execute(text("INSERT INTO usage (workload_id, workload, type, user, queue, queue_path, department, kind, "
                          "node, gpu_indices, fraction, gpus, start) VALUES (7, 'j-000007', 'job', 'alice', 'vision', "
                          "'vision', 'vision', 'train', 'n', '[0]', 1.0, 1, 1)"))
    engine.dispose()
    engine = D.make_engine(url)
    assert "pools" in {c["name"] for c in inspect(engine).get_columns("workloads")}
    assert "pool" in {c["name"] for c in inspect(engine).get_columns("usage")}
    with D.make_sessionmaker(engine)() as s:
        row = s.get(D.Workload, 7)
        assert (row.user, row.status, row.pools, row.allocation[0]["node"]) == ("alice", "running", None, "n")
        assert s.execute(text("SELECT workload, pool FROM usage")).all() == [("j-000007", None)]
    from gpupool.hub_ext.domain.usage import report
    with D.make_sessionmaker(engine)() as s:
        doc = report(s, 0, 3601, "pool", now=3601)
    assert [(r["pool"], r["allocated_gpu_hours"]) for r in doc["rows"]] == [("default", 1.0)]


# ---------------------------------------------------------------------------------- the cycle
class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


async def make_loop(tmp_path, monkeypatch, clock, st=None, **extra):
    import time as real_time

    from gpupool.backends.local import LocalBackend
    from gpupool.hub_ext.runtime import loop as loop_mod
    from gpupool.hub_ext.runtime.metrics import Metrics

    monkeypatch.setattr(loop_mod, "time", types.SimpleNamespace(time=clock, perf_counter=real_time.perf_counter))
    st = st or settings(tmp_path, cycle_in_process=False, **extra)
    sessions = D.make_sessionmaker(D.make_engine(st.pool.db_url))
    loop = loop_mod.SchedulerLoop(st, sessions, LocalBackend(), Metrics(clock=clock))
    loop.ledger.clock = clock
    await loop.recover()
    return st, sessions, loop


def add_workspace(sessions, user, queue, gpus, now, pools=None, kind="interactive", preemptible=False) -> int:
    with sessions() as s:
        row = D.Workload(type=D.WORKSPACE, user=user, server="", name=user, queue=queue, kind=kind,
                         gpus=float(gpus), preemptible=preemptible, parameters={}, status=D.QUEUED, submitted_at=now,
                         pools=pools)
        s.add(row)
        s.commit()
        return row.id


async def test_the_cycle_places_each_workload_in_its_pools_and_the_ledger_records_the_pool(tmp_path, monkeypatch):
    clock = Clock(1_000_000.0)
    st, sessions, loop = await make_loop(tmp_path, monkeypatch, clock)
    small = add_workspace(sessions, "alice", "vision", 1, clock.t, pools=["build"])
    big = add_workspace(sessions, "bob", "nlp", 2, clock.t, pools=["train"])
    anyw = add_workspace(sessions, "alice", "vision", 2, clock.t)  # NULL: any pool
    result = await loop.cycle()
    where = {b.workload: {p.node for p in b.placements} for b in result.binds}
    assert where[D.public_id(D.WORKSPACE, small)] <= {"small-0", "small-1"}
    assert where[D.public_id(D.WORKSPACE, big)] == {"big"}
    assert D.public_id(D.WORKSPACE, anyw) in where
    assert "(node pool build)" in next(b.reason for b in result.binds if b.workload.endswith(str(small)))
    # a fourth asks for a pool whose quota for its queue is used up and whose GPUs are taken
    clock.t += 3600
    with sessions() as s:
        for wid in (small, big, anyw):
            s.delete(s.get(D.Workload, wid))
        s.commit()
    await loop.cycle()
    from gpupool.hub_ext.domain.usage import report
    from gpupool.hub_ext.store.ledger import UsageRecord
    with sessions() as s:
        pools = {r.workload_id: r.pool for r in s.query(UsageRecord)}
        doc = report(s, clock.t - 7200, clock.t, "pool", now=clock.t)
    assert pools[small] == "build" and pools[big] == "train"
    by_pool = {r["pool"]: r["allocated_gpu_hours"] for r in doc["rows"]}
    assert by_pool["build"] + by_pool.get("train", 0) == pytest.approx(5.0)
    assert by_pool["train"] >= 2.0 and by_pool["build"] >= 1.0


# ---------------------------------------------------------------------------------- client and CLI
def test_submit_and_the_cli_send_pools(monkeypatch):
    import argparse

    from gpupool.client import cli
    from gpupool.client.jobs import build_body

    assert build_body(["python", "t.py"], pools=["train", "build"])["pools"] == ["train", "build"]
    assert build_body(["python", "t.py"], pools="train")["pools"] == ["train"]
    assert "pools" not in build_body(["python", "t.py"])
    sent = {}
    monkeypatch.setattr(cli, "post_job", lambda body, *a: sent.update(body) or (_ for _ in ()).throw(SystemExit(0)))
    monkeypatch.setattr(cli, "_client", lambda args: None)
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["submit", "--pool", "train", "--pool", "build", "-g", "1", "--command", "true"])
    with pytest.raises(SystemExit):
        args.func(args)
    assert sent["pools"] == ["train", "build"] and sent["command"] == ["true"]


async def test_the_demo_declares_a_build_and_a_train_environment(tmp_path, monkeypatch):
    """The declared demo: workspaces prefer the small GPUs of pool build, jobs the big ones of pool
    train; the cycle places them so, and each falls back on the other pool when its own is full."""
    from traitlets.config.loader import PyFileConfigLoader

    from gpupool.hub_ext import demo_config

    path = demo_config.write_demo(tmp_path / "demo", demo_config.DemoOptions(port=18950))
    cfg = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    cfg.GPUPool.cycle_in_process = False
    st = load(cfg, cwd=str(tmp_path))
    assert {n.pool: n.gpu_memory for n in st.nodes} == {"build": 24 * 2**30, "train": 80 * 2**30}
    subs = submissions(st)
    ws = subs.resources(S.WorkspaceRequest.model_validate({"gpus": 1}), "vision", "interactive", "alice")
    job = subs.resources(S.JobRequest.model_validate({"notebook": "t.ipynb", "gpus": 1}), "vision", "train", "alice")
    assert (ws.pools, job.pools) == (("build", "train"), ("train", "build"))
    clock = Clock(1_000_000.0)
    _, sessions, loop = await make_loop(tmp_path, monkeypatch, clock, st=st)
    ids = [add_workspace(sessions, "alice", "vision", 1, clock.t, pools=list(ws.pools)),
           add_workspace(sessions, "alice", "vision", 1, clock.t, pools=list(job.pools), kind="train")]
    # four 1-GPU jobs of nlp in the train environment: nlp's share of pool train (its 2 deserved, as
    # vision's workspace may use pool train too) runs there, the others fall back on pool build
    ids += [add_workspace(sessions, "bob", "nlp", 1, clock.t + i, pools=list(job.pools), kind="train")
            for i in range(4)]
    result = await loop.cycle()
    node = {b.workload: b.placements[0].node for b in result.binds}
    assert node[D.public_id(D.WORKSPACE, ids[0])] == "build-node"
    assert node[D.public_id(D.WORKSPACE, ids[1])] == "train-node"
    assert sorted(node[D.public_id(D.WORKSPACE, i)] for i in ids[2:]) == ["build-node"] * 2 + ["train-node"] * 2


# ---------------------------------------------------------------------------------- fairness over time
FAIR_NODES = [{"name": "t", "gpus": 4, "pool": "train"}]
FAIR_QUEUES = [{"name": "lab", "pools": {"train": {"deserved": {"gpu": 0}}}},
               {"name": "a", "parent": "lab"}, {"name": "b", "parent": "lab"}]


async def fair_loop(tmp_path, monkeypatch, clock, fairness):
    st = load({"nodes": FAIR_NODES, "queues": FAIR_QUEUES, "db_url": f"sqlite:///{tmp_path / 'fair.sqlite'}",
               "job_root": str(tmp_path / "jobs"), "work_dir": str(tmp_path), "run_as_user": False,
               "cycle_in_process": False, "fairness": fairness})
    return await make_loop(tmp_path, monkeypatch, clock, st=st)


def release_all(sessions) -> None:
    with sessions() as s:
        for row in s.query(D.Workload):
            s.delete(row)
        s.commit()


async def play_turns(tmp_path, monkeypatch, fairness) -> tuple[dict, dict, Any]:
    """Queue a holds the 4 GPUs for an hour; then a and b each want all 4 at once. Returns the GPUs
    each is given, the usage the loop shows, and the loop."""
    clock = Clock(1_000_000.0)
    tmp_path.mkdir()
    _, sessions, loop = await fair_loop(tmp_path, monkeypatch, clock, fairness)
    for i in range(4):
        add_workspace(sessions, "u", "a", 1, clock.t + i, kind="train", preemptible=True)
    assert len((await loop.cycle()).binds) == 4
    clock.t += 3600
    release_all(sessions)
    await loop.cycle()
    for i in range(4):
        for q in ("a", "b"):
            add_workspace(sessions, "u", q, 1, clock.t + i, kind="train", preemptible=True)
    result = await loop.cycle()
    got = {"a": 0, "b": 0}
    queue_of = {}
    with sessions() as s:
        queue_of = {D.public_id(r.type, r.id): r.queue for r in s.query(D.Workload)}
    for b in result.binds:
        got[queue_of[b.workload]] += 1
    return got, loop.state.usage, loop


async def test_fairness_over_time_gives_the_idle_queue_more_of_what_is_lent(tmp_path, monkeypatch):
    got, usage, loop = await play_turns(tmp_path / "off", monkeypatch, {})
    assert got == {"a": 2, "b": 2} and usage == {}  # off (the default): equal weights, equal shares
    got, usage, loop = await play_turns(tmp_path / "on", monkeypatch, {"window": "2h", "k": 1})
    # a held the pool's 4 GPUs for one hour of the two-hour window: half its capacity
    assert usage["train"]["a"] == pytest.approx(0.5, abs=0.01) and usage["train"]["lab"] == usage["train"]["a"]
    assert "b" not in usage["train"]
    assert got["b"] > got["a"] and got["a"] + got["b"] == 4, got
    assert loop.decider.config.scheduler.fairness_k == 1.0
    fair = loop.state.pool_fair_share["train"]
    assert fair["b"]["gpu"] > fair["a"]["gpu"]  # the share moved, not only the binds


async def test_usage_is_read_incrementally_and_rebuilt_from_the_ledger_at_a_restart(tmp_path, monkeypatch):
    from sqlalchemy import event

    clock = Clock(1_000_000.0)
    fairness = {"window": "2h", "half_life": "30m", "k": 1}
    st, sessions, loop = await fair_loop(tmp_path, monkeypatch, clock, fairness)
    statements = []
    event.listen(sessions.kw["bind"], "before_cursor_execute",
                 lambda conn, cur, stmt, params, ctx, many: statements.append(stmt))
    for i in range(3):
        add_workspace(sessions, "u", "a", 1, clock.t + i, kind="train", preemptible=True)
    add_workspace(sessions, "u", "b", 1, clock.t, kind="train", preemptible=True)
    await loop.cycle()
    for _ in range(6):  # an hour, a cycle every ten minutes
        clock.t += 600
        await loop.cycle()
    reads = [x for x in statements if x.lstrip().upper().startswith("SELECT") and "FROM usage" in x]
    assert reads and all("usage.id >" in x or "usage.id IN" in x for x in reads), reads
    running = dict(loop.state.usage["train"])
    assert running["a"] == pytest.approx(3 * running["b"], rel=1e-6) and running["lab"] == pytest.approx(
        running["a"] + running["b"])
    # a restart (a new service on the same database) rebuilds the same usage from the ledger
    _, _, again = await fair_loop(tmp_path, monkeypatch, clock, fairness)
    await again.cycle()
    for q in ("a", "b", "lab"):
        assert again.state.usage["train"][q] == pytest.approx(running[q], rel=0.03), q


# ---------------------------------------------------------------------------------- showing pools
async def test_pools_queues_dashboard_cli_widgets_form_and_metrics_show_pools_and_usage(tmp_path, monkeypatch, capsys):
    """After a cycle with two pools and fairness over time on: GET pools and GET queues (the same
    code as the handlers), the dashboard's data, `gpupool queues`, the queue widget, the spawn
    form and the Prometheus metrics all show each pool and each queue's share and usage there."""
    from gpupool.client import cli
    from gpupool.hub_ext.web.dashboard import dashboard_data
    from gpupool.hub_ext.web.pools import pools_of, queue_entry
    from gpupool.spawner.form import render_form
    from gpupool.widgets.render import queues_html

    got, usage, loop = await play_turns(tmp_path / "on", monkeypatch, {"window": "2h", "k": 1})
    # one more pool, empty, and a queued workload that may use any pool
    from gpupool.hub_ext.domain.access import QueueAccess

    svc = types.SimpleNamespace(loop=loop, settings=loop.settings, sessions=loop.sessions, idle=None,
                                access=QueueAccess(loop.settings), nvml=None)
    pools = pools_of(svc)
    assert pools["fairness"] == {"window": "2h", "k": 1}
    (train,) = pools["pools"]
    assert (train["name"], train["gpus"], train["nodes"]) == ("train", 4.0, 1)
    assert (train["allocated"], train["free"], train["running"], train["queued"]) == (4.0, 0.0, 4, 4)
    queues = []
    for spec in loop.settings.queues:
        entry = queue_entry(svc, spec, pools)
        queues.append({"name": spec.name, "parent": spec.parent, "deserved": spec.deserved, "limit": spec.limit,
                       "over_quota_weight": spec.over_quota_weight, "fair_share": loop.state.fair_share[spec.name],
                       "allocated": loop.state.allocated.get(spec.name, {}), "may_submit": True, **entry})
    by = {q["name"]: q for q in queues}
    assert by["a"]["usage"] == pytest.approx(0.5, abs=0.01) and by["b"]["usage"] == 0.0
    assert by["b"]["pools"]["train"]["fair_share"]["gpu"] > by["a"]["pools"]["train"]["fair_share"]["gpu"]
    assert by["a"]["pools"]["train"]["may_use"] and by["a"]["pools"]["train"]["usage"] == pytest.approx(0.5, abs=0.01)
    # beside each share, the share without past usage: a and b want the 4 GPUs, 2 each by weight
    for q, plain in (("a", 2.0), ("b", 2.0), ("lab", 4.0)):
        assert by[q]["fair_share_plain"] == {"gpu": plain} and by[q]["pools"]["train"]["fair_share_plain"] == {
            "gpu": plain}, q
    assert by["a"]["fair_share"]["gpu"] < 2.0 < by["b"]["fair_share"]["gpu"]
    S.QueueList.model_validate({"queues": [{**q, "priority": 0, "running": 0, "pending": 0, "users": [], "groups": []}
                                           for q in queues]})
    S.PoolList.model_validate(pools)
    # the dashboard
    data = dashboard_data(svc, "admin", True, loop.state.last_cycle_at)
    assert data["fairness"] and [p["name"] for p in data["pools"]] == ["train"]
    assert {q["name"]: q["weight"] for q in data["queues"]}["b"] == 1.0
    assert data["plain"] and {q["name"]: q["fair_share_plain"] for q in data["queues"]} == {"lab": 4.0, "a": 2.0,
                                                                                            "b": 2.0}
    page = _env.get_template("dashboard.html").render(data=data, data_json="{}", prefix="/", static="/static/")
    assert ">without past usage</th>" in page
    assert '<td class="num plain-share" data-queue="a" data-pool="train">2.00</td>' in page
    # gpupool queues
    monkeypatch.setattr(cli, "_client", lambda args: types.SimpleNamespace(queues=lambda: queues))
    assert cli.cmd_queues(types.SimpleNamespace(json=False)) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header[header.index("WEIGHT") + 1] == "USAGE" and header[header.index("FAIR-SHARE") + 1] == "WITHOUT-USAGE"
    lines = [line.split() for line in out.splitlines()]
    assert "by node pool:" in out and any(line[:2] == ["a", "train"] and "50%" in line for line in lines)
    a_row = next(dict(zip(header, line)) for line in lines if line[:2] == ["a", "lab"])
    assert a_row["WITHOUT-USAGE"] == "2" and float(a_row["FAIR-SHARE"]) < 2
    pool_header = lines[lines.index(["by", "node", "pool:"]) + 1]
    assert pool_header[pool_header.index("FAIR-SHARE") + 1] == "WITHOUT-USAGE"
    # the queue widget and the spawn form
    html = queues_html(queues)
    assert 'data-usage="0.500"' in html and 'data-pool="train"' in html
    assert 'data-plain="2.000"' in html and "(2.00 without past usage)" in html
    from gpupool.widgets.render import job_html
    assert "train, build" in job_html({"id": "j-000001", "status": "queued", "pools": ["train", "build"]})
    form = render_form(queues=[by["b"]])
    assert "Node pools of b:" in form and "train: 0 GPUs free" in form
    # Prometheus: a pool label
    text = loop.metrics.render().decode()
    assert 'gpupool_pool_gpus{pool="train",what="total"} 4.0' in text
    assert 'gpupool_pool_queue_gpus{pool="train",queue="a",what="usage"} 0.5' in text
    assert 'gpupool_pool_queue_gpus{pool="train",queue="a",what="fair_share_plain"} 2.0' in text
    assert 'gpupool_queue_gpus{queue="lab",what="fair_share_plain"} 4.0' in text


async def test_without_past_usage_nothing_new_is_shown(tmp_path, monkeypatch, capsys):
    """Fairness over time off: no share without past usage anywhere (null in the API, no column in
    `gpupool queues` or the dashboard, no words in the widget, no metric series); on, its series go
    once no queue has past usage (the window passed)."""
    from gpupool.client import cli
    from gpupool.hub_ext.web.dashboard import dashboard_data
    from gpupool.hub_ext.web.pools import pools_of, queue_entry
    from gpupool.widgets.render import queues_html

    _, _, loop = await play_turns(tmp_path / "off", monkeypatch, {})
    svc = types.SimpleNamespace(loop=loop, settings=loop.settings, sessions=loop.sessions, idle=None,
                                access=QueueAccess(loop.settings), nvml=None)
    pools = pools_of(svc)
    queues = [{"name": spec.name, "fair_share": loop.state.fair_share[spec.name], **queue_entry(svc, spec, pools)}
              for spec in loop.settings.queues]
    assert all(q["fair_share_plain"] is None and q["pools"]["train"]["fair_share_plain"] is None for q in queues)
    data = dashboard_data(svc, "admin", True, loop.state.last_cycle_at)
    assert not data["plain"] and all(q["fair_share_plain"] is None for q in data["queues"])
    page = _env.get_template("dashboard.html").render(data=data, data_json="{}", prefix="/", static="/static/")
    assert ">without past usage</th>" not in page and "plain-share" not in page  # (the chart's JS names it)
    monkeypatch.setattr(cli, "_client", lambda args: types.SimpleNamespace(queues=lambda: queues))
    assert cli.cmd_queues(types.SimpleNamespace(json=False)) == 0
    assert "WITHOUT-USAGE" not in capsys.readouterr().out
    assert "without past usage" not in queues_html(queues)
    assert 'what="fair_share_plain"' not in loop.metrics.render().decode()
    # on: the series are there while past usage counts, and go once a cycle has none
    _, _, loop = await play_turns(tmp_path / "on", monkeypatch, {"window": "2h", "k": 1})
    text = loop.metrics.render().decode()
    assert 'gpupool_queue_gpus{queue="a",what="fair_share_plain"} 2.0' in text
    assert 'gpupool_pool_queue_gpus{pool="train",queue="a",what="fair_share_plain"} 2.0' in text
    st = loop.state
    none = CycleResult(fair_share=st.fair_share, allocated=st.allocated, pool_fair_share=st.pool_fair_share,
                       pool_allocated=st.pool_allocated)  # as a cycle with no usage gives it
    loop.metrics.observe_cycle(loop, st.last_cycle_at, {}, none, 0.0, 0.0)
    text = loop.metrics.render().decode()
    assert 'what="fair_share_plain"' not in text and 'gpupool_queue_gpus{queue="a",what="fair_share"}' in text


def test_the_admin_guide_pool_and_fairness_examples_pass_the_check():
    """docs/admin.md's node pool and fairness examples, as written, are settings the hub takes."""
    import re
    from pathlib import Path

    from traitlets.config import Config

    text = (Path(__file__).resolve().parents[2] / "docs" / "admin.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text[text.index("## 7. Node pools"):text.index("## Sizes")], re.S)
    assert len(blocks) == 2
    c = Config()
    for block in blocks:
        exec(block, {"c": c})
    errors, warnings = check(c)
    assert (errors, warnings) == ([], [])
    st = load(c, cwd="/tmp")
    assert {n.pool for n in st.nodes} == {"build", "train"} and st.pool.fairness["window"] == "7d"
