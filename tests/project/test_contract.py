"""gpupool/contract.py: the facts that cross the API boundary, defined once."""
from __future__ import annotations

import re
from pathlib import Path

from gpupool import contract as C
from gpupool.scheduler.model import KINDS
from gpupool.scheduler.reasons import Code, Pending

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = ["gpupool", "hub_ext", "spawner", "widgets"]


def test_ids_round_trip_and_refuse_what_no_row_can_be():
    assert C.public_id(C.JOB, 42) == "j-000042" and C.public_id(C.WORKSPACE, 7) == "w-000007"
    assert C.parse_public_id("j-000042") == (C.JOB, 42) and C.parse_public_id("w-7") == (C.WORKSPACE, 7)
    for bad in ("j-" + "9" * 19, "j-", "x-1", "j-1a", "j--1", "", "j-٣"):
        assert C.parse_public_id(bad) is None, bad
    assert re.fullmatch(C.JOB_ID_PATTERN, "j-" + "9" * 18) and not re.fullmatch(C.JOB_ID_PATTERN, "j-" + "9" * 19)


def test_kinds_and_codes_are_the_cores():
    assert C.KINDS is KINDS and C.INTERACTIVE not in C.JOB_KINDS and set(C.JOB_KINDS) | {C.INTERACTIVE} == set(KINDS)
    assert C.Code is Code and C.REASON_CODES == tuple(c.value for c in Code)
    assert C.reason_code(Pending(Code.LIMIT, "q")) == "limit" and C.reason_code("a sentence") is None


def test_quantities_allocations_and_errors_in_words():
    assert [C.format_gpus(x) for x in (0, None, 0.5, 1, 2)] == [
        "0 GPUs (CPU only)", "0 GPUs (CPU only)", "0.5 GPU", "1 GPU", "2 GPUs"]
    assert C.format_bytes(8 * 2**30) == "8Gi" and C.format_request(gpu_memory="8Gi") == "8Gi of one GPU"
    assert C.format_request(gpus=0.5) == "0.5 GPU"
    alloc = [{"node": "box", "gpus": [0, 1], "fraction": 1.0}, {"node": "b2", "gpus": [3], "fraction": 0.5}]
    assert C.describe_allocation(alloc) == "box GPU 0,1; b2 GPU 3 (0.5)"
    assert C.allocation_to_api(C.allocation_from_api(alloc)) == alloc and C.describe_allocation(None) == ""
    assert C.error_payload(400, "gpus: bad", "gpus") == {"status": 400, "message": "gpus: bad", "field": "gpus"}
    assert C.read_error(C.error_payload(404, "no job")) == ("no job", None) and C.read_error("x") == (None, None)


def test_no_adapter_declares_statuses_kinds_or_formatters_again():
    """The grep of issue 9's "done when": one definition of each status, kind and formatter."""
    patterns = {
        "a status list": r'"succeeded",\s*"failed"|"queued",\s*"starting"|"running",\s*"preempting"',
        "a kind list": r'"train",\s*"hpo-trial"|"hpo-trial",\s*"inference"',
        "a byte formatter": r'\("Gi",\s*2\s*\*\*\s*30\)',
        "a GPU-count formatter": r'GPU"\s*\+\s*\(\s*"s"|GPU\{\'s\'',
        "a usage grouping list": r'"queue",\s*"department"|"day",\s*"week",\s*"month"',
    }
    found = []
    for top in ADAPTERS:
        for path in (ROOT / top).rglob("*.py"):
            if path.name == "contract.py" or "sim" in path.parts:
                continue
            text = path.read_text()
            found += [f"{path.relative_to(ROOT)}: {what}" for what, rx in patterns.items() if re.search(rx, text)]
    assert not found, found
