"""The package's layout: no module over 500 lines, and no import cycle among the modules of
dflash_core/ and ui/ (imports inside functions count; those under `if TYPE_CHECKING` do not)."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dflash_core", "ui")
MAX_LINES = 500


def modules() -> dict:
    """Dotted module name -> its file, for every module under dflash_core/ and ui/."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(tree: ast.AST):
    """The Import and ImportFrom nodes of a module, skipping `if TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (i for n in node.orelse for i in _imports_in(n))
            continue
        yield from _imports_in(node)


def _imports_in(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _imports(node)


def imported(name: str, path: Path, known: dict) -> set:
    """The known modules that `name` imports: `from X import n` counts X.n where that is a module,
    else X; a module's own package is not counted for it (Python runs it first anyway)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()

    def add(target: str):
        while target and target not in known:  # `import a.b.c` where a.b.c is a name in a.b
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            add(sub if sub in known else source)
    return out


def graph() -> dict:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def cycles(edges: dict) -> list:
    """The strongly connected components of more than one module (or a module importing itself)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_is_over_500_lines():
    long = {
        str(p.relative_to(ROOT)): n for p in modules().values() if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_the_cycle_finder_sees_cycles_and_imports_inside_functions():
    known = modules()
    edges = graph()
    assert "dflash_core.models.loading" in edges["ui.models"]
    assert "dflash_core.models.loading" in edges["dflash_core.training.decoding"]  # inside a function
    assert "dflash_core.engine.cycle" in edges["dflash_core.engine"]  # the package's re-exports
    assert "dflash_core.models.distributed" in edges["dflash_core.cli"]  # `from .models import distributed`
    assert set(edges) == set(known)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]


def test_the_engine_imports_no_loading_serving_training_or_ui():
    edges = graph()
    for name, targets in edges.items():
        if name.startswith("dflash_core.engine"):
            outside = {t for t in targets if t.startswith(("dflash_core.models", "dflash_core.serving", "ui"))}
            outside |= {t for t in targets if t.startswith("dflash_core.training")}
            assert not outside, (name, outside)


SHIMS = {
    "dflash_core.loading": ("dflash_core.models.loading", ["load_pair", "load_planned", "plan_pair", "resolve"]),
    "dflash_core.pair": ("dflash_core.models.pair", ["Pair"]),
    "dflash_core.registry": ("dflash_core.models.registry", ["SHIPPED", "DEFAULT_PAIR", "draft_for", "known_pairs"]),
    "dflash_core.random_models": ("dflash_core.training.random_models", ["FAMILIES", "write_pair", "main"]),
    "dflash_core.server": ("dflash_core.serving.routes", ["create_app", "serve", "server_policy"]),
    "dflash_core.train_draft": ("dflash_core.training.train_draft", ["train", "add_arguments", "save_draft"]),
    "dflash_core.engine": ("dflash_core.engine.cycle", ["dflash_generate", "baseline_generate", "accepted_length"]),
}


@pytest.mark.parametrize("old", sorted(SHIMS))
def test_the_old_import_paths_still_work(old):
    new, names = SHIMS[old]
    a, b = importlib.import_module(old), importlib.import_module(new)
    for n in names:
        assert getattr(a, n) is getattr(b, n), n
