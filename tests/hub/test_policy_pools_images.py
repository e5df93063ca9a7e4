"""Workload policies that limit node pools and images (hub_ext/domain/policies.py): parsed, a child
may only tighten its parent, a request naming another pool or image is refused naming the rule,
one naming no pool runs only in the allowed ones; the spawn page offers only the pools a queue
may use (quota and policy) and carries the choice to the workspace's ``pools``. Through the real
hub: test_hub_policy_pools.py."""
from __future__ import annotations

import pytest

NODES = [{"name": "small", "gpus": 4, "gpu_memory": "24Gi", "pool": "build"},
         {"name": "big", "gpus": 8, "gpu_memory": "80Gi", "pool": "train"},
         {"name": "old", "gpus": 2, "gpu_memory": "16Gi", "pool": "teach"}]


def queues(research=None, vision=None):
    out = [{"name": "research", "deserved": {"gpu": 4}},
           {"name": "vision", "parent": "research", "deserved": {"gpu": 2}, "users": ["alice"]},
           {"name": "nlp", "parent": "research", "deserved": {"gpu": 2}, "users": ["alice"]}]
    for entry, policy in zip(out, (research, vision)):
        if policy is not None:
            entry["policy"] = policy
    return out


def check(**policies):
    from gpupool.hub_ext.config import check as check_config

    return check_config({"nodes": NODES, "queues": queues(**policies)}, discover=False)[0]


def service(**more):
    """The service's submissions (domain/submission.py) over these nodes and policies."""
    from gpupool.hub_ext.config import load
    from gpupool.hub_ext.domain.access import QueueAccess
    from gpupool.hub_ext.domain.submission import Submissions

    settings = load({"nodes": NODES, "queues": queues(**more.pop("policies", {})), **more}, discover=False)
    return Submissions(settings, None, QueueAccess(settings), None, None)


def resources(subs, kind="train", **request):
    from gpupool.hub_ext.web import schemas as S

    model = S.WorkspaceRequest if kind == "interactive" else S.JobRequest
    return subs.resources(model(**request), "vision", kind, "alice")


RESEARCH = {"*": {"limits": {"pools": ["build", "train"]}}, "interactive": {"limits": {"images": ["quay.io/jupyter/*"]}}}


def test_pools_and_images_resolve_with_where_they_are_set():
    from gpupool.hub_ext.web.policies import effective

    subs = service(policies={"research": RESEARCH, "vision": {"interactive": {"limits": {"pools": ["build"]}}}})
    doc = effective(subs.settings, "vision")["kinds"]
    assert doc["interactive"]["limits"]["pools"] == {"value": ["build"], "set_by": "queue vision"}
    assert doc["interactive"]["limits"]["images"] == {"value": ["quay.io/jupyter/*"], "set_by": "department research"}
    assert doc["train"]["limits"]["pools"] == {"value": ["build", "train"], "set_by": "department research"}
    assert "images" not in doc["train"]["limits"]
    assert "pools" in effective(subs.settings, "nlp")["kinds"]["train"]["limits"]  # inherited


@pytest.mark.parametrize("vision, words", [
    ({"train": {"limits": {"pools": ["build", "teach"]}}},
     "c.GPUPool.queues[1] (vision).policy.train.limits.pools: build, teach is looser than the build, train of the "
     "policy of department research (a queue may only tighten its parent's policy)"),
    ({"interactive": {"limits": {"images": ["docker.io/*"]}}},
     "c.GPUPool.queues[1] (vision).policy.interactive.limits.images: docker.io/* is looser than the quay.io/jupyter/* "
     "of the policy of department research (a queue may only tighten its parent's policy)"),
    ({"*": {"limits": {"pools": "build"}}}, "c.GPUPool.queues[1] (vision).policy.*.limits.pools: must be a list of "
                                           "node pool names"),
    ({"*": {"limits": {"images": []}}}, "c.GPUPool.queues[1] (vision).policy.*.limits.images: must be a list of "
                                       "image names or patterns such as 'quay.io/jupyter/*'"),
    ({"*": {"limits": {"pools": ["train"]}}, "interactive": {"limits": {"pools": ["build"]}}},
     "c.GPUPool.queues[1] (vision).policy.interactive.limits.pools: queue vision is left no pool for workspaces "
     "(the lists of '*' and interactive have none in common)"),
    ({"*": {"limits": {"pools": ["biuld"]}}}, "c.GPUPool.queues[1] (vision).policy.*.limits.pools: no node is in "
                                             "pool 'biuld' (the pools: build, teach, train)"),
])
def test_a_child_that_loosens_or_a_bad_entry_is_refused_by_the_check(vision, words):
    errs = check(research=RESEARCH, vision=vision)
    assert words in errs, errs


def test_tighter_images_and_pools_pass_the_check():
    assert check(research=RESEARCH, vision={"*": {"limits": {"pools": ["train"]}},
                                            "interactive": {"limits": {"images": [
                                                "quay.io/jupyter/scipy-notebook:2025-01-01", "quay.io/jupyter/r*"]}}}) == []


def test_a_request_for_a_pool_or_image_the_policy_does_not_allow_is_refused_naming_the_rule():
    from gpupool.hub_ext.domain.errors import APIError
    from gpupool.hub_ext.domain.policies import check_image

    subs = service(policies={"research": RESEARCH, "vision": {"interactive": {"limits": {"pools": ["build"]}}}})
    with pytest.raises(APIError) as e:
        resources(subs, gpus=1, pools=["teach"])
    assert (e.value.status, e.value.field) == (400, "pools")
    assert e.value.message == ("pools: queue vision may not use pool 'teach' for train jobs (allowed: build, train; "
                               "policy of department research)")
    with pytest.raises(APIError) as e:
        resources(subs, "interactive", gpus=1, pools=["train"])
    assert e.value.message == ("pools: queue vision may not use pool 'train' for workspaces (allowed: build; "
                               "policy of queue vision)")
    # allowed: as asked; none asked: only the allowed pools (those that hold the request)
    assert resources(subs, gpus=1, pools=["train", "build"]).pools == ("train", "build")
    assert resources(subs, gpus=1).pools == ("build", "train")
    assert resources(subs, gpus=6).pools == ("train",)  # build's node has 4 GPUs
    assert resources(subs, "interactive", gpus=1).pools == ("build",)
    with pytest.raises(APIError) as e:
        resources(subs, "interactive", gpus=8)
    assert e.value.message == "gpus: no node in the pools this queue may use (build) has 8 GPUs"
    # without a policy on pools: any pool, the core's choice
    assert resources(service(), gpus=1).pools == ()
    # images: a name or a pattern of the list
    eff = subs.policy("vision", "interactive")
    check_image(eff, "vision", "interactive", "quay.io/jupyter/scipy-notebook:latest")
    check_image(eff, "vision", "interactive", None)  # no image named (the local spawner): nothing to check
    with pytest.raises(APIError) as e:
        check_image(eff, "vision", "interactive", "docker.io/me/miner:latest")
    assert (e.value.field, e.value.message) == ("image", (
        "image: queue vision does not allow image 'docker.io/me/miner:latest' for workspaces (allowed: "
        "quay.io/jupyter/*; policy of department research)"))


def test_a_policy_restricts_the_kinds_pool_preference():
    subs = service(policies={"research": RESEARCH},
                   pool_preference={"train": ["teach", "train", "build"]})
    assert resources(subs, gpus=1).pools == ("train", "build")  # the preference, less teach


def test_the_spawn_form_offers_the_pools_each_queue_may_use_and_carries_the_choice():
    from gpupool.spawner.form import options_from_form, parse_user_options, render_form

    pools = {"build": {"free": 3, "queued": 1, "deserved": {"gpu": 1}},
             "train": {"free": 8, "queued": 0, "deserved": {"gpu": 1}},
             "teach": {"free": 2, "queued": 0, "deserved": {"gpu": 0}, "limit": {"gpu": 0}, "may_use": False}}
    qs = [{"name": "vision", "deserved": {"gpu": 2}, "pools": pools},
          {"name": "nlp", "deserved": {"gpu": 2}, "pools": pools}]
    policies = {"vision": {"limits": {"pools": {"value": ["build"], "set_by": "queue vision"}}}}
    html = render_form(queues=qs, max_gpus=4, policies=policies)
    assert '<option value="build" data-queues="vision nlp">build: 3 GPUs free, 1 waiting</option>' in html
    # train: nlp only (vision's policy), and vision is the queue shown first; teach: no quota for anyone
    assert '<option value="train" data-queues="nlp" disabled hidden>train: 8 GPUs free, 0 waiting</option>' in html
    assert 'value="teach"' not in html
    assert '<option value="" selected>any: the pools the queue prefers for workspaces</option>' in html
    # the last choice is pre-selected while the queue may use it
    assert '<option value="train" data-queues="nlp" selected>' in render_form(
        queues=qs, max_gpus=4, policies=policies, defaults={"queue": "nlp", "pool": "train"})
    assert '<option value="" selected>' in render_form(queues=qs, max_gpus=4, policies=policies,
                                                      defaults={"queue": "vision", "pool": "train"})
    # a form with one pool, or none: no menu
    assert 'name="pool"' not in render_form(queues=[{"name": "ops", "deserved": {"gpu": 2}}], max_gpus=4)
    # the choice goes into user_options, then into the workspace request's pools
    opts = options_from_form({"gpus": ["1"], "queue": ["nlp"], "pool": ["train"]})
    assert opts == {"gpus": "1", "queue": "nlp", "pool": "train", "preemptible": False}
    req = parse_user_options(opts, queues=["vision", "nlp"])
    assert req.pools == ("train",) and req.body()["pools"] == ["train"]
    assert "pools" not in parse_user_options({"gpus": 1, "pool": ""}).body()
    from gpupool.spawner.form import OptionError

    with pytest.raises(OptionError, match="pool: must be the name of a node pool"):
        parse_user_options({"gpus": 1, "pool": 3})


def test_the_kube_spawner_sends_the_image_its_profile_chooses():
    from gpupool.spawner.form import GPURequest
    from gpupool.spawner.kube import profile_image

    profile = {"slug": "gpu", "kubespawner_override": {"image": "quay.io/jupyter/base-notebook"},
               "profile_options": {"image": {"display_name": "Image", "choices": {
                   "torch": {"display_name": "PyTorch", "default": True,
                             "kubespawner_override": {"image": "quay.io/jupyter/pytorch-notebook"}},
                   "plain": {"display_name": "plain"}},
                   "unlisted_choice": {"enabled": True, "kubespawner_override": {"image": "{value}"}}}}}
    assert profile_image(profile, {}) == "quay.io/jupyter/pytorch-notebook"  # the default choice
    assert profile_image(profile, {"image": "plain"}) == "quay.io/jupyter/base-notebook"  # the profile's
    assert profile_image(profile, {"image--unlisted-choice": "docker.io/me/miner"}) == "docker.io/me/miner"
    assert profile_image({"slug": "cpu"}, {}) is None
    assert GPURequest(gpus=1, image="quay.io/x").body()["image"] == "quay.io/x"


def test_a_suspended_workspace_limited_to_one_pool_resumes_in_it():
    from types import SimpleNamespace

    from gpupool.hub_ext.domain.idle_rules import start_options

    row = SimpleNamespace(queue="vision", preemptible=False, gpu_memory=0, gpus=1.0, pools=["train"])
    assert start_options(row) == {"queue": "vision", "preemptible": False, "gpus": 1.0, "pool": "train"}
    row.pools = ["build", "train"]  # the kind's preference: the service decides again
    assert "pool" not in start_options(row)
