"""The ``gpupool`` command. Each subcommand lives in its own module and registers itself through
``register(subparsers)``; modules are imported lazily so ``gpupool simulate`` never imports the hub.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# module path -> the subcommands it provides (for lazy import)
COMMAND_MODULES = {
    "gpupool.sim.cli": ("simulate",),
    "gpupool.client.cli": ("login", "submit", "list", "describe", "logs", "output", "delete", "queues", "top", "sweep", "nodes",
                           "node"),
    "gpupool.client.report": ("report",),
    "gpupool.client.policy": ("policy",),
    "gpupool.hub_ext.cli": ("hub",),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="gpupool", description="gpupool: a fair-share GPU pool for JupyterHub")
    parser.add_argument("--version", action="version", version=f"gpupool {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module, commands in COMMAND_MODULES.items():
        if only is not None and only not in commands:
            continue
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        mod.register(sub)
    return parser


# Options every client subcommand takes; accepted before the command too (`gpupool --url U list`).
GLOBAL_OPTIONS = {"--url": True, "--token": True, "--json": False}


def _hoist_globals(argv: list[str]) -> list[str]:
    """Move global options written before the subcommand to just after it."""
    lead: list[str] = []
    i = 0
    while i < len(argv) and argv[i].split("=", 1)[0] in GLOBAL_OPTIONS:
        takes_value = GLOBAL_OPTIONS[argv[i].split("=", 1)[0]] and "=" not in argv[i]
        lead.extend(argv[i:i + 1 + takes_value])
        i += 1 + takes_value
    if not lead or i >= len(argv):
        return argv
    return [argv[i], *lead, *argv[i + 1:]]


def main(argv: list[str] | None = None) -> int:
    argv = _hoist_globals(sys.argv[1:] if argv is None else list(argv))
    first = next((a for a in argv if not a.startswith("-")), None)
    known = {c for cmds in COMMAND_MODULES.values() for c in cmds}
    only = first if first in known else ("--version" if argv[:1] == ["--version"] else None)
    parser = build_parser(only)  # only the module of the command given (none for --version)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
