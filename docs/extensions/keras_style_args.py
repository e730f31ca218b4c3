"""A griffe extension for the API reference: the types and defaults of keras_vit's arguments.

keras_vit's docstrings describe arguments as keras-hub does, `name: type. What it is.` (or
`name: type: what it is.`), which the Google-style parser reads as a description with no type.
This extension gives each parsed argument without a type the leading phrase of its
description as its type, so that the reference's "Type" column shows it. It also replaces a
default that names a constant of the package (`top_k=DEFAULT_TOP_K`) by the constant's value
(`5`), so that the "Default" column and the signatures show what a call gets.

Only the documentation build uses it (mkdocs.yml names it); the library does not import it."""

import ast
import functools
import re

import griffe

PACKAGE = "keras_vit"
# The parsed sections whose items have a type.
# (What a function returns is prose, "The model.": its type is given only as `type: what`.)
TYPED_SECTIONS = {griffe.DocstringSectionKind.parameters,
                  griffe.DocstringSectionKind.other_parameters}
# The longest leading phrase taken as a type: longer ones are descriptions.
MAX_TYPE_LENGTH = 72
# What a constant's defining expression may call to be shown by its value.
SAFE_BUILTINS = {"tuple": tuple, "list": list, "range": range, "int": int, "float": float,
                 "min": min, "max": max, "sorted": sorted, "len": len}


def without_remarks(text):
    """The text without its parenthesised remarks: `'"inferred" (from the subfolders) or None'`
    -> `'"inferred" or None'`."""
    kept, depth, quoted = [], 0, False
    for char in text:
        if char == "`":
            quoted = not quoted
        if char == "(" and not quoted:
            depth += 1
        elif char == ")" and not quoted and depth:
            depth -= 1
        elif not depth:
            kept.append(char)
    return re.sub(r"\s+([,.;])", r"\1", " ".join("".join(kept).split()))


def split_type(text):
    """`"int. Transformer width D."` -> `("int", "Transformer width D.")`: the text before the
    first period or colon that ends a phrase outside parentheses and backticks (an
    abbreviation such as "e.g." ends none). A phrase too long to be a type whose text without
    its remarks in parentheses is short enough gives that as the type, and the whole text
    stays the description. `(None, text)` where there is no such phrase."""
    depth, quoted = 0, False
    for at, char in enumerate(text):
        if char == "`":
            quoted = not quoted
        elif quoted:
            continue
        elif char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char in ".:" and depth == 0 and (at + 1 == len(text) or text[at + 1].isspace()):
            if text[max(at - 3, 0):at + 1].endswith(("e.g.", "i.e.", "etc.")):
                continue
            kind, rest = " ".join(text[:at].split()), text[at + 1:].strip()
            if len(kind) > MAX_TYPE_LENGTH:
                kind, rest = without_remarks(kind), text
            if not kind or len(kind) > MAX_TYPE_LENGTH or ":" in kind:
                return None, text
            return kind, rest
    return None, text


def typed_sections(docstring):
    """The docstring's parsed sections, each argument without a type given the leading type
    phrase of its description (kept as written: parsed as Python, `"inferred" or None` would
    lose its quotes)."""
    sections = docstring.parse()
    for section in sections:
        if section.kind not in TYPED_SECTIONS:
            continue
        for item in section.value:
            if item.annotation is None:
                kind, rest = split_type(item.description)
                if kind is not None:
                    # The type is shown as code, where backticks would show as they are.
                    item.annotation = kind.replace("`", "")
                    # A phrase with nothing after it is both: "**kwargs: standard arguments."
                    item.description = rest or kind + "."
    return sections


class TypedDocstring(griffe.Docstring):
    """A docstring whose parsed arguments have types (`typed_sections`)."""

    @functools.cached_property
    def parsed(self):
        return typed_sections(self)


def constant_value(obj, name, seen=()):
    """The literal value of the package's constant `name` as seen from `obj`, or None."""
    first, _, rest = name.partition(".")  # `module.CONSTANT`: resolve the module, then look in it
    try:
        path = obj.resolve(first) + (f".{rest}" if rest else "")
    except (griffe.NameResolutionError, AttributeError):
        return None
    if not path.startswith(PACKAGE + ".") or path in seen:
        return None
    try:
        target = obj.modules_collection[path]
    except KeyError:
        return None
    if target.is_alias:
        try:
            target = target.final_target
        except griffe.AliasResolutionError:
            return None
    if not target.is_attribute or target.value is None:
        return None
    value = str(target.value)
    try:
        ast.literal_eval(value)
        return value
    except (ValueError, SyntaxError):
        pass
    if value.isidentifier():  # another constant (`A = B`): follow it
        return constant_value(target, value, (*seen, path))
    try:  # an expression of literals, `tuple(2.0**i for i in range(-6, 11, 2))`
        return repr(eval(value, {"__builtins__": SAFE_BUILTINS}))
    except Exception:  # anything else stays as it is written
        return None


def resolve_defaults(function):
    for parameter in function.parameters:
        default = parameter.default
        if isinstance(default, (griffe.ExprName, griffe.ExprAttribute)):
            value = constant_value(function, str(default))
            if value is not None:
                parameter.default = value


def objects(obj):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from objects(member)


class KerasStyleArgs(griffe.Extension):
    def on_package(self, *, pkg, **kwargs):
        if pkg.name != PACKAGE:
            return
        everything = list(objects(pkg))
        for obj in everything:  # first the defaults, which a class's docstring shows too
            if obj.is_function:
                resolve_defaults(obj)
        for obj in everything:
            if obj.docstring is not None:
                # Parsed when the reference shows it, as any docstring (with its warnings).
                obj.docstring.__class__ = TypedDocstring
