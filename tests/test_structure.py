"""The package's structure: one-way imports, a command line that starts without TensorFlow,
layers registered for `.keras` files whatever the import order, private framework API in one
place."""

import ast
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "keras_vit"
# Function-level imports allowed outside the command line, each an optional dependency (or a
# platform-specific one), imported where it is needed with a comment saying why.
LAZY_IMPORTS = ("matplotlib", "tensorflow_serving", "tensorflow_datasets", "fcntl", "huggingface_hub",
                "safetensors", "jax")
# Package modules a layer module may import on first use: layer modules load inside Keras' own
# import (keras_vit/__init__), and these import TensorFlow.
LAYER_MODULE_LAZY_IMPORTS = {"keras_vit.model": ("keras_vit.framework",)}


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules():
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


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
            if name.split(".")[0] in ("keras_vit",) + LAZY_IMPORTS or name in known:
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
               if not m.startswith("keras_vit.cli") and m != "keras_vit.__main__"}
    offenders = {m: sorted(i for i in imported if i.startswith("keras_vit.cli"))
                 for m, imported in library.items()}
    assert not {m: i for m, i in offenders.items() if i}


def test_imports_sit_at_the_top_except_optional_dependencies():
    known = modules()
    misplaced = []
    for name, path in known.items():
        if name.startswith("keras_vit.cli") or name == "keras_vit":
            continue  # the command line imports the library per command, by design
        lines = path.read_text().splitlines()
        for imported, line, top in imports_of(path, known):
            if top:
                continue
            reason = "#" in lines[line - 1] or lines[line - 2].strip().startswith("#")
            allowed = imported.split(".")[0] in LAZY_IMPORTS or \
                imported in LAYER_MODULE_LAZY_IMPORTS.get(name, ())
            if not allowed or not reason:
                misplaced.append(f"{path.relative_to(ROOT)}:{line} {imported}")
    assert not misplaced


def run_python(code, env=None):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_import_keras_vit_loads_neither_the_command_line_nor_tensorflow():
    out = run_python("import json, sys, keras_vit; print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(out)
    assert "keras_vit.cli" not in loaded
    assert not [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras")]


@pytest.mark.parametrize("argv", [["--help"], ["models"], ["train", "--help"],
                                  ["predict", "--help"], ["export", "--help"],
                                  ["vtab", "--help"]])
def test_help_and_models_start_without_tensorflow(argv):
    code = ("import contextlib, io, json, sys\n"
            "from keras_vit.cli import main\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n"
            "    try:\n"
            f"        main({argv!r})\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(json.dumps([len(out.getvalue()), sorted(sys.modules)]))")
    length, loaded = json.loads(run_python(code).splitlines()[-1])
    assert length > 100
    assert not [m for m in loaded if m.split(".")[0] in ("tensorflow", "keras", "jax")]


SAVE_AND_LOAD = """
import sys
import numpy as np
{imports}
path = sys.argv[1]
model = load(path)
print(model.predict(np.zeros((1, 16, 16, 3), np.float32), verbose=0).shape)
"""


@pytest.mark.parametrize("imports", [
    "import keras_vit\nimport keras\nload = keras.saving.load_model",
    "import keras\nimport keras_vit\nload = keras.saving.load_model",
    "import keras_vit\nimport tensorflow as tf\nload = tf.keras.models.load_model",
    "from keras_vit.layers import TransformerBlock\nimport keras\nload = keras.saving.load_model",
    "import keras_vit.resnet\nimport keras\nload = keras.saving.load_model",
])
def test_layers_are_registered_for_keras_files_whatever_the_import_order(tmp_path, imports):
    path = tmp_path / "vit.keras"
    run_python("import keras_vit\n"
               "keras_vit.ViT(image_size=16, patch_size=8, hidden_size=8, num_layers=1, "
               f"num_heads=2, mlp_dim=8, num_classes=3).save({str(path)!r})")
    result = subprocess.run([sys.executable, "-c", SAVE_AND_LOAD.format(imports=imports),
                             str(path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("(1, 3)")


@pytest.mark.parametrize("first", [
    "from keras_vit.layers import TransformerBlock", "import keras_vit.layers",
    "from keras_vit import resnet", "import keras_vit; keras_vit.layers", "import keras, keras_vit",
    "from keras_vit.model import ViT",
])
def test_a_layer_module_imports_first_in_a_fresh_process_and_every_layer_registers(first):
    # `import keras_vit.layers` first once failed: its `import keras` imported
    # keras_vit.resnet, which took its base class from the half-made keras_vit.layers.
    out = run_python(f"{first}\nimport keras\n"
                     "print([keras.saving.get_registered_object(f'keras_vit>{name}') is not None"
                     "       for name in ('TransformerBlock', 'ScannedEncoder', 'ResNetStem',"
                     "                    'StdConv2D', 'ViTModel')])")
    assert out.strip().splitlines()[-1] == "[True, True, True, True, True]"
