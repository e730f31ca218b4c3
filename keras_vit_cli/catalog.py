"""keras_vit's tables for the commands that list them without starting TensorFlow.

`import keras_vit` imports Keras (and with it TensorFlow), so that every layer is registered
for `.keras` files. `keras-vit models` and `keras-vit checkpoints` only read tables: the
variant table (`keras_vit/configs.py`), the FLOP count (`keras_vit/flops.py`) and the registry
queries (`keras_vit/weights/entries.py`), modules that import nothing, are loaded from their
files here, and the checkpoint registry is the data package `keras_vit_checkpoints`.
"""

import ast
import importlib.resources
import importlib.util
import json
import os
import sys


def library_module(name):
    """keras_vit's module `name`, one that imports nothing of keras_vit's or Keras (`configs`,
    `flops`, `fileio`, `weights.entries`), without running `keras_vit/__init__.py`; the module
    itself where keras_vit is imported already."""
    if "keras_vit" in sys.modules:
        return importlib.import_module(f"keras_vit.{name}")
    key = f"keras_vit_cli._library_{name.replace('.', '_')}"
    if key not in sys.modules:
        package = importlib.util.find_spec("keras_vit")  # finds it without importing it
        path = os.path.join(package.submodule_search_locations[0], *name.split(".")) + ".py"
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]


def library_names(path, name):
    """The string names a keras_vit module lists in its top-level `name = (...)` (a tuple,
    list or set) or `name = {...}` (a dict: its keys), read from the module's source without
    running it: e.g. `library_names("execution.py", "PRECISIONS")`, a module that imports
    TensorFlow. The command line checks a flag's value against them before TensorFlow
    starts; the library checks it again."""
    for node in _module_tree(path).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == name for target in node.targets):
            value = node.value
            if isinstance(value, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                items = value.keys if isinstance(value, ast.Dict) else value.elts
                return tuple(ast.literal_eval(item) for item in items)
    raise LookupError(f"keras_vit/{path} has no top-level {name} = (...) or {{...}}.")


def library_arguments(path, class_name):
    """The keyword arguments of `class_name.__init__` in a keras_vit module (e.g. "model.py",
    "ViT"), read from its source without running it (the module imports TensorFlow)."""
    for node in _module_tree(path).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    arguments = item.args.posonlyargs + item.args.args + item.args.kwonlyargs
                    return tuple(argument.arg for argument in arguments[1:])  # less self
    raise LookupError(f"keras_vit/{path} has no class {class_name} with an __init__.")


def _module_tree(path):
    """The syntax tree of keras_vit's module at `path` (relative to the package, "/"-separated)."""
    package = importlib.util.find_spec("keras_vit")  # finds it without importing it
    file = os.path.join(package.submodule_search_locations[0], *path.split("/"))
    with open(file, encoding="utf-8") as f:
        return ast.parse(f.read(), file)


def registry_entries():
    """The built-in checkpoint registry's entries (`checkpoints/registry.json`), in its order."""
    text = importlib.resources.files("keras_vit_checkpoints").joinpath("registry.json").read_text()
    return json.loads(text)["checkpoints"]
