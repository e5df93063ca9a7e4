"""HPO sweeps: space helpers and parsing (pure), and real sweeps of notebook jobs through the hub."""
from __future__ import annotations

import json
import time

import optuna
import pytest

import gpupool
from gpupool.client import sweep as sw


def test_space_helpers_map_to_optuna_distributions():
    dists, fixed = sw.to_distributions({"lr": gpupool.loguniform(1e-5, 1e-1), "layers": [2, 4, 8],
                                        "drop": gpupool.uniform(0, 0.5), "depth": gpupool.intuniform(1, 3),
                                        "opt": gpupool.choice("adam", "sgd"), "epochs": 3})
    assert dists["lr"] == optuna.distributions.FloatDistribution(1e-5, 1e-1, log=True)
    assert dists["layers"] == optuna.distributions.CategoricalDistribution((2, 4, 8))
    assert dists["depth"] == optuna.distributions.IntDistribution(1, 3)
    assert fixed == {"epochs": 3}
    with pytest.raises(ValueError, match="0 < low < high"):
        gpupool.loguniform(0, 1)
    with pytest.raises(sw.SweepError, match="nothing to search"):
        sw.to_distributions({"epochs": 3})
    with pytest.raises(sw.SweepError, match="'lr' is continuous"):
        sw.make_sampler("grid", {"lr": gpupool.loguniform(1e-5, 1e-1)})
    assert sw.grid_of({"a": gpupool.intuniform(1, 3), "b": gpupool.choice(True, False)}) == {"a": [1, 2, 3], "b": [True, False]}
    with pytest.raises(sw.SweepError, match="sampler"):
        sw.make_sampler("bayes", dists)
    with pytest.raises(sw.SweepError, match="pruner"):
        sw.make_pruner("sometimes")


@pytest.mark.parametrize("text, name, dist", [
    ("lr=loguniform(1e-5,1e-1)", "lr", optuna.distributions.FloatDistribution(1e-5, 0.1, log=True)),
    ("x=uniform(0, 1)", "x", optuna.distributions.FloatDistribution(0.0, 1.0)),
    ("n=intuniform(2,8)", "n", optuna.distributions.IntDistribution(2, 8)),
    ("layers=2,4,8", "layers", optuna.distributions.CategoricalDistribution((2, 4, 8))),
    ("opt=choice(adam,sgd)", "opt", optuna.distributions.CategoricalDistribution(("adam", "sgd"))),
    ("epochs=3", "epochs", 3),
])
def test_cli_space_strings(text, name, dist):
    assert sw.parse_space_item(text) == (name, dist)


@pytest.mark.parametrize("text, msg", [("lr", "expected NAME=SPEC"), ("lr=loguni(1,2)", "unknown function"),
                                       ("lr=loguniform(1)", "two numbers"), ("lr=loguniform(0,1)", "0 < low")])
def test_cli_space_errors(text, msg):
    with pytest.raises(sw.SweepError, match=msg):
        sw.parse_space_item(text)


def test_trial_table_without_pandas():
    t = sw.TrialTable(["number", "state", "value"], [{"number": 0, "state": "complete", "value": 0.5},
                                                     {"number": 1, "state": "pruned", "value": None}])
    assert len(t) == 2 and t["state"] == ["complete", "pruned"] and t.to_records()[0]["value"] == 0.5
    assert repr(t).splitlines()[0].split() == ["number", "state", "value"] and "<table>" in t._repr_html_()


# -- real sweeps through the hub -----------------------------------------------------------------
from gpupool.client import api  # noqa: E402


@pytest.fixture(scope="module")
def alice(hub):
    return api.Client(hub.hub_url, hub.token("alice"))


def _service_jobs(alice, name):
    return alice.jobs(sweep=name)


@pytest.mark.hub
@pytest.mark.slow
def test_sweep_finds_the_optimum_and_resumes_after_a_restart(alice, tmp_path):
    """4 trials, 2 at a time; the driver is stopped mid-way (as a kernel restart would) and a new
    sweep(name=...) reattaches to the running jobs instead of resubmitting them."""
    storage = tmp_path / "sweeps.db"
    kw = dict(space={"x": gpupool.choice(0.0, 1.0, 2.5, 3.0, 4.0, 6.0)}, objective="score", direction="maximize",
              trials=4, parallel=2, gpus=0.25, sampler="random", seed=7, pruner=None, name="resume-me",
              storage=storage, parameters={"steps": 2, "pause": 1.0, "slow_below": 100}, poll=0.5, client=alice)
    first = gpupool.sweep("quad.ipynb", **kw)
    deadline = time.time() + 60
    while len(first._active) < 2 and time.time() < deadline:
        time.sleep(0.2)
    first.stop()  # detach: the jobs keep running
    assert first.status == "stopped" and not first._thread.is_alive()
    running = {t.number: t.user_attrs["job_id"] for t in first.study.get_trials(deepcopy=False)}
    assert len(running) == 2

    second = gpupool.sweep("quad.ipynb", **kw)
    assert second.resumed and {n: j for n, (_t, j) in second._active.items()} == running
    second.wait(timeout=240, progress=False)
    assert second.status == "finished", second.error

    jobs = _service_jobs(alice, "resume-me")
    assert len(jobs) == 4  # nothing was submitted twice
    assert {j["kind"] for j in jobs} == {"hpo-trial"} and {j["name"] for j in jobs} == {f"resume-me-t{i}" for i in range(4)}
    table = second.trials
    records = table.to_records() if hasattr(table, "to_records") and not hasattr(table, "iloc") else table.to_dict("records")
    assert len(records) == 4 and all(r["state"] == "complete" for r in records), records
    for r in records:  # each trial's value is what its notebook computed from its injected parameter
        assert r["value"] == pytest.approx(10 - (r["params_x"] - 3) ** 2)
    best = second.best
    assert best.value == max(r["value"] for r in records)
    assert best.value == pytest.approx(10 - (best.params["x"] - 3) ** 2)
    assert best.job.status == "succeeded" and best.job.metrics["score"][-1][1] == pytest.approx(best.value)
    assert best.job.data["parameters"]["x"] == best.params["x"]
    summary = second.summary()
    assert summary["done"] == 4 and summary["best"]["value"] == best.value
    assert all(t["curve"] for t in summary["trials"])


@pytest.mark.hub
@pytest.mark.slow
def test_pruner_cancels_a_trial_that_falls_behind(alice, tmp_path):
    """Trial 0 (x=3) completes; trial 1 (x=0.5) logs a worse first step and sleeps between steps:
    the median pruner stops it and its job is cancelled long before it would have finished."""
    s = gpupool.sweep("quad.ipynb", space={"x": gpupool.uniform(0.0, 6.0)}, objective="score", trials=2,
                      parallel=1, gpus=0.25, pruner=optuna.pruners.MedianPruner(n_startup_trials=1),
                      initial=[{"x": 3.0}, {"x": 0.5}], parameters={"steps": 8, "pause": 20.0, "slow_below": 1.0},
                      name="prune-me", storage=tmp_path / "s.db", poll=0.5, client=alice)
    s.wait(timeout=200, progress=False)
    trials = s.study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED]
    assert trials[1].params == {"x": 0.5} and "pruned at step 0" in trials[1].user_attrs["reason"]
    job = alice.job(trials[1].user_attrs["job_id"])
    assert job["status"] == "cancelled"
    assert s.best.params == {"x": 3.0} and s.best.value == pytest.approx(10.0)


def test_a_reader_racing_the_discard_of_a_sweep_that_ran_nothing_sees_the_final_summary(tmp_path, monkeypatch):
    """The driver thread deletes the study of a sweep whose trials were all refused while a reader
    (the CLI's progress loop) is between its check and its read: the reader gets the final summary,
    never the storage's KeyError."""
    import threading

    import nbformat

    from hub_harness import notebook

    monkeypatch.chdir(tmp_path)
    nbformat.write(nbformat.from_dict(notebook("x = 1")), "t.ipynb")
    class NoHub:  # the sweep asks the service for its queues once, before any state is made
        def queues(self):
            return []

    s = sw.Sweep("t.ipynb", {"x": [1, 2]}, "score", name="gone", storage=tmp_path / "s.db", client=NoHub())
    got: dict = {}
    with s._lock:  # the driver is about to discard: a reader starts now and must wait for the lock
        readers = [threading.Thread(target=lambda k=k: got.__setitem__(k, getattr(s, k)() if k != "best"
                                                                       else s.best), daemon=True)
                   for k in ("summary", "best", "_progress_text")]
        for t in readers:
            t.start()
        time.sleep(0.3)
        s._discard_if_nothing_ran()
    for t in readers:
        t.join(10)
    assert got["best"] is None and got["summary"]["trials"] == [] and "nothing ran" in got["_progress_text"]
    assert len(s.trials) == 0 and not (tmp_path / "s.db").exists()


@pytest.mark.hub
def test_a_refused_submission_stops_the_sweep_and_leaves_no_state(alice, tmp_path):
    storage = tmp_path / "s.db"
    with pytest.raises(sw.SweepError, match="queue: unknown queue 'nope'"):  # checked before any state is made
        gpupool.sweep("quad.ipynb", space={"x": [1, 2]}, objective="score", queue="nope", storage=storage, client=alice)
    with pytest.raises(sw.SweepError, match="may not submit to queue 'nlp'"):
        gpupool.sweep("quad.ipynb", space={"x": [1, 2]}, objective="score", queue="nlp", storage=storage, client=alice)
    assert not storage.exists()
    s = gpupool.sweep("quad.ipynb", space={"x": [1, 2]}, objective="score", gpus=3, name="refused",
                      storage=storage, poll=0.2, client=alice)
    with pytest.raises(sw.SweepError, match="gpus: no node has 3 GPUs"):
        s.wait(timeout=60, progress=False)
    assert s.status == "failed" and "no node has 3 GPUs" in s.error and s.summary()["status"] == "failed"
    assert not storage.exists()  # nothing ran: the study and the file it created are gone
    # the name can be used again; the same name with another notebook is refused
    sw.Sweep("quad.ipynb", {"x": [1, 2]}, "score", name="refused", storage=storage, client=alice)  # not started
    with pytest.raises(sw.SweepError, match="already exists .* choose another name"):
        gpupool.sweep("tiny.ipynb", space={"x": [1, 2]}, objective="score", name="refused",
                      storage=storage, client=alice)


@pytest.mark.hub
@pytest.mark.slow
def test_rerunning_a_failed_sweep_name_judges_the_new_trials(alice, tmp_path, monkeypatch):
    """A sweep whose notebook was broken fails; once the (local) notebook is fixed, the same name
    resumes and finishes: the old failures do not fail the new run."""
    from hub_harness import notebook

    monkeypatch.chdir(tmp_path)
    nb = tmp_path / "trial.ipynb"
    nb.write_text(json.dumps(notebook("raise ValueError('bug')", parameters="x = 0")))
    kw = dict(space={"x": [1, 2, 3, 4, 5]}, objective="score", sampler="grid", parallel=3, gpus=0.25,
              name="fix-me", storage=tmp_path / "s.db", poll=0.3, client=alice)
    first = gpupool.sweep("trial.ipynb", trials=3, **kw)
    with pytest.raises(sw.SweepError, match="the first 3 trials all failed"):
        first.wait(timeout=120, progress=False)
    nb.write_text(json.dumps(notebook("import gpupool\ngpupool.log_metric('score', x, step=0)", parameters="x = 0")))
    second = gpupool.sweep("trial.ipynb", trials=5, **kw)
    assert second.resumed
    second.wait(timeout=120, progress=False)
    assert second.status == "finished" and second.error is None
    assert second.summary()["counts"] == {"complete": 2, "pruned": 0, "failed": 3, "running": 0}
