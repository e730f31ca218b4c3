"""Names of a package that load on first use (PEP 562), so that importing the package does not
import what they need (TensorFlow, for most of them)."""

import importlib


def lazy_attributes(namespace, names, modules=()):
    """The module-level `__getattr__` and `__dir__` of a package whose `globals()` is
    `namespace`: each key of `names` loads from the module its value names on first use, and
    each of `modules` is a submodule that loads on first use.

    A name whose module needs a module that is not installed here (TensorFlow on a machine with
    JAX only) is missing, an AttributeError that gives the reason, as Python's protocol for
    attributes asks: `hasattr` answers False and `help` and `dir`-based tools skip it (and
    `from package import name` raises Python's own ImportError, without the reason). Any other
    error of the import is raised as it is.
    """
    package = namespace["__name__"]

    def __getattr__(name):
        if name not in names and name not in modules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        source = names.get(name, f"{package}.{name}")
        try:
            module = importlib.import_module(source)
        except ModuleNotFoundError as e:
            raise AttributeError(f"{package}.{name} cannot be loaded here: importing {source} "
                                 f"failed ({e})") from e
        value = getattr(module, name) if name in names else module
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(names) | set(modules))

    return __getattr__, __dir__
