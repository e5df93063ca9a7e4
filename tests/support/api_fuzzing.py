"""Fuzzing the REST API with schemathesis from its own OpenAPI document (tests/hub/test_api_fuzz.py,
benchmarks/api_fuzz.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hub_harness import Hub

# Jobs run /bin/true instead of papermill: thousands of generated submissions must not start
# thousands of kernels.
SETTINGS = {"queues": [{"name": "vision", "deserved": {"gpu": 1}, "users": ["alice"]},
                       {"name": "nlp", "deserved": {"gpu": 1}, "users": ["bob"]}],
            "nodes": [{"name": "box", "gpus": 2, "gpu_memory": "16Gi"}],
            "job_python": "/bin/true", "workspace_reconcile_seconds": 0}


# what a Python traceback starts with in the service's log (generated URLs may hold the word itself)
TRACEBACK = "Traceback (most recent call last)"


def fuzz_hub(tmp: Path) -> Hub:
    """A hub with users alice and bob (one queue each) and an admin."""
    return Hub(tmp, users=["alice", "bob"], admins=["admin"], gpupool=SETTINGS)


def run_schemathesis(hub: Hub, tokens: dict[str, str], total: int, seed: int = 9,
                     per_operation: dict[str, dict[str, int]] | None = None) -> dict:
    """Requests generated from ``GET api/v1/openapi.json`` (valid and invalid ones, in equal parts)
    with the tokens of two users and an admin in turn, every answer checked: no 5xx, and status,
    content type, headers and body as the document says. Returns counts by status (and fills
    ``per_operation``: ``"GET /usage"`` -> counts by status); raises on the first failure."""
    import requests
    import schemathesis
    from schemathesis import checks as K

    schema = schemathesis.openapi.from_url(hub.proxy_api_url + "openapi.json")  # through the hub's proxy
    operations = [r.ok() for r in schema.get_all_operations()]
    who = sorted(tokens)
    session = requests.Session()
    counts: dict[str, int] = {}
    checks = [K.not_a_server_error, K.status_code_conformance, K.content_type_conformance,
              K.response_headers_conformance, K.response_schema_conformance]
    # operations with little input (health) run out of distinct cases early: passes with new seeds
    # over the operations that still had cases to give, until the total is reached
    active = operations
    for round_ in range(MAX_ROUNDS):
        missing = total - sum(counts.values())
        if missing <= 0:
            break
        per_op = max(1, -(-missing // (2 * len(active))))
        made = _round(active, per_op, seed + round_, who, tokens, session, checks, counts,
                      per_operation if per_operation is not None else {})
        active = [op for op, n in zip(active, made) if n >= per_op] or active  # half of what was asked
    return counts


MAX_ROUNDS = 30


def _round(operations: list, per_op: int, seed: int, who: list[str], tokens: dict[str, str], session: Any,
           checks: list, counts: dict[str, int], per_operation: dict[str, dict[str, int]]) -> list[int]:
    """One pass: ``per_op`` valid and ``per_op`` invalid requests per operation; returns how many
    requests each operation made (fewer when it ran out of distinct cases)."""
    from hypothesis import HealthCheck, Phase, given, seed as hseed, settings, strategies as st
    from hypothesis.errors import Unsatisfiable
    from schemathesis.generation import GenerationMode

    made = []
    for op in operations:
        before = sum(counts.values())
        mine = per_operation.setdefault(f"{op.method.upper()} {op.path}", {})
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @hseed(seed)
            @settings(max_examples=per_op, deadline=None, database=None, derandomize=False,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode), user=st.sampled_from(who))
            def one(case, user):
                headers = {"Authorization": f"token {tokens[user]}"}
                resp = case.call(session=session, headers=headers, timeout=30)
                case.validate_response(resp, checks=checks, headers=headers)
                key = f"{resp.status_code}"
                counts[key] = counts.get(key, 0) + 1
                mine[key] = mine.get(key, 0) + 1

            try:
                one()
            except Unsatisfiable:  # no invalid request exists (an operation without input)
                assert mode is GenerationMode.NEGATIVE, op.label
        made.append(sum(counts.values()) - before)
    return made


# ------------------------------------------------------------------ answers against the document

def validator(doc: dict, schema: dict) -> Any:
    """A JSON Schema validator for ``schema``, whose references point into ``doc``'s components."""
    import jsonschema

    return jsonschema.Draft202012Validator({**schema, "components": doc["components"]})


def operation(doc: dict, method: str, path: str) -> dict:
    """The document's operation for ``method`` on ``path`` (relative to the API, e.g. ``/jobs/j-1``)."""
    import re

    for template, ops in doc["paths"].items():
        if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path) and method.lower() in ops:
            return ops[method.lower()]
    raise AssertionError(f"{method} {path}: not in the OpenAPI document")


def check_documented(doc: dict, resp: Any) -> None:
    """The service's answer ``resp`` (a requests.Response) is one the document describes: its
    status, its media type and, for JSON, its body."""
    from urllib.parse import urlsplit

    path = urlsplit(resp.request.url).path
    prefix = doc["servers"][0]["url"].rstrip("/")
    assert path.startswith(prefix), (path, prefix)
    method = resp.request.method
    answer = operation(doc, method, path[len(prefix):].rstrip("/") or "/")["responses"].get(str(resp.status_code))
    assert answer is not None, (method, path, resp.status_code, resp.text[:300])
    media = resp.headers["Content-Type"].split(";")[0]
    assert media in answer["content"], (method, path, media, list(answer["content"]))
    if media == "application/json":
        errors = list(validator(doc, answer["content"][media]["schema"]).iter_errors(resp.json()))
        assert not errors, (method, path, resp.status_code, errors[0].message, errors[0].json_path)
