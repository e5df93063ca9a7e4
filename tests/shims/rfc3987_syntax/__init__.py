"""Stand-in for ``rfc3987_syntax`` in test runs: the real module is loaded on first use.

jsonschema imports ``rfc3987_syntax`` when it is imported itself (for its ``iri`` format
checkers), and ``rfc3987_syntax`` builds about 35 Earley parsers as it is imported: 1.5-4 s of
CPU in every process that imports jsonschema: each JupyterHub, single-user server and papermill
run of the suite (python-jsonschema/jsonschema#1428), though no Jupyter schema has an ``iri``
format. tests/conftest.py puts this folder first on ``PYTHONPATH``, so the test run and every
process it starts get this module; it behaves as the real one, which it imports (as
``rfc3987_syntax``, replacing this one in ``sys.modules``) the first time anything of it is used.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from importlib.machinery import PathFinder
from typing import Any

_SHIMS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_real: Any = None


def _load() -> Any:
    global _real
    if _real is None:
        path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _SHIMS]
        spec = PathFinder.find_spec(__name__, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"the real {__name__} is not installed")
        module = importlib.util.module_from_spec(spec)
        sys.modules[__name__] = module  # its own submodules import from the real package
        spec.loader.exec_module(module)
        _real = module
    return _real


def is_valid_syntax(term: str, value: str) -> bool:  # what jsonschema imports
    return _load().is_valid_syntax(term, value)


def __getattr__(name: str) -> Any:
    return getattr(_load(), name)
