"""The package's layout is what docs/architecture.md says: every module in one tier of its
import order, no import from a tier to a lower one, no cycle, no module over 700 lines and no
function in layers.py or model.py with a body over 80 lines."""

import ast
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "keras_vit"
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80


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
