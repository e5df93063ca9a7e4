"""HPO sweeps: space helpers and parsing (pure), and real sweeps of notebook jobs through the hub."""
from __future__ import annotations

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
