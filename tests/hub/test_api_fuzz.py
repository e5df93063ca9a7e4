"""The API against hostile input, through a real JupyterHub: the fuzz findings of issue 9 as
regression tests, then schemathesis generating requests from the service's own OpenAPI document.

Jobs in this hub run ``/bin/true`` instead of papermill (``c.GPUPool.job_python``): thousands of
generated submissions must not start thousands of kernels on a CI machine.
"""
from __future__ import annotations

import concurrent.futures
import json
import math

import pytest

from api_fuzzing import TRACEBACK, check_documented, fuzz_hub, operation, run_schemathesis, validator
from hub_harness import notebook

pytestmark = pytest.mark.hub

HUGE_ID = "j-" + "9" * 40


@pytest.fixture(scope="module")
def hub(tmp_path_factory, hub_leak_check_session):
    with fuzz_hub(tmp_path_factory.mktemp("fuzz")) as h:
        yield h


@pytest.fixture(scope="module")
def tokens(hub):
    return {u: hub.token(u) for u in ("alice", "bob")} | {"admin": hub.admin_token}


# ------------------------------------------------------------------ fuzz findings (issue 9)

@pytest.mark.parametrize("method,path", [("GET", f"jobs/{HUGE_ID}"), ("DELETE", f"jobs/{HUGE_ID}"),
                                         ("GET", f"jobs/{HUGE_ID}/log"), ("GET", f"jobs/{HUGE_ID}/output"),
                                         ("POST", f"jobs/{HUGE_ID}/metrics")])
def test_huge_job_ids_are_404_not_500(hub, tokens, method, path):
    r = hub.api(method, path, tokens["alice"], json={"name": "x", "value": 1} if method == "POST" else None)
    assert r.status_code == 404, r.text
    assert r.json() == {"status": 404, "message": f"no job {HUGE_ID!r}"}


@pytest.mark.parametrize("query,status,field", [
    ("limit=99999999999999999", 400, "limit"),
    ("limit=0", 400, "limit"),
    ("limit=-3", 400, "limit"),
    ("limit=ten", 400, "limit"),
    ("sweep=99999999999999999999", 200, None),
    ("name=99999999999999999999", 200, None),
    ("status=queued,bogus", 400, "status"),
])
def test_huge_and_odd_list_queries(hub, tokens, query, status, field):
    r = hub.api("GET", f"jobs?{query}", tokens["alice"])
    assert r.status_code == status, r.text
    if field:
        assert r.json()["field"] == field and r.json()["message"].startswith(f"{field}: ")
    else:
        assert r.json() == {"jobs": []}


def test_huge_log_offset_and_metric_numbers_are_400(hub, tokens):
    tok = tokens["alice"]
    r = hub.api("POST", "jobs", tok, json={"notebook_content": notebook("1")})
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    r = hub.api("GET", f"jobs/{jid}/log?offset={10**30}", tok)
    assert r.status_code == 400 and r.json()["field"] == "offset", r.text
    for body, field in (({"name": "x", "value": 1, "step": 10**30}, "step"),
                        ({"name": "x", "value": 10**400}, "value"),
                        ({"name": "x" * 300, "value": 1}, "name")):
        r = hub.api("POST", f"jobs/{jid}/metrics", tok, data=json.dumps(body))
        assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)


@pytest.mark.parametrize("field,value", [("cpu", math.nan), ("cpu", math.inf), ("gpus", math.nan),
                                         ("memory", 10**30), ("memory", math.inf), ("priority", 10**30),
                                         ("gpu_memory", 10**30), ("priority", -10**30)])
def test_a_bad_submission_never_fails_another_users_batch(hub, tokens, field, value):
    """A value that would become NULL or overflow in the database is a 400 naming it, and a valid
    submission sent at the same moment (the same group commit) is stored."""
    bad = {"notebook_content": notebook("1"), field: value}
    good = {"notebook_content": notebook("1"), "name": "innocent"}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # json.dumps writes NaN / Infinity, which Python's JSON parser (the service's) accepts
        futs = [pool.submit(hub.api, "POST", "jobs", tokens["alice"], data=json.dumps(bad),
                            headers={"Content-Type": "application/json"})]
        futs += [pool.submit(hub.api, "POST", "jobs", tokens["bob"], json=good) for _ in range(3)]
        answers = [f.result() for f in futs]
    assert answers[0].status_code == 400, answers[0].text
    assert answers[0].json()["field"] == field
    for r in answers[1:]:
        assert r.status_code == 201, r.text


def test_validation_survives_python_O():
    """Request checks are not asserts: ``python -O`` (which drops asserts) refuses the same input."""
    import subprocess
    import sys

    code = ("from gpupool.hub_ext.web import schemas as S, validation as V\n"
            "for model, data in ((S.LogQuery, {'offset': '-1'}), (S.JobListQuery, {'limit': '0'}),\n"
            "                    (S.MetricRequest, {'name': 'x', 'value': float('nan')})):\n"
            "    try:\n        V.parse(model, data)\n    except V.Invalid as e:\n        print(e.field)\n")
    res = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split() == ["offset", "limit", "value"], res


async def test_a_refused_batch_is_retried_row_by_row(tmp_path):
    """Should the database refuse a batch all the same, each request gets its own answer (the one
    at fault: the store's refusal, which the submission answers with a 503)."""
    from sqlalchemy import select

    from gpupool.hub_ext import store as D
    from gpupool.hub_ext.store.inserter import BatchInserter, Refused

    engine = D.make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    inserter = BatchInserter(engine, delay=0.01)

    def row(user: str, **kw) -> dict:
        return dict(type=D.JOB, user=user, server="", name="n", queue="q", kind="train", gpus=0.0, gpu_memory=0,
                    cpu=0.0, memory=0, priority=50, preemptible=True, checkpoint_on_signal=False, parameters={},
                    status=D.QUEUED, reason="", submitted_at=1.0, preemptions=0, restarts=0, attempt=0) | kw

    import asyncio
    futs = [inserter.insert(row("bob")), inserter.insert(row("alice", cpu=None)), inserter.insert(row("carol"))]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert isinstance(results[1], Refused) and "refused the job" in str(results[1])
    assert isinstance(results[0], int) and isinstance(results[2], int), results
    with D.make_sessionmaker(engine)() as s:
        assert sorted(r.user for r in s.scalars(select(D.Workload))) == ["bob", "carol"]
    engine.dispose()


def test_waiting_jobs_and_workspaces_carry_the_schedulers_reason_code(hub, tokens):
    """reason_code (for programs) next to reason (for people), from the core's typed reasons."""
    from gpupool import contract as C

    tok = tokens["alice"]
    r = hub.api("POST", "jobs", tok, json={"notebook_content": notebook("1"), "gpus": 2, "preemptible": False})
    assert r.status_code == 201, r.text
    assert r.json()["reason_code"] is None  # not through a cycle yet: a sentence only
    jid = r.json()["id"]
    job = hub.wait_for(lambda: (j := hub.api("GET", f"jobs/{jid}", tok).json())["reason_code"] and j, 20,
                       message=f"no reason_code: {hub.api('GET', f'jobs/{jid}', tok).text}\n"
                               f"{hub.service_log()[-3000:]}")
    assert job["status"] == C.QUEUED and job["reason_code"] == C.Code.NON_PREEMPTIBLE.value, job
    assert job["reason"] and job["reason_code"] not in job["reason"]
    listed = hub.api("GET", "jobs?status=queued", tok).json()["jobs"]
    assert [j["reason_code"] for j in listed if j["id"] == jid] == [C.Code.NON_PREEMPTIBLE.value]
    done = hub.api("DELETE", f"jobs/{jid}", tok).json()
    assert done["status"] == C.CANCELLED and done["reason_code"] is None
    svc = hub.service_token
    r = hub.api("POST", "workspaces/bob/big", svc, json={"gpus": 2, "preemptible": False})
    assert r.status_code == 201, r.text
    ws = hub.wait_for(lambda: (w := hub.api("GET", "workspaces/bob/big", svc).json())["reason_code"] and w, 20)
    assert ws["reason_code"] == C.Code.NON_PREEMPTIBLE.value, ws
    gone = hub.api("DELETE", "workspaces/bob/big", svc).json()
    assert gone["status"] == C.STOPPED and gone["reason_code"] is None


# ------------------------------------------------------------------ fuzz findings (issue 11's endpoints)

@pytest.mark.parametrize("path,field", [
    ("usage?since=0001-01-01T00:00%2B23:59", "since"),  # a date before year 1 in UTC
    ("usage?since=9999-12-31T23:59:59-23:59", "since"),  # after year 9999 in UTC
    ("usage?until=0001-01-01", "until"),  # the default since: the month before year 1
    ("usage?since=2026-11-01&until=2026-11-01", "until"),
    ("usage?by=", "by"),
    ("usage/history?since=0001-01-01T00:00%2B23:59", "since"),
    ("usage/history?until=9999-12-31T23:59:59-23:59", "until"),
    ("usage/history?gpu=%C2%B2", "gpu"),  # "²" is a digit to str.isdigit, not to int()
    ("usage/history?gpu=99999999999999999999", "gpu"),  # more than the database's integers
    ("suspensions?all=maybe", "all"),
])
def test_bad_usage_and_suspension_queries_are_400_naming_the_field(hub, tokens, path, field):
    for who in ("alice", "admin"):
        r = hub.api("GET", path, tokens[who])
        assert r.status_code == 400, (who, r.text)
        assert r.json()["field"] == field and r.json()["message"].startswith(f"{field}: "), r.text


@pytest.mark.parametrize("sid", ["99999999999999999999", "%C2%B2", "0", "x"])
def test_unknown_suspension_ids_are_404(hub, tokens, sid):
    r = hub.api("POST", f"suspensions/{sid}/resume", tokens["alice"])
    assert r.status_code == 404, r.text
    assert r.json()["message"].startswith("no suspension "), r.text


def test_the_dashboards_csv_download_refuses_dates_out_of_range(hub, tokens):
    """The dashboard's usage.csv (outside the API, not in its document) reads dates as GET usage does."""
    r = hub.session.get(hub.service_url + "usage.csv?since=0001-01-01T00:00%2B23:59",
                        headers={"Authorization": f"token {tokens['alice']}"})
    assert r.status_code == 400 and "since: must be between" in r.text, r.text[:300]


# ------------------------------------------------------------------ schemathesis

FUZZ_CASES = 1200  # generated requests in make test (benchmarks/api_fuzz.py runs 10,000)


def test_schemathesis_no_5xx_and_every_answer_as_documented(hub, tokens):
    per_op: dict[str, dict[str, int]] = {}
    counts = run_schemathesis(hub, tokens, FUZZ_CASES, per_operation=per_op)
    print("schemathesis answers by status:", counts)
    print("by operation:", json.dumps(per_op, sort_keys=True))
    total = sum(counts.values())
    assert total >= 1000, counts
    assert not any(code.startswith("5") for code in counts), counts
    assert counts.get("200", 0) + counts.get("201", 0) > 50, counts  # not only refusals
    assert TRACEBACK not in hub.service_log()
    # every operation of the document was fuzzed, issue 11's too, and those that take input answered
    # a valid request as well as refusing invalid ones
    doc = hub.api("GET", "openapi.json").json()
    # (schemathesis leaves out the URL it loaded the document from)
    documented = {f"{m.upper()} {p}" for p, ops in doc["paths"].items() for m in ops} - {"GET /openapi.json"}
    assert documented == set(per_op) and {"GET /usage", "GET /usage/history", "GET /suspensions",
                                          "POST /suspensions/{suspension_id}/resume"} <= documented, per_op
    for op in ("GET /usage", "GET /usage/history", "GET /suspensions"):
        assert per_op[op].get("200", 0) > 0 and per_op[op].get("400", 0) > 0, (op, per_op[op])


# ------------------------------------------------------------------ the client against the document

def test_python_client_requests_and_answers_match_the_document(hub, tokens):
    """Every request gpupool.client sends (and the spawner's workspace body) is one the document
    describes, and every answer it reads validates against the document."""
    import requests
    from urllib.parse import parse_qsl, urlsplit

    from gpupool.client.api import Client, GPUPoolError
    from gpupool.client.jobs import build_body
    from gpupool.spawner.form import GPURequest

    doc = hub.api("GET", "openapi.json").json()
    assert doc["openapi"].startswith("3.1") and "/jobs" in doc["paths"]
    prefix = urlsplit(hub.api_url).path.rstrip("/")
    assert doc["servers"] == [{"url": prefix}]
    seen: list[tuple[requests.PreparedRequest, requests.Response]] = []

    class Recording(requests.Session):
        def send(self, request, **kw):
            resp = super().send(request, **kw)
            seen.append((request, resp))
            return resp

    alice = Client(hub.api_url, tokens["alice"], session=Recording())
    admin = Client(hub.api_url, tokens["admin"], session=Recording())
    job = alice.submit(build_body(notebook_content=notebook("1"), gpus=0.5, parameters={"lr": 0.1}, name="c",
                                  kind="hpo-trial", sweep="s-1", priority=3, preemptible=True, memory="1Gi", cpu=1))
    alice.jobs(status="queued,running", sweep="s-1", limit=5)
    alice.job(job["id"])
    alice.log(job["id"], offset=0)
    alice.post_metric(job["id"], "acc", 0.5, step=1)
    alice.cancel(job["id"])
    for call in (lambda: alice.output(job["id"]), lambda: alice.job("j-" + "9" * 40),
                 lambda: alice.submit({"notebook_content": notebook("1"), "gpus": "two"})):
        try:
            call()
        except GPUPoolError:
            pass
    alice.queues(), alice.nodes(), alice.workspaces(), alice.health()
    # gpupool report (gpupool/client/report.py): JSON and CSV
    report = {"since": "2026-11-01", "until": "2026-12-01T08:00Z", "by": "queue", "queue": "vision"}
    alice.get("usage", params=report)
    alice.request("GET", "usage", params={**report, "format": "csv"}, raw=True)
    admin.get("usage", params={"since": "2026-11-01", "by": "week", "user": "alice"})
    body = GPURequest(gpus=1, queue="vision").body("")
    admin.request("POST", "workspaces/alice", json_body=body)
    admin.request("GET", "workspaces/alice")
    admin.request("GET", "suspensions", params={"user": "alice"})  # the spawner's, at a start
    admin.request("DELETE", "workspaces/alice")
    assert len(seen) >= 19

    for request, resp in seen:
        url = urlsplit(request.url)
        op = operation(doc, request.method, url.path[len(prefix):])
        if request.body:
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            errors = list(validator(doc, schema).iter_errors(json.loads(request.body)))
            # a body the service took is one the document describes; the deliberately wrong one is not
            assert bool(errors) == (resp.status_code == 400), (request.method, url.path, errors[:1])
        params = {p["name"]: p for p in op["parameters"] if p["in"] == "query"}
        for name, value in parse_qsl(url.query):
            assert name in params, (url.path, name)
            typed = int(value) if params[name]["schema"].get("type") == "integer" else value
            assert not list(validator(doc, params[name]["schema"]).iter_errors(typed)), (name, value)
        check_documented(doc, resp)


@pytest.mark.parametrize("body,field", [('{"notebook_content": %s, "name": "\\ud800"}', "name"),
                                        ('{"notebook_content": %s, "parameters": {"x": "\\udfff"}}', "parameters")])
def test_lone_surrogates_are_400_naming_the_field(hub, tokens, body, field):
    """JSON may escape text no database can store; that is the request's fault, not the database's."""
    r = hub.api("POST", "jobs", tokens["alice"], data=body % json.dumps(notebook("1")),
                headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["field"] == field, r.text
    r = hub.api("GET", "jobs?name=%ED%A0%80", tokens["alice"])  # the same as UTF-8 bytes in a query
    assert r.status_code == 400 and r.json()["status"] == 400, r.text
