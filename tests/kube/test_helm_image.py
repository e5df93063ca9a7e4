"""The chart's hub image (helm/gpupool/image/Dockerfile) carries gpupool's JupyterLab extension,
built from its TypeScript in a node stage of a multi-stage build, as `make labextension` builds it.
Checked by reading the Dockerfile (no Docker here: the image itself is not built by the tests)."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "helm" / "gpupool" / "image"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: continuation lines joined, comments left out."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """The build's stages by name (an unnamed one by its position), each with its instructions."""
    found: dict[str, list[tuple[str, str]]] = {}
    current = None
    for word, rest in instructions(text):
        if word == "FROM":
            parts = rest.split()
            current = parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else f"stage{len(found)}"
            found[current] = [(word, rest)]
        elif current is not None:
            found[current].append((word, rest))
    return found


def test_a_node_stage_builds_the_lab_extension_and_the_hub_stage_installs_it():
    built = stages((IMAGE / "Dockerfile").read_text())
    assert list(built)[0] == "labextension" and len(built) == 2
    node = built["labextension"]
    assert re.match(r"node:(\d+)", node[0][1]) and int(re.match(r"node:(\d+)", node[0][1]).group(1)) >= 18
    runs = " ".join(rest for word, rest in node if word == "RUN")
    copies = [shlex.split(rest) for word, rest in node if word == "COPY"]
    # the locked npm toolchain of package.json, then the extension's sources
    assert ["package.json", "package-lock.json", "./"] in copies and "npm ci" in runs
    assert ["labextension/", "labextension/"] in copies
    # the same two steps as the Makefile's: TypeScript, then JupyterLab's builder with its core path
    make = (ROOT / "Makefile").read_text()
    for step in ("node_modules/.bin/tsc -p labextension", "node node_modules/@jupyterlab/builder/lib/build-labextension.js"):
        assert step in runs and step in make
    assert "--core-path" in runs and "jupyterlab>=4" in runs
    # where the builder writes (labextension/package.json's outputDir) is what the hub stage copies
    out = json.loads((ROOT / "labextension" / "package.json").read_text())["jupyterlab"]["outputDir"]
    built_dir = (Path("/src/labextension") / out).resolve()
    assert built_dir == Path("/src/gpupool/lab/labextension")
    assert f"test -f {built_dir.relative_to('/src')}/package.json" in runs

    hub = list(built.values())[1]
    assert hub[0][1].startswith("quay.io/jupyterhub/jupyterhub:")
    words = [w for w, _ in hub]
    copy_from = [shlex.split(rest) for word, rest in hub if word == "COPY" and rest.startswith("--from=")]
    assert copy_from == [["--from=labextension", str(built_dir), "/src/gpupool/gpupool/lab/labextension"]]
    # copied over the sources before pip installs them: package data and data files of the wheel
    install = next(i for i, (w, rest) in enumerate(hub) if w == "RUN" and "pip install" in rest)
    assert max(i for i, (w, rest) in enumerate(hub) if w == "COPY") < install
    assert words[-2:] == ["USER", "WORKDIR"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"gpupool/lab/labextension/package.json"' in pyproject and '"labextension/static/*"' in pyproject


def test_the_build_context_leaves_out_local_builds_and_environments():
    """Dockerfile.dockerignore (BuildKit reads it beside the Dockerfile): a stale local build of the
    extension never reaches the image, nor a venv or node_modules."""
    ignored = {line.strip() for line in (IMAGE / "Dockerfile.dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", "node_modules", "gpupool/lab/labextension", "labextension/lib", ".git"} <= ignored
    assert not {"package.json", "package-lock.json", "labextension", "gpupool"} & ignored
