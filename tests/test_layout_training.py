"""The training path's layout: training flows one way (`keras_vit.training.fit` -> recipes ->
compilation -> state -> `keras_vit.parallel`, `keras_vit.framework`), the Adam update lives in
training/ and the private-API module only gives access to Keras' members, and the precision
table exists once (`keras_vit.execution`), and a checkpoint's architecture is resolved in
`keras_vit.weights`, not by the builders. Read from the source with `ast`, as
tests/test_structure.py reads the whole package."""

import ast
import json
import pathlib

import keras_vit
from keras_vit.weights import architecture, model_params, read_npz, save_npz

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "keras_vit"
TRAINING = PACKAGE / "training"


def imported_modules(path):
    """The dotted names of every module `path` imports (`from a import b`: "a" and "a.b")."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}: relative import"  # the package imports absolutely
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def training_graph():
    """{training module: the training modules it imports}, without the package's __init__."""
    names = {p.stem: f"keras_vit.training.{p.stem}" for p in TRAINING.glob("*.py")
             if p.stem != "__init__"}
    return {stem: {other for other, dotted in names.items()
                   if dotted in imported_modules(TRAINING / f"{stem}.py")} - {stem}
            for stem in names}


def cycles(graph):
    """Every import cycle of `graph` found by a depth-first walk, as lists of modules."""
    found, done = [], set()

    def visit(node, stack):
        for nxt in sorted(graph[node]):
            if nxt in stack:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, stack + [nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    return found


def test_parallel_and_framework_never_import_training():
    lower = sorted(PACKAGE.glob("parallel/*.py")) + [PACKAGE / "framework.py"]
    offenders = {str(path.relative_to(ROOT)): sorted(
        name for name in imported_modules(path)
        if name == "keras_vit.training" or name.startswith("keras_vit.training."))
        for path in lower}
    assert not {path: names for path, names in offenders.items() if names}


def test_training_modules_form_no_cycle_and_flow_from_fit_down():
    graph = training_graph()
    assert not cycles(graph)
    # fit -> recipes -> compilation -> state: each stage imports the next, never one above.
    order = ["loop", "recipes", "compilation", "state"]
    for i, module in enumerate(order):
        assert not graph[module] & set(order[:i]), (module, graph[module])
    assert "compilation" in graph["recipes"] and "state" in graph["compilation"]


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_adam_update_is_in_training_and_framework_only_reaches_keras():
    framework = (PACKAGE / "framework.py").read_text()
    adam = (TRAINING / "adam.py").read_text()
    assert "ResourceApplyAdam" not in framework and "ResourceApplyAdam" in adam
    assert "keras_vit.framework" in imported_modules(TRAINING / "adam.py")


def test_one_precision_table():
    """No module but keras_vit/execution.py names a mixed Keras dtype policy as a value."""
    policies = {"mixed_bfloat16", "mixed_float16"}
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "execution.py" and path.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in policies:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert not offenders


def test_checkpoint_resolution_lives_in_weights_not_in_the_builders(tmp_path):
    tree = ast.parse((PACKAGE / "builders.py").read_text())
    defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert not defined & {"sidecar_path", "read_sidecar", "checkpoint_config"}
    # The sidecar beside a checkpoint gives its architecture and class names.
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
                          num_heads=2, mlp_dim=8, num_classes=2, name="tiny")
    path = tmp_path / "final.npz"
    save_npz(model_params(model), path)
    sidecar = tmp_path / architecture.SIDECAR_CONFIG
    sidecar.write_text(json.dumps({"format": "keras_vit", "model": keras_vit.vit_config(model),
                                   "class_names": ["cat", "dog"]}))
    assert architecture.sidecar_path(str(path)) == str(sidecar)
    config, names, described_by, size = architecture.checkpoint_config(read_npz(path), None,
                                                                        str(path))
    assert config == keras_vit.vit_config(model)
    assert (names, described_by, size) == (["cat", "dog"], str(sidecar), [16, 16])
    sidecar.unlink()  # without it: the array shapes, and the file's name
    config, names, described_by, size = architecture.checkpoint_config(read_npz(path), None,
                                                                        str(path))
    assert (config["hidden_size"], config["name"], names) == (8, "vit_final", None)
    assert size is None  # the arrays alone say no image size
