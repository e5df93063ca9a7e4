"""Workload policies (hub_ext/domain/policies.py): the entry on queues and departments, the
effective policy of a leaf queue with where each value is set, a child that loosens its parent
refused by the configuration check, defaults filled and limits refused (without a hub: the hub
tests are in test_hub_policies.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

NODES = [{"name": "box", "gpus": 4, "gpu_memory": "24Gi"}]


def queues(research=None, vision=None, nlp=None):
    out = [{"name": "research", "deserved": {"gpu": 2}},
           {"name": "vision", "parent": "research", "deserved": {"gpu": 1}},
           {"name": "nlp", "parent": "research", "deserved": {"gpu": 1}},
           {"name": "ops"}]
    for entry, policy in zip(out, (research, vision, nlp)):
        if policy is not None:
            entry["policy"] = policy
    return out


def settings(**policies):
    from gpupool.hub_ext.config import load

    return load({"nodes": NODES, "queues": queues(**policies)}, discover=False)


def errors(**policies):
    from gpupool.hub_ext.config import check

    return check({"nodes": NODES, "queues": queues(**policies)}, discover=False)[0]


def test_the_issues_example_shape_resolves_with_where_each_value_is_set():
    s = settings(research={"interactive": {"limits": {"gpus": 2, "run_time": "8h"}}},
                 vision={"train": {"defaults": {"gpus": 1}, "limits": {"gpus": 2}},
                         "interactive": {"limits": {"gpus": 1}}})
    vision = s.policies["vision"]
    assert (vision["train"].default("gpus"), vision["train"].limit("gpus")) == (1, 2)
    assert vision["train"].limits["gpus"].level == "queue vision"
    assert vision["interactive"].limit("gpus") == 1 and vision["interactive"].limits["gpus"].level == "queue vision"
    assert vision["interactive"].limits["run_time"].value == 8 * 3600
    assert vision["interactive"].limits["run_time"].where == "policy of department research"
    nlp = s.policies["nlp"]["interactive"]
    assert nlp.limit("gpus") == 2 and nlp.limits["gpus"].where == "policy of department research"
    assert "research" not in s.policies  # a department takes no workloads: only leaves have an effective policy
    assert s.policies["ops"]["train"].limits == {} and s.policies["ops"]["train"].allowed is None


def test_a_child_may_only_tighten_its_parent():
    errs = errors(research={"*": {"limits": {"kinds": ["train", "interactive"]}},
                            "interactive": {"limits": {"gpus": 2, "run_time": "8h"}}},
                  nlp={"*": {"limits": {"kinds": ["train", "inference"]}},
                       "interactive": {"limits": {"gpus": 4, "run_time": "9h"}}})
    assert ("c.GPUPool.queues[2] (nlp).policy.interactive.limits.gpus: 4 GPUs is looser than the 2 GPUs of the "
            "policy of department research (a queue may only tighten its parent's policy)") in errs, errs
    assert any(e.startswith("c.GPUPool.queues[2] (nlp).policy.interactive.limits.run_time: 9 h is looser than the "
                            "8 h") for e in errs), errs
    assert any(e.startswith("c.GPUPool.queues[2] (nlp).policy.*.limits.kinds: inference, train is looser than the "
                            "interactive, train") for e in errs), errs
    assert len(errs) == 3, errs  # each said once, not once per kind
    # the same value, or a tighter one, is fine
    assert errors(research={"train": {"limits": {"gpus": 2}}}, vision={"train": {"limits": {"gpus": 2}}},
                  nlp={"train": {"limits": {"gpus": 1}}}) == []


@pytest.mark.parametrize("policy, words", [
    ({"gpu-hog": {}}, "(vision).policy.gpu-hog: unknown kind"),
    ({"train": {"limits": {"gpu": 2}}}, "(vision).policy.train.limits.gpu: unknown field"),
    ({"train": {"limits": {"gpus": -1}}}, "(vision).policy.train.limits.gpus: must be >= 0"),
    ({"train": {"limits": {"pods": 1.5}}}, "(vision).policy.train.limits.pods: must be a whole number"),
    ({"train": {"defaults": {"gpus": 1.5}}}, "(vision).policy.train.defaults.gpus: 1.5: above 1 must be a whole"),
    ({"train": {"defaults": {"gpus": 1, "gpu_memory": "8Gi"}}}, "give either gpus or gpu_memory, not both"),
    ({"train": {"defaults": {"memory": "lots"}}}, "(vision).policy.train.defaults.memory:"),
    ({"train": {"defaults": {"preemptible": "yes"}}}, "defaults.preemptible: must be true or false"),
    ({"interactive": {"limits": {"run_time": "soon"}}}, "'soon' is not a duration"),
    ({"train": {"limits": {"kinds": ["train"]}}}, "set the kinds a queue takes under '*'"),
    ({"*": {"limits": {"kinds": ["gpu-hog"]}}}, "unknown kind 'gpu-hog'"),
    ({"train": {"defaults": {"gpus": 4}, "limits": {"gpus": 2}}},
     "(vision).policy.train.defaults.gpus: the default 4 GPUs is more than queue vision allows (gpus 2 GPUs"),
    ("8 GPUs", "(vision).policy: must map a kind"),
])
def test_bad_entries_are_refused_naming_queue_and_field(policy, words):
    errs = errors(vision=policy)
    assert any(words in e for e in errs), errs
    assert all(e.startswith("c.GPUPool.queues[1] (vision).policy") for e in errs), errs


def test_a_parents_default_beyond_a_childs_limit_is_refused():
    errs = errors(research={"train": {"defaults": {"gpus": 2}}}, vision={"train": {"limits": {"gpus": 1}}})
    assert any("(research).policy.train.defaults.gpus: the default 2 GPUs is more than queue vision allows" in e
               for e in errs), errs


def test_star_applies_to_every_kind_and_a_kinds_entry_adds_to_it():
    s = settings(research={"*": {"defaults": {"cpu": 2}, "limits": {"gpus": 4, "kinds": ["train", "interactive"]}},
                           "train": {"limits": {"gpus": 3}}},
                 vision={"train": {"defaults": {"cpu": 4}}})
    train = s.policies["vision"]["train"]
    assert train.limit("gpus") == 3 and train.default("cpu") == 4  # the tighter limit; the kind's default wins
    assert s.policies["vision"]["interactive"].limit("gpus") == 4
    assert s.policies["nlp"]["train"].default("cpu") == 2
    assert s.policies["vision"]["inference"].allowed.level == "department research"
    assert s.policies["vision"]["train"].allowed is None


def test_run_and_idle_time_limits_tighten_the_existing_rules():
    from gpupool.hub_ext.config import load

    s = load({"nodes": NODES, "queues": queues(research={"interactive": {"limits": {"run_time": "8h", "idle_time": "1h"}}},
                                               vision={"train": {"defaults": {"run_time": "2h"},
                                                                 "limits": {"run_time": "4h"}}}),
              "max_runtime": {"*": {"interactive": "24h", "train": "1h"}},
              "idle_rules": {"*": {"interactive": {"after": "30m"}}}}, discover=False)
    rule = s.max_runtime[("vision", "interactive")]
    assert (rule.after, rule.action) == (8 * 3600, "suspend")
    assert rule.source == "the maximum run time of the policy of department research for workspaces"
    assert s.max_runtime[("vision", "interactive-preemptible")].after == 8 * 3600
    assert s.max_runtime[("vision", "train")].after == 3600  # the pool's knob is tighter than the policy's 2 h
    assert s.max_runtime[("ops", "interactive")].after == 24 * 3600  # no policy there
    assert s.idle_rules[("vision", "interactive")].after == 1800  # the knob's 30 min is tighter than 1 h
    s = load({"nodes": NODES, "queues": queues(vision={"train": {"defaults": {"run_time": "2h"},
                                                                 "limits": {"run_time": "4h", "idle_time": "10m"}}})},
             discover=False)
    assert s.max_runtime[("vision", "train")].after == 7200  # the default is the run time a job gets
    assert (s.idle_rules[("vision", "train")].after, s.idle_rules[("vision", "train")].action) == (600, "requeue")


def test_fill_and_check():
    from gpupool.hub_ext.domain import policies as P
    from gpupool.hub_ext.domain.errors import APIError

    s = settings(research={"interactive": {"limits": {"gpus": 2}}},
                 vision={"train": {"defaults": {"gpus": 1, "cpu": 2, "pods": 2}, "limits": {"gpus": 4, "pods": 2}},
                         "interactive": {"defaults": {"gpu_memory": "8Gi", "preemptible": True}}})
    train, ws = s.policies["vision"]["train"], s.policies["vision"]["interactive"]
    fields = ("gpus", "gpu_memory", "cpu", "memory", "pods", "preemptible")
    assert P.fill(train, {}, fields) == {"gpus": 1, "cpu": 2, "pods": 2}
    assert P.fill(train, {"gpu_memory": 2**30, "cpu": 8}, fields) == {"pods": 2}  # memory instead of GPUs: no gpus
    assert P.fill(ws, {}, ("gpus", "gpu_memory", "preemptible")) == {"gpu_memory": 8 * 2**30, "preemptible": True}
    assert P.fill(ws, {"gpus": 0}, ("gpus", "gpu_memory")) == {}  # an explicit 0 is an answer

    def w(gpus=0.0, gpu_memory=0, pods=1):
        return SimpleNamespace(gpus=gpus, gpu_memory=gpu_memory, pods=pods)

    P.check(train, "vision", "train", w(2, pods=2))
    for args, field, words in (
            ((3, 0, 2), "gpus", "gpus: queue vision allows at most 4 GPUs per train job (asked: 2 pods x 3 GPUs) "
                                "(policy of queue vision)"),
            ((1, 0, 3), "pods", "pods: queue vision allows at most 2 pods per train job (policy of queue vision)")):
        with pytest.raises(APIError) as e:
            P.check(train, "vision", "train", w(*args))
        assert (e.value.status, e.value.field, e.value.message) == (400, field, words)
    with pytest.raises(APIError) as e:
        P.check(ws, "vision", "interactive", w(3))
    assert e.value.message == ("gpus: queue vision allows at most 2 GPUs per workspace (policy of department "
                               "research)")
    P.check(ws, "vision", "interactive", w(gpu_memory=2**30))  # a memory share counts as one GPU


def test_view_says_where_each_value_is_set():
    from gpupool.hub_ext.domain import policies as P

    s = settings(research={"*": {"limits": {"kinds": ["train", "interactive"]}}},
                 vision={"train": {"defaults": {"gpus": 1}, "limits": {"gpus": 2, "run_time": "1h"}}})
    v = P.view(s.policies["vision"]["train"])
    assert v == {"allowed": True, "refused_by": None, "defaults": {"gpus": {"value": 1.0, "set_by": "queue vision"}},
                 "limits": {"gpus": {"value": 2.0, "set_by": "queue vision"},
                            "run_time": {"value": 3600.0, "set_by": "queue vision"}}}
    assert P.view(s.policies["vision"]["inference"])["refused_by"] == "department research"


def test_the_spawn_form_offers_what_the_queues_policy_allows_and_preselects_its_defaults():
    from gpupool.spawner.form import render_form

    queues = [{"name": "vision", "deserved": {"gpu": 2}}, {"name": "ops", "deserved": {"gpu": 2}}]
    policies = {"vision": {"defaults": {"gpus": {"value": 0.5, "set_by": "queue vision"},
                                        "preemptible": {"value": True, "set_by": "queue vision"}},
                           "limits": {"gpus": {"value": 1, "set_by": "department research"}}}}
    html = render_form(queues=queues, max_gpus=4, policies=policies)
    assert '<option value="0.5" data-gpus="0.5" selected>' in html
    assert '<option value="2" data-gpus="2" disabled hidden>' in html and '<option value="1" data-gpus="1">' in html
    assert 'data-max-gpus="1.0"' in html and 'data-max-gpus="4.0"' in html  # ops: the pool's
    assert "queue vision allows at most 1 GPU per workspace (policy of department research)" in html
    assert 'name="preemptible" checked' in html
    # the user's last choice stays while the queue allows it; beyond the limit, the queue's default
    assert '<option value="1" data-gpus="1" selected>' in render_form(queues=queues, max_gpus=4, policies=policies,
                                                                      defaults={"gpus": 1, "queue": "vision"})
    assert '<option value="0.5" data-gpus="0.5" selected>' in render_form(
        queues=queues, max_gpus=4, policies=policies, defaults={"gpus": 3, "queue": "vision"})
    assert '<option value="3" data-gpus="3" selected>' in render_form(queues=queues, max_gpus=4, policies=policies,
                                                                      defaults={"gpus": 3, "queue": "ops"})
