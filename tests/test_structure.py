"""The package's structure: one-way imports, a command line that starts without TensorFlow,
layers registered for `.keras` files whatever the import order, private framework API in one
place and completely listed."""

import ast
import importlib.util
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

import keras_vit

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "keras_vit"
CLI = ROOT / "keras_vit_cli"
# Function-level imports allowed outside the command line, each an optional dependency (or a
# platform-specific one), imported where it is needed with a comment saying why.
LAZY_IMPORTS = ("matplotlib", "tensorflow_serving", "tensorflow_datasets", "fcntl", "huggingface_hub",
                "safetensors", "jax", "resource", "keras_hub")
# Backends imported inside a function, where that backend runs (TensorFlow's own ops in a module
# that the JAX backend also uses, which must not load TensorFlow there), with a comment.
BACKEND_IMPORTS = ("tensorflow",)


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules():
    return {module_name(p): p for folder in (PACKAGE, CLI) for p in folder.rglob("*.py")}


def resolve(name, known):
    """The package module an import names: the module itself, else its longest known prefix."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path, known):
    """(imported module, line, at module level) for every keras_vit import in `path`."""
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in ("keras_vit", "keras_vit_cli") + LAZY_IMPORTS \
                    or name in known:
                found.append((name, node.lineno, id(node) in top_level))
            elif id(node) not in top_level:
                found.append((name, node.lineno, False))
    return found


def import_graph():
    known = modules()
    graph = {}
    for name, path in known.items():
        graph[name] = {resolve(imported, known) for imported, _, _ in imports_of(path, known)
                       if imported.startswith("keras_vit")} - {None, name}
    return graph


def test_no_module_imports_another_that_imports_it_back():
    graph = import_graph()
    cycles = []

    def visit(node, stack):
        for nxt in sorted(graph[node]):
            if nxt in stack:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, stack + [nxt])
        done.add(node)

    done = set()
    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    assert not cycles, cycles


def test_library_modules_never_import_the_command_line():
    graph = import_graph()
    library = {m: imported for m, imported in graph.items()
               if not m.startswith("keras_vit_cli") and m != "keras_vit.__main__"}
    offenders = {m: sorted(i for i in imported if i.startswith("keras_vit_cli"))
                 for m, imported in library.items()}
    assert not {m: i for m, i in offenders.items() if i}


def test_imports_sit_at_the_top_except_optional_dependencies():
    known = modules()
    misplaced = []
    for name, path in known.items():
        if name.startswith("keras_vit_cli") or name == "keras_vit":
            continue  # the command line imports the library per command, by design
        lines = path.read_text().splitlines()
        for imported, line, top in imports_of(path, known):
            if top:
                continue
            reason = "#" in lines[line - 1] or lines[line - 2].strip().startswith("#")
            allowed = imported.split(".")[0] in LAZY_IMPORTS + BACKEND_IMPORTS
            if not allowed or not reason:
                misplaced.append(f"{path.relative_to(ROOT)}:{line} {imported}")
    assert not misplaced


def run_python(code, env=None):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_import_keras_vit_registers_the_layers_and_loads_no_command_line():
    out = run_python("import json, sys, keras, keras_vit\n"
                     "print(json.dumps([sorted(sys.modules), keras.saving.get_registered_object("
                     "'keras_vit>PatchEmbedding') is keras_vit.PatchEmbedding]))")
    loaded, registered = json.loads(out.strip().splitlines()[-1])
    assert registered
    assert not [m for m in loaded if m.startswith("keras_vit_cli")]


def test_the_command_line_package_imports_neither_keras_vit_nor_keras():
    out = run_python("import json, sys, keras_vit_cli; print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(out.strip().splitlines()[-1])
    assert not [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras", "keras_vit")]


@pytest.mark.parametrize("argv", [["--help"], ["models"], ["checkpoints"],
                                  ["checkpoints", "ViT_B16", "--json"], ["train", "--help"],
                                  ["predict", "--help"], ["export", "--help"],
                                  ["vtab", "--help"]])
def test_help_and_models_start_without_tensorflow(argv):
    code = ("import contextlib, io, json, sys\n"
            "from keras_vit_cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    try:\n"
            f"        main({argv!r})\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(json.dumps([len(out.getvalue()), sorted(sys.modules)]))")
    length, loaded = json.loads(run_python(code).splitlines()[-1])
    assert length > 100
    assert not [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras", "jax",
                                                         "keras_vit")]



@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                    reason="scikit-learn is not installed here (the test extra installs it)")
def test_a_command_does_not_import_scikit_learn_which_imports_as_usual_after(tmp_path):
    """Keras imports scikit-learn where it is installed (for wrappers no command uses): every
    command that starts TensorFlow paid for it. The command keeps it out, and only while
    Keras imports."""
    from PIL import Image

    image = tmp_path / "digit.png"
    Image.new("RGB", (16, 16), (200, 10, 10)).save(image)
    code = ("import contextlib, io, json, sys\n"
            "from keras_vit_cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    status = main(['predict', '--weights', 'digits', '-q', "
            f"{str(image)!r}])\n"
            "during = sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn')\n"
            "import sklearn.base\n"
            "print(json.dumps([status, during, 'keras' in sys.modules]))")
    status, during, keras_loaded = json.loads(run_python(code).splitlines()[-1])
    assert status == 0 and keras_loaded and during == []

LOAD_AFTER = """
import sys
import numpy as np
{imports}
import keras
import tensorflow as tf
print([keras.saving.get_registered_object(f"keras_vit>{{name}}") is not None
       for name in ("TransformerBlock", "Encoder", "ScannedEncoder", "ResNetStem", "StdConv2D",
                    "ViTModel")])
model = {load}(sys.argv[1])
print(tuple(model(np.zeros((1, 16, 16, 3), np.float32)).shape))
"""


@pytest.fixture(scope="module")
def keras_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keras_file") / "vit.keras"
    keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2,
                  mlp_dim=8, num_classes=3).save(path)
    return path


# Any submodule imported first runs the package's __init__ before it, so one submodule stands
# for all of them (it would fail first if the package deferred its imports).
@pytest.mark.parametrize("imports, load", [
    ("import keras_vit", "keras.saving.load_model"),
    ("import keras\nimport keras_vit", "keras.saving.load_model"),
    ("import keras_vit\nimport tensorflow", "tf.keras.models.load_model"),
    ("from keras_vit.layers import TransformerBlock", "keras.saving.load_model"),
])
def test_a_fresh_process_registers_every_layer_and_loads_keras_files_whatever_it_imports_first(
        keras_file, imports, load):
    """Whichever module of keras_vit a process imports first, every layer of the package is
    registered with Keras, and a `.keras` file of a model loads."""
    result = subprocess.run([sys.executable, "-c", LOAD_AFTER.format(imports=imports, load=load),
                             str(keras_file)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    registered, shape = result.stdout.strip().splitlines()[-2:]
    assert registered == str([True] * 6)
    assert shape == "(1, 3)"


# --------------------------------------------------------------------------------------------
# Private members of Keras, TensorFlow and the other libraries: only in keras_vit.framework,
# and every one listed there.

# Where an attribute name of another library's object can hide: an attribute access
# (`obj._name`), or a string given to one of these.
_NAME_TAKING_CALLS = ("getattr", "hasattr", "setattr", "delattr")
# The frameworks' private modules, imported or named in a string (`importlib.import_module`).
_PRIVATE_MODULES = ("keras.src", "tensorflow.python", "jax._src")
# Framework classes whose private attributes an override or an assignment in keras_vit could
# shadow (their class attributes, and the instance attributes of a built instance).
_FRAMEWORK_CLASSES = ("keras.Model", "keras.layers.Layer", "keras.optimizers.AdamW",
                      "keras.callbacks.Callback", "keras.losses.Loss", "keras.metrics.Metric",
                      "keras.optimizers.schedules.LearningRateSchedule")


def _is_private(name):
    return (name.startswith("_") and not name.startswith("__")
            and not name.startswith("_keras_vit"))  # keras_vit's own markers on framework objects


def _source_names(tree):
    """(private names the code uses, private names it defines itself, names it defines as
    methods or as attributes of `self`). A private module counts by its dotted name."""
    used, defined, members = {}, set(), set()
    for node in ast.walk(tree):
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            modules = [node.value]
        for module in modules:
            if module.startswith(_PRIVATE_MODULES):
                used.setdefault(module, node.lineno)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.Attribute) and _is_private(node.attr):
            used.setdefault(node.attr, node.lineno)
            if isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) \
                    and node.value.id == "self":
                defined.add(node.attr)
                members.add(node.attr)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in _NAME_TAKING_CALLS \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _is_private(node.args[1].value):
            used.setdefault(node.args[1].value, node.lineno)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        members |= {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.Assign))
                    and getattr(n, "name", None)}
        members |= {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets
                    if isinstance(t, ast.Name)}
    return used, defined, {m for m in members if _is_private(m)}


def _framework_private_attributes():
    """Every private attribute of `_FRAMEWORK_CLASSES` and of built instances of them."""
    import keras

    names = set()
    for dotted in _FRAMEWORK_CLASSES:
        cls = keras
        for part in dotted.split(".")[1:]:
            cls = getattr(cls, part)
        names |= {n for n in dir(cls) if _is_private(n)}
    optimizer = keras.optimizers.AdamW()
    optimizer.build([keras.Variable([0.0])])
    layer = keras.layers.Dense(1)
    layer.build((None, 1))
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    for instance in (optimizer, layer, model):
        names |= {n for n in vars(instance) if _is_private(n)}
    return names


def framework_private_uses(root=PACKAGE):
    """{relative path: {private name of another library: line}} over the package's source.

    A private name counts as another library's when keras_vit's code uses it without
    defining it anywhere, or when keras_vit defines it as a method or a `self` attribute and
    a framework class has it too (an override, or an assignment over a framework attribute)."""
    trees = {p: ast.parse(p.read_text()) for p in root.rglob("*.py")}
    scanned = {p: _source_names(tree) for p, tree in trees.items()}
    ours = set().union(*(defined for _, defined, _ in scanned.values()))
    shadowed = _framework_private_attributes()
    found = {}
    for path, (used, _, members) in scanned.items():
        foreign = {name: line for name, line in used.items() if name not in ours}
        foreign.update({name: used.get(name, 0) for name in members & shadowed})
        if foreign:
            found[str(path.relative_to(root))] = foreign
    return found


def test_private_framework_members_are_used_in_the_framework_module_only_and_all_listed():
    from keras_vit import framework

    found = framework_private_uses()
    elsewhere = {path: names for path, names in found.items() if path != "framework.py"}
    assert not elsewhere, f"private framework members used outside keras_vit/framework.py: " \
                          f"{elsewhere}"
    unlisted = sorted(set(found.get("framework.py", {})) - framework.private_names())
    assert not unlisted, f"private members used in keras_vit/framework.py but not listed in " \
                         f"PRIVATE_MEMBERS: {unlisted}"
    assert framework.private_names() <= set(found.get("framework.py", {}))  # no stale entry


def test_the_private_member_scan_finds_each_kind_of_use(tmp_path):
    """The scan itself: an attribute read, a getattr string, an assignment over a framework
    attribute and an override, each in a module other than framework.py; keras_vit's own
    private names and markers pass."""
    package = tmp_path / "keras_vit"
    package.mkdir()
    (package / "framework.py").write_text("PRIVATE_MEMBERS = ()\n")
    (package / "uses.py").write_text(textwrap.dedent("""
        import importlib

        import keras

        def _helper(model):
            model._keras_vit_marker = True
            importlib.import_module("tensorflow.python.eager.context")
            return model._distribute_strategy, getattr(model, "_tracker", None)

        class Layer(keras.layers.Layer):
            def _grid(self):
                return 1

            def _post_build(self):
                self._own = 1
                self._layers = []
                return self._own + self._grid()
        """))
    found = framework_private_uses(package)
    assert set(found) == {"uses.py"}
    assert set(found["uses.py"]) == {"_distribute_strategy", "_tracker", "_post_build",
                                     "_layers", "tensorflow.python.eager.context"}
