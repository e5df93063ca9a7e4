"""The `gpupool` command's dispatcher: subcommands load lazily; global options work before the command."""
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.cli import _hoist_globals

GPUPOOL = str(Path(sys.executable).parent / "gpupool")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("argv, want", [
    (["--url", "U", "list"], ["list", "--url", "U"]),
    (["--url=U", "--json", "queues", "-x"], ["queues", "--url=U", "--json", "-x"]),
    (["list", "--url", "U"], ["list", "--url", "U"]),
    (["--url", "U"], ["--url", "U"]),
])
def test_hoist_globals(argv, want):
    assert _hoist_globals(argv) == want


def test_global_options_before_the_command_reach_the_client():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    before = subprocess.run([GPUPOOL, "--url", url, "--token", "t", "list"], capture_output=True, text=True)
    after = subprocess.run([GPUPOOL, "list", "--url", url, "--token", "t"], capture_output=True, text=True)
    assert before.returncode == after.returncode == 1
    assert url in before.stderr and "Traceback" not in before.stderr
    assert before.stderr == after.stderr


def test_unknown_command_is_a_usage_error():
    res = subprocess.run([GPUPOOL, "frobnicate"], capture_output=True, text=True)
    assert res.returncode == 2 and "Traceback" not in res.stderr


def test_version():
    import gpupool

    res = subprocess.run([GPUPOOL, "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == f"gpupool {gpupool.__version__}"
