"""The project installs as one import package `gpupool` whose subpackages are the top-level folders."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from source_tree import parse

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_builds_and_imports(tmp_path):
    out = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, text=True)
    wheels = list(out.glob("gpupool-*.whl"))
    assert len(wheels) == 1
    names = zipfile.ZipFile(wheels[0]).namelist()
    for sub in ("scheduler", "hub_ext", "spawner", "widgets"):
        assert f"gpupool/{sub}/__init__.py" in names, sub
    # the dashboard's page, the hub home page template and the vendored Chart.js with its license
    for data in ("templates/dashboard.html", "templates/hub/home.html", "static/chart.umd.min.js",
                 "static/chart.js-LICENSE.md"):
        assert f"gpupool/hub_ext/{data}" in names, data
    # the HTML templates travel as package data
    for template in ("spawner/templates/gpu_form.html", "widgets/templates/macros.html", "widgets/templates/job.html"):
        assert f"gpupool/{template}" in names, template
    # the JupyterLab extension (built by `make deps`) and the server extension's switch, as data files
    data = "gpupool-0.1.0.data/data/"
    assert data + "share/jupyter/labextensions/gpupool-lab/package.json" in names
    assert any(n.startswith(data + "share/jupyter/labextensions/gpupool-lab/static/remoteEntry.") for n in names)
    assert data + "etc/jupyter/jupyter_server_config.d/gpupool-lab.json" in names
    # Install the wheel alone into a bare target dir and import the pure core from there.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheels[0])],
                   check=True, capture_output=True, text=True)
    code = ("import gpupool.scheduler as s, sys; from gpupool.scheduler.model import Snapshot; "
            "print(s.__file__)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert str(target) in res.stdout


def test_console_script_runs():
    res = subprocess.run([str(Path(sys.executable).parent / "gpupool"), "--help"], capture_output=True, text=True)
    assert res.returncode == 0
    assert "gpupool" in res.stdout


def test_scheduler_core_is_pure():
    """Every module of scheduler/ (scheduler/actions/ included) imports no I/O, clock, Kubernetes
    or JupyterHub modules, and nothing of gpupool outside the core (a relative import leaving
    scheduler/). Imports inside functions count too."""
    forbidden = ("kubernetes", "jupyterhub", "tornado", "sqlalchemy", "requests", "time", "datetime",
                 "os", "subprocess", "socket", "asyncio", "random", "pynvml", "threading", "gpupool")
    import ast
    paths = sorted((ROOT / "scheduler").rglob("*.py"))
    assert ROOT / "scheduler" / "actions" / "allocate.py" in paths
    for path in paths:
        depth = len(path.relative_to(ROOT / "scheduler").parts) - 1  # 0: scheduler/x.py, 1: scheduler/actions/x.py
        tree = parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            elif isinstance(node, ast.ImportFrom):
                assert node.level <= depth + 1, f"{path.relative_to(ROOT)} imports from outside scheduler/"
            for n in names:
                assert n.split(".")[0] not in forbidden, f"{path.relative_to(ROOT)} imports {n}"
