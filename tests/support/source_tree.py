"""Parsing the project's own source in tests (``ast.parse``), safe from CPython 3.11's spurious
``SystemError: AST constructor recursion depth mismatch`` (an interpreter bug, fixed in later
releases): a garbage collection that runs Python code (a finaliser, such as an asyncio transport
left by an earlier test on the same worker) while the tree is being built corrupts the depth
count. Pending finalisers run first, and the collector is paused while the tree is built."""
from __future__ import annotations

import ast
import gc


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename)
    finally:
        if was:
            gc.enable()
