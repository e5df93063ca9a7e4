"""The cells of `gpupool list`: where a workload runs, in words, and a long reason cut at a word."""
from gpupool.client.cli import _alloc, _cut


def test_the_on_column_says_where_in_words():
    job = {"allocation": [{"node": "box", "gpus": [0, 2], "fraction": 1.0},
                          {"node": "b2", "gpus": [3], "fraction": 0.5}]}
    assert _alloc(job) == "box GPU 0,2; b2 GPU 3 (0.5)"
    assert _alloc({"allocation": []}) == "" and _alloc({}) == ""


def test_a_long_reason_is_cut_at_a_word_and_says_so():
    reason = "queued in vision: position 3, waiting for 2 GPUs: 0 free in the cluster; vision holds 4 GPUs and " \
             "this would take it above its fair share of 4 GPUs"
    cell = _cut(reason, 60)
    assert len(cell) <= 60 and cell.endswith("…") and reason.startswith(cell[:-1])
    assert reason[len(cell) - 1] in " ,;:" or reason[len(cell):len(cell) + 1] == " "  # ends on a word
    assert _cut("short", 60) == "short"
