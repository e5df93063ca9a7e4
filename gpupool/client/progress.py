"""What ``job.wait()`` and ``sweep.wait()`` show while they wait: in a notebook, one ipywidgets
HTML line that updates in place and wraps (the id whole, the status as a badge, the reason in
full, the time waited); in a terminal, a plain line each time the status or reason changes."""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def in_notebook() -> bool:
    """Whether this code runs in a Jupyter kernel that can show widgets."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        return getattr(get_ipython(), "kernel", None) is not None
    except ImportError:  # pragma: no cover - ipykernel brings IPython
        return False


def _elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """``show(status, text)`` as often as wanted; ``close()`` at the end (the last state stays)."""

    def __init__(self, title: str, *, notebook: bool | None = None, stream: TextIO | None = None):
        self.title = title
        self.started = time.monotonic()
        self.widget: Any = None
        self.stream = stream if stream is not None else sys.stderr
        self._last: tuple[str, str] | None = None
        if in_notebook() if notebook is None else notebook:
            import ipywidgets as w
            from IPython.display import display

            self.widget = w.HTML(layout=w.Layout(width="100%"))
            self.widget.add_class("gpupool-wait")
            display(self.widget)

    def show(self, status: str, text: str) -> None:
        elapsed = _elapsed(time.monotonic() - self.started)
        if text.startswith(self.title + " "):  # said once, as the title
            text = text[len(self.title) + 1:]
        if self.widget is not None:
            from gpupool.widgets.render import wait_html

            self.widget.value = wait_html(self.title, status, text, elapsed)
        elif (status, text) != self._last:  # a terminal: a line per change, never rewritten
            print(f"[{elapsed}] {self.title} {text if text.startswith(status) else f'{status}: {text}'}",
                  file=self.stream, flush=True)
        self._last = (status, text)

    def close(self) -> None:
        """The widget keeps its last state (the job's end) in the notebook."""
        self.widget = None
