"""The OpenAPI document (``GET api/v1/openapi.json``) is what clients are generated from: a change
to it must be deliberate. It is compared with the committed copy in tests/hub/fixtures/openapi.json;
regenerate that file (see below) only for a change you mean, and say so in the commit.

    .venv/bin/python -c "import tests.test_openapi_document as t; t.regenerate()"
"""
from __future__ import annotations

import json
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "openapi.json"
SERVER, QUEUES = "/services/gpupool/api/v1", ("cv", "nlp")


def current() -> dict:
    from gpupool.hub_ext.web.openapi import document

    doc = document(SERVER, QUEUES)
    doc["info"]["version"] = "(version)"  # the package's version is not part of the API's shape
    return doc


def regenerate() -> None:
    FIXTURE.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")


def test_the_openapi_document_is_the_committed_one():
    want = json.loads(FIXTURE.read_text())
    got = json.loads(json.dumps(current()))
    assert set(got["paths"]) == set(want["paths"])
    for path in want["paths"]:
        assert got["paths"][path] == want["paths"][path], path
    assert set(got["components"]["schemas"]) == set(want["components"]["schemas"])
    for name in want["components"]["schemas"]:
        assert got["components"]["schemas"][name] == want["components"]["schemas"][name], name
    assert got == want
