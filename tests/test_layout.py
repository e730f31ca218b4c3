"""The package's layout is what docs/architecture.md says: every module in one tier of its
import order, no import from a tier to a lower one, no cycle, no chain of imports deeper than
MAX_IMPORT_DEPTH modules, no module over 700 lines and no function in layers.py or model.py
with a body over 80 lines."""

import ast
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "keras_vit"
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80
# The longest chain of modules each importing the next at its top (a module stands one level
# above all it imports). Lowered as the layout flattens; never raised.
MAX_IMPORT_DEPTH = 10


def documented_tiers(text=None):
    """{top-level module or package name: tier number} from the architecture page's block."""
    text = text or (REPO / "docs" / "architecture.md").read_text()
    tiers = {}
    for number, names in re.findall(r"^tier (\d+): (.+)$", text, re.MULTILINE):
        for name in names.split():
            assert name not in tiers, f"{name} is in two tiers"
            tiers[name] = int(number)
    return tiers


def unit(path):
    """The top-level module or package of keras_vit that `path` belongs to."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def imports(path):
    """The keras_vit top-level units `path` imports (from any line of the module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "keras_vit":
                found |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names
                      if a.name.startswith("keras_vit.")}
    return found


def graph():
    """{unit: the units it imports}, for every module of the package but its entry points."""
    edges = {}
    for path in PACKAGE.rglob("*.py"):
        if path.parent == PACKAGE and path.name in ("__init__.py", "__main__.py"):
            continue
        edges.setdefault(unit(path), set()).update(imports(path) - {unit(path)})
    return edges


def cycle(edges):
    """One import cycle of `edges` as a list of units, or None."""
    state = {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt]
            if nxt not in state:
                found = visit(nxt, trail + [nxt])
                if found:
                    return found
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def test_every_module_is_in_one_documented_tier():
    assert set(graph()) == set(documented_tiers())


def test_no_import_goes_to_a_lower_tier():
    tiers = documented_tiers()
    wrong = sorted(
        f"{source} (tier {tiers.get(source)}) imports {target} (tier {tiers.get(target)})"
        for source, targets in graph().items() for target in targets
        if tiers.get(target, 0) > tiers.get(source, 0))
    assert not wrong


def test_the_imports_form_no_cycle():
    assert cycle(graph()) is None


def test_the_checks_find_a_wrong_way_import_and_a_cycle():
    tiers = documented_tiers("tier 1: a\ntier 2: b c\n")
    assert tiers == {"a": 1, "b": 2, "c": 2}
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.name))
def test_no_module_is_over_700_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_MODULE_LINES


@pytest.mark.parametrize("name", ["layers.py", "model.py"])
def test_no_function_of_the_model_has_a_body_over_80_lines(name):
    tree = ast.parse((PACKAGE / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            body = node.body[1:] if ast.get_docstring(node) else node.body
            length = node.end_lineno - body[0].lineno + 1
            assert length <= MAX_FUNCTION_LINES, (node.name, length)


def module_imports():
    """{module: the keras_vit modules its top-level statements import}, by dotted name (the
    package's `__init__` aside)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("keras_vit",) + path.relative_to(PACKAGE).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges = {}
    for name, path in modules.items():
        found = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        edges[name] = {m for m in found if m in modules and m not in (name, "keras_vit")}
    edges.pop("keras_vit", None)
    return edges


def longest_chain(edges):
    """The longest chain of `edges` (a list of modules, each importing the next)."""
    chains = {}

    def chain(node):
        if node not in chains:
            chains[node] = [node] + max((chain(n) for n in edges[node]), key=len, default=[])
        return chains[node]

    return max((chain(node) for node in edges), key=len)


def test_no_chain_of_imports_is_deeper_than_the_limit():
    chain = longest_chain(module_imports())
    assert len(chain) <= MAX_IMPORT_DEPTH, " -> ".join(chain)


def test_the_depth_is_the_longest_chain():
    assert longest_chain({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == ["a", "b", "c"]
