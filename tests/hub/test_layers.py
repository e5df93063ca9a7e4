"""hub_ext/ is in layers, and its imports say so (docs/architecture.md).

Every module of hub_ext is parsed (``ast``) and every import in it is followed: at module level,
inside functions and classes, relative (``from . import x``, ``from ..store import tables``) and
absolute. From the imports between hub_ext's modules this test fails on

* a cycle (of any length, deferred imports included);
* a module of a lower layer importing one of a higher layer
  (store < domain < runtime < web < the top: ``hub_ext/*.py``);
* a module over 500 lines.

(Python runs a package's ``__init__`` before any of its modules; that is not an import a module
makes, and is not counted. An import under ``if TYPE_CHECKING:`` is counted like any other.)
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from source_tree import parse

ROOT = Path(__file__).resolve().parents[2]
HUB_EXT = ROOT / "hub_ext"
PACKAGE = "gpupool.hub_ext"
LAYERS = ("store", "domain", "runtime", "web")  # lowest first; anything else in hub_ext/ is the top
MAX_LINES = 500


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``root`` (a package ``__init__`` is the
    package's own name)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (its file: ``path``) imports, anywhere in it."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[:len(base) - drop] if drop else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # ``from pkg import x``: the module pkg.x when there is one, else pkg itself
            targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known and "." in t:  # import a.b.c of a module a.b's attribute
                t = t.rsplit(".", 1)[0]
            if t in known and t != name:
                found.add(t)
    return found


def graph(root: Path, package: str) -> tuple[dict[str, set[str]], dict[str, Path]]:
    mods = modules(root, package)
    known = set(mods)
    return {m: imports(m, p, known) for m, p in mods.items()}, mods


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def layer(module: str, package: str) -> int:
    rest = module[len(package) + 1:].split(".") if module != package else []
    return LAYERS.index(rest[0]) if rest and rest[0] in LAYERS else len(LAYERS)


def broken_layers(edges: dict[str, set[str]], package: str) -> list[str]:
    names = (*LAYERS, "top")
    return sorted(f"{m} ({names[layer(m, package)]}) imports {t} ({names[layer(t, package)]})"
                  for m, ts in edges.items() for t in ts if layer(t, package) > layer(m, package))


def too_long(mods: dict[str, Path]) -> list[str]:
    return sorted(f"{p.name}: {n} lines" for p in mods.values()
                  if (n := len(p.read_text().splitlines())) > MAX_LINES)


# ---------------------------------------------------------------------------------- hub_ext itself

def test_hub_ext_has_no_import_cycle():
    edges, _ = graph(HUB_EXT, PACKAGE)
    assert cycles(edges) == []


def test_lower_layers_never_import_higher_ones():
    edges, _ = graph(HUB_EXT, PACKAGE)
    assert broken_layers(edges, PACKAGE) == []


def test_no_module_of_hub_ext_is_over_500_lines():
    _, mods = graph(HUB_EXT, PACKAGE)
    assert too_long(mods) == []


def test_every_layer_is_a_folder_and_is_used():
    edges, mods = graph(HUB_EXT, PACKAGE)
    for name in LAYERS:
        assert (HUB_EXT / name / "__init__.py").is_file(), name
        assert any(layer(m, PACKAGE) == LAYERS.index(name) for m in mods), name


# ---------------------------------------------------------------------------------- the checker can fail

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **{f"{d}/__init__.py": "" for d in LAYERS}, **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_checker_finds_a_cycle_through_a_deferred_import(tmp_path):
    root = _tree(tmp_path, {
        "store/a.py": "def f():\n    from ..domain import b\n",  # deferred, and `from .. import x` of a module
        "domain/b.py": "from ..store.a import f\n",
    })
    edges, _ = graph(root, "x.pkg")
    assert cycles(edges) == [["x.pkg.domain.b", "x.pkg.store.a"]]
    assert broken_layers(edges, "x.pkg") == ["x.pkg.store.a (store) imports x.pkg.domain.b (domain)"]


def test_the_checker_finds_a_layer_broken_by_a_package_import(tmp_path):
    root = _tree(tmp_path, {
        "web/scopes.py": "A = 1\n",
        "runtime/loop.py": "import x.pkg.web.scopes\nfrom .. import web\n",  # absolute, and the package
        "app.py": "from .runtime import loop\nfrom .store import *\n",  # the top may import anything
    })
    edges, _ = graph(root, "x.pkg")
    assert edges["x.pkg.app"] == {"x.pkg.runtime.loop", "x.pkg.store"}
    assert broken_layers(edges, "x.pkg") == ["x.pkg.runtime.loop (runtime) imports x.pkg.web (web)",
                                             "x.pkg.runtime.loop (runtime) imports x.pkg.web.scopes (web)"]
    assert cycles(edges) == []


def test_the_checker_counts_lines(tmp_path):
    root = _tree(tmp_path, {"domain/long.py": "x = 1\n" * (MAX_LINES + 1)})
    _, mods = graph(root, "x.pkg")
    assert len(too_long(mods)) == 1


# ---------------------------------------------------------------------------------- one scope per handler

def test_every_handler_method_declares_its_scope():
    """Each method of each REST handler says what its caller needs (web/scopes.py), once: the
    OpenAPI document reads the same declaration."""
    from tornado.web import RequestHandler

    from gpupool.hub_ext.web.routes import api_routes
    from gpupool.hub_ext.web.scopes import need_of

    missing = []
    for _, handler, *_ in api_routes("/services/gpupool/"):
        for method in RequestHandler.SUPPORTED_METHODS:
            fn = getattr(handler, method.lower(), None)
            if fn is not None and fn is not getattr(RequestHandler, method.lower(), None) \
                    and need_of(handler, method) is None:
                missing.append(f"{handler.__name__}.{method.lower()}")
    assert missing == []


@pytest.mark.parametrize("scopes,admin,submit", [
    (["custom:gpupool:admin"], True, True),
    (["custom:gpupool:submit"], False, True),
    (["custom:gpupool:admin!group=cv"], False, True),  # a filter never makes an admin
    (["custom:gpupool:admin!user=bob", "custom:gpupool:submit!user=bob"], False, True),
    (["read:users:name!user"], False, False),
    (["custom:gpupool:adminx"], False, False),
])
def test_a_filtered_gpupool_scope_grants_no_admin(scopes, admin, submit):
    from gpupool.hub_ext.web.scopes import ADMIN_SCOPE, SUBMIT_SCOPE, has_scope

    assert has_scope(scopes, ADMIN_SCOPE) is admin and has_scope(scopes, SUBMIT_SCOPE) is submit
