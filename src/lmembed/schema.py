"""The schema layer of the files users write (training configs, recipes, experiments, synthesis recipes).

Three pieces, shared by every such file so that each mistake is reported the same way, as
``FILE:LINE: key.path: message``:

* :func:`load_yaml_with_lines`: the YAML document and the line of every key path in it;
* :class:`Where`: turns a key path into ``FILE:LINE: key.path`` and builds the file type's own error
  (``ExperimentSpecError``, ``TrainConfigError`` ...);
* :func:`check_fields`: validates a mapping against the fields of an options dataclass through a pydantic
  model derived from the dataclass's own declaration (unknown keys forbidden, plain ``int``/``float``/
  ``bool``/``str`` fields strict: YAML's ``2e-5`` is text, not a float), and :func:`schema_error` turns a
  pydantic ``ValidationError`` into the file type's error, one ``FILE:LINE: key.path: message`` per problem.

A file's structure is declared as a :class:`FileModel` (a pydantic model: unknown keys forbidden) and checked
with :func:`check_keys`; the checks a type cannot say (an arm that names no arm, a seed listed twice) stay with
the file's reader, raised through the same :class:`Where`.

JSON files that lmembed wrote and reads back (a run's record, an experiment's summary) are hostile until checked
too: :func:`read_checked_json` reads one and checks the fields its reader uses, naming the file and the field.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Mapping
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from lmembed.io import read_json

#: A key path in a file: ``("arms", "echo", "strategy")``, ``("data", 0, "path")``.
KeyPath = tuple[str | int, ...]

#: The plain field types checked strictly, by name.
_PLAIN = {int: "int", float: "float", bool: "bool", str: "str"}
#: pydantic's error types for a value of the wrong plain type.
_TYPE_ERRORS = {
    "int_type": "int",
    "int_parsing": "int",
    "int_from_float": "int",
    "float_type": "float",
    "float_parsing": "float",
    "bool_type": "bool",
    "bool_parsing": "bool",
    "string_type": "str",
}


#: The most values a file users write may hold once its aliases (``*name``) are expanded: every reader walks the
#: expanded document, so a few nested aliases ("billion laughs") would otherwise take every byte of memory.
MAX_YAML_NODES = 100_000


def load_yaml_with_lines(text: str) -> tuple[Any, dict[KeyPath, int]]:
    """The YAML document and, for every key path (``("arms", "echo", "strategy")``), its 1-based line. A document
    that contains itself through an alias, or expands to more than :data:`MAX_YAML_NODES` values, is refused."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _no_key_twice(node, set())  # before anchors are merged in (construction flattens ``<<: *base``)
        data = loader.construct_document(node) if node is not None else None
        lines: dict[KeyPath, int] = {}
        within: set[int] = set()  # the nodes being walked: an alias to one of them is a document inside itself

        def walk(current: yaml.Node, path: KeyPath) -> None:
            if id(current) in within:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    "an alias refers to a node that contains it (the document would be endless)",
                    current.start_mark,
                )
            if len(lines) >= MAX_YAML_NODES:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the document has more than {MAX_YAML_NODES:,} values once its aliases are expanded",
                    current.start_mark,
                )
            lines[path] = current.start_mark.line + 1
            within.add(id(current))
            if isinstance(current, yaml.MappingNode):
                for key_node, value_node in current.value:
                    key = loader.construct_object(key_node)
                    walk(value_node, (*path, key))
                    lines[(*path, key)] = key_node.start_mark.line + 1  # the key's line, not its value's
            elif isinstance(current, yaml.SequenceNode):
                for index, item in enumerate(current.value):
                    walk(item, (*path, index))
            within.discard(id(current))

        if node is not None:
            walk(node, ())  # before anything reads ``data``, whose shared aliases every reader would expand
        return data, lines
    finally:
        loader.dispose()


def _no_key_twice(node: yaml.Node, visited: set[int]) -> None:
    """Refuse a mapping that gives one key twice: YAML keeps the last value without a word (``steps: 1`` ... ``steps:
    2``). Keys merged in from an anchor (``<<: *base``) are not this mapping's own, and its own may override them."""
    if id(node) in visited:
        return
    visited.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = (key_node.tag, key_node.value)
                if key in seen:
                    problem = f"key {key_node.value!r} is given twice (first on line {seen[key]})"
                    raise yaml.constructor.ConstructorError(None, None, problem, key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
            _no_key_twice(value_node, visited)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _no_key_twice(item, visited)


def read_yaml_file(path: Path, error: type[Exception], text: str) -> tuple[Any, dict[KeyPath, int]]:
    """:func:`load_yaml_with_lines` of a file's ``text``; invalid YAML is ``error`` naming the file and line."""
    try:
        return load_yaml_with_lines(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        raise error(f"{path}{line}: invalid YAML ({exc.problem})") from exc
    except yaml.YAMLError as exc:
        raise error(f"{path}: invalid YAML ({exc})") from exc


class FileModel(BaseModel):
    """A mapping of a file users write: its keys are the fields (unknown keys forbidden); values are ``Any``
    unless a type says all there is to check (the file's reader checks the rest, with its own messages)."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class RecordModel(BaseModel):
    """The fields a reader uses of a JSON file lmembed wrote and reads back (:func:`read_checked_json`): each typed;
    other keys are allowed (the writer may record more than this reader reads)."""

    model_config = ConfigDict(extra="allow")


class Where:
    """Turns a key path into ``FILE:LINE: key.path`` for messages (the nearest known line for keys the file
    does not have), and builds errors of the file type's own class.

    Without a source (a mapping built in code) the label is the key path alone."""

    def __init__(self, source: str, lines: Mapping[KeyPath, int] | None = None, error: type[Exception] = ValueError):
        self.source = source
        self.lines = lines or {}
        self.error_class = error

    def line(self, path: KeyPath) -> int | None:
        """The line of ``path``, or of its nearest parent the file has."""
        probe = tuple(path)
        while probe and probe not in self.lines:
            probe = probe[:-1]
        return self.lines.get(probe)

    def at(self, path: KeyPath) -> str:
        """``FILE:LINE`` of ``path`` (``FILE`` alone when the line is not known)."""
        line = self.line(path)
        return f"{self.source}:{line}" if line else self.source

    def __call__(self, path: KeyPath) -> str:
        label = ".".join(str(p) for p in path) or "(top level)"
        return f"{self.at(path)}: {label}" if self.source else label

    def error(self, path: KeyPath, message: str) -> Exception:
        """The file type's error: ``FILE:LINE: key.path: message``."""
        return self.error_class(f"{self(path)}: {message}")


def _plain(annotation: Any) -> tuple[type | None, bool]:
    """``(int, True)`` for ``int | None``; ``(None, ...)`` for a type that is not one plain type."""
    optional = False
    if get_origin(annotation) in (Union, types.UnionType):
        parts = [a for a in get_args(annotation) if a is not type(None)]
        optional = len(parts) < len(get_args(annotation))
        annotation = parts[0] if len(parts) == 1 else None
    return (annotation if annotation in _PLAIN else None), optional


@functools.cache
def fields_model(config_class: type) -> type[BaseModel]:
    """The pydantic model of an options dataclass's fields: every field optional (the dataclass keeps its
    defaults), unknown keys forbidden, plain-typed fields strict, others checked by the dataclass itself."""
    hints = get_type_hints(config_class)
    spec: dict[str, Any] = {}
    for f in fields(config_class):
        plain, optional = _plain(hints[f.name])
        kind: Any = Any if plain is None else (plain | None if optional else plain)
        spec[f.name] = (kind, None if f.default is MISSING else f.default)
    config = ConfigDict(extra="forbid", strict=True)
    return create_model(f"{config_class.__name__}Fields", __config__=config, **spec)


def _model_at(model: type[BaseModel] | None, path: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model of the mapping at ``path`` inside ``model`` (through optional, list and dict fields), or
    None where the path leads to no model."""
    for part in path:
        if model is None:
            return None
        if isinstance(part, int) or part not in model.model_fields:
            continue  # a list index or a dict key: the model of the items, found from the field before
        model = _model_of(model.model_fields[part].annotation)
    return model


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        if (found := _model_of(argument)) is not None:
            return found
    return None


def _describe(error: Mapping[str, Any], model: type[BaseModel] | None, unknown: str) -> str:
    """One pydantic error in lmembed's words (``unknown``: the message of an unknown key, a format string that
    may name the ``{key}`` and the ``{known}`` keys)."""
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        inner = _model_at(model, tuple(error["loc"][:-1]))
        known = ", ".join(inner.model_fields) if inner is not None else ""
        return unknown.format(key=error["loc"][-1], known=known or "none")
    if kind in _TYPE_ERRORS:
        optional = False
        name = error["loc"][0] if error["loc"] else None
        if model is not None and name in model.model_fields:
            optional = _plain(model.model_fields[name].annotation)[1]
        expected = _TYPE_ERRORS[kind]
        hint = " (YAML reads 2e-5 as text: write 2.0e-5)" if expected == "float" and _numeric_text(value) else ""
        return f"expected {expected}{' or null' if optional else ''}, got {value!r}{hint}"
    return str(error["msg"])


def _numeric_text(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return isinstance(value, str)


def schema_error(
    exc: ValidationError,
    where: Where,
    *,
    prefix: KeyPath = (),
    model: type[BaseModel] | None = None,
    unknown: str = "unknown key",
) -> Exception:
    """``where``'s error for a pydantic ``ValidationError``: one ``FILE:LINE: key.path: message`` per problem,
    unknown keys first (``unknown`` is their message), joined by ``; ``."""
    problems = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    parts = [f"{where((*prefix, *e['loc']))}: {_describe(e, model, unknown)}" for e in problems]
    return where.error_class("; ".join(parts))


def check_fields(
    config_class: type,
    data: Mapping[str, Any],
    where: Where,
    *,
    prefix: KeyPath = (),
    unknown: str = "unknown option",
) -> None:
    """Refuse keys of ``data`` that name no field of the dataclass ``config_class`` and values of the wrong
    plain type, as ``where``'s error (see :func:`schema_error`)."""
    model = fields_model(config_class)
    plain = {k: os.fspath(v) if isinstance(v, os.PathLike) else v for k, v in data.items()}
    try:
        model.model_validate(plain)
    except ValidationError as exc:
        raise schema_error(exc, where, prefix=prefix, model=model, unknown=unknown) from None


def check_keys(model: type[FileModel], data: Mapping[str, Any], where: Where, path: KeyPath, what: str) -> FileModel:
    """``data`` (a mapping at ``path`` in the file) checked against ``model``: an unknown key is ``where``'s error
    ``FILE:LINE: path.key: unknown WHAT key 'key'; known: ...``, a value of the wrong declared type names its key."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise schema_error(
            exc, where, prefix=path, model=model, unknown=f"unknown {what} key {{key!r}}; known: {{known}}"
        ) from None


__all__ = [
    "FileModel",
    "KeyPath",
    "RecordModel",
    "Where",
    "check_fields",
    "check_keys",
    "fields_model",
    "first_problem",
    "load_yaml_with_lines",
    "read_checked_json",
    "read_yaml_file",
    "schema_error",
]


def read_checked_json(path: Path, schema: type[BaseModel] | TypeAdapter, error: type[Exception], what: str) -> Any:
    """The JSON document of ``path`` (a file lmembed wrote: read as hostile), once ``schema`` accepts it; else
    ``error``: ``FILE: not readable JSON`` or ``FILE: key.path: message (not WHAT as lmembed writes it)`` for the
    first field that fails. Returns the document as read."""
    return check_json(read_json(path, error=error, what=what, kind=None), path, schema, error, what)


def check_json(data: Any, path: Path, schema: type[BaseModel] | TypeAdapter, error: type[Exception], what: str) -> Any:
    """:func:`read_checked_json` on a document already read from ``path`` (a reader that looks at one field first,
    a layout number, reads the file once)."""
    try:
        schema.validate_python(data) if isinstance(schema, TypeAdapter) else schema.model_validate(data)
    except ValidationError as exc:
        raise error(f"{path}: {first_problem(exc)} (not {what} as lmembed writes it)") from exc
    return data


def first_problem(exc: ValidationError) -> str:
    """``key.path: message`` of the first problem pydantic found in a document (``the whole file`` at its top); the
    member of a union that pydantic tried (``dict[str,any]``) is not part of the path."""
    first = exc.errors()[0]
    path = [str(part) for part in first["loc"] if not (isinstance(part, str) and "[" in part)]
    message = first["msg"].removeprefix("Value error, ")  # a validator's own words, without pydantic's label
    return f"{'.'.join(path) or 'the whole file'}: {message}"
