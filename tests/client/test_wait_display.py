"""What ``job.wait()`` shows (gpupool/client/progress.py): in a notebook one ipywidgets HTML line
that updates in place and wraps (the id whole, the reason in full), in a terminal a plain line per
change. A job whose states come from a stand-in client, as the service would give them."""
from __future__ import annotations

import io
import re

import pytest

from gpupool.client import progress
from gpupool.client.jobs import Job

REASON = ("queued in vision: position 2, waiting for 0.5 GPU; vision holds 4 of its 4 deserved GPUs and no idle GPU "
          "can be borrowed from nlp, whose jobs use all of theirs (the next cycle looks again in 1 s)")
STATES = [{"status": "queued", "reason": REASON}, {"status": "queued", "reason": REASON},
          {"status": "running", "reason": "running on box GPU 0 (0.5)"},
          {"status": "succeeded", "reason": "the notebook ran to the end"}]


class Client:
    """Answers ``job(id)`` with the next state of STATES (the last one once they run out)."""

    def __init__(self):
        self.states = list(STATES)

    def job(self, job_id):
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return {"id": job_id, "name": "train", "gpus": 0.5, **state}


def test_in_a_notebook_one_widget_updates_in_place_wraps_and_keeps_the_end(monkeypatch):
    shown, values = [], []
    monkeypatch.setattr("IPython.display.display", lambda w: shown.append(w))
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    real_show = progress.Progress.show

    def record(self, status, text):
        real_show(self, status, text)
        values.append(self.widget.value)
    monkeypatch.setattr(progress.Progress, "show", record)
    job = Job({"id": "j-000015", "status": "queued"}, client=Client())
    assert job.wait(poll=0.01) is job and job.status == "succeeded"
    assert len(shown) == 1  # one widget, updated in place
    widget = shown[0]
    first = values[0]
    # the id is never split across lines; the reason is there in full and wraps to the cell's width
    assert '<b class="gpupool-wait-title" style="white-space:nowrap">j-000015</b>' in first
    assert REASON in first and "white-space:normal;overflow-wrap:anywhere" in first
    assert 'data-status="queued"' in first and widget.layout.width == "100%"
    assert 'data-status="running"' in values[2] and "box GPU 0 (0.5)" in values[2]
    assert 'data-status="succeeded"' in widget.value and "ran to the end" in widget.value  # the end stays


def test_in_a_terminal_a_plain_line_per_change(monkeypatch):
    monkeypatch.setattr(progress, "in_notebook", lambda: False)
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    Job({"id": "j-000015", "status": "queued"}, client=Client()).wait(poll=0.01)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines  # queued (once, not at every poll), running, succeeded
    assert re.fullmatch(rf"\[0:00\] j-000015 {re.escape(REASON)}", lines[0])
    assert lines[1].endswith("j-000015 running on box GPU 0 (0.5)")  # the status said once
    assert lines[2].endswith("j-000015 succeeded: the notebook ran to the end")
    assert "\r" not in out.getvalue()


def test_progress_false_shows_nothing(monkeypatch, capsys):
    monkeypatch.setattr(progress, "in_notebook", lambda: pytest.fail("asked where it runs"))
    Job({"id": "j-000015", "status": "queued"}, client=Client()).wait(poll=0.01, progress=False)
    assert capsys.readouterr() == ("", "")


def test_a_title_in_the_text_is_said_once():
    out = io.StringIO()
    bar = progress.Progress("sweep lr", notebook=False, stream=out)
    bar.show("running", "sweep lr running: 2/4 trials done, 1 active")
    assert out.getvalue().strip() == "[0:00] sweep lr running: 2/4 trials done, 1 active"


@pytest.mark.browser
def test_the_line_wraps_in_a_narrow_cell_and_keeps_the_id_on_one_line():
    """The notebook line in headless Chromium, in an output area 360 px wide: nothing is cut at
    the edge, the id stays on one line, the reason wraps onto several."""
    from browser_harness import chromium
    from gpupool.widgets.render import wait_html

    html = wait_html("j-000015", "queued", REASON, "0:12")
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 800, "height": 600})
        page.set_content(f'<div id="cell" style="width:360px;overflow:hidden">{html}</div>')
        box = page.evaluate("""() => {
            const r = e => document.querySelector(e).getBoundingClientRect();
            const line = parseFloat(getComputedStyle(document.querySelector('.gpupool-reason')).lineHeight);
            return {cell: r('#cell').right, width: document.querySelector('#cell').clientWidth, title: r('.gpupool-wait-title').height, line,
                    reason: r('.gpupool-reason').height, right: Math.max(r('.gpupool-reason').right,
                    r('.gpupool-wait-title').right), scroll: document.querySelector('#cell').scrollWidth}}""")
    assert box["title"] <= box["line"] * 1.2  # j-000015 on one line
    assert box["reason"] >= 3 * box["line"] * 0.9  # the long reason wraps onto several lines
    assert box["right"] <= box["cell"] + 1 and box["scroll"] <= box["width"]  # nothing past the edge
