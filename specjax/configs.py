"""Typed configs: frozen dataclasses loaded from YAML, overridable with `--set key=value`.

Unknown keys and wrongly typed values fail loudly with the dotted path of the field, so a
typo in an experiment config never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError(errors[0])
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        return from_dict(hint, value, where)
    if origin in (list, tuple):
        (item,) = typing.get_args(hint)[:1] or (Any,)
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        items = [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if hint is Any:
        return value
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint is bool and not isinstance(value, bool):
        raise ValueError(f"{where}: expected true or false, got {value!r}")
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{where}: expected an integer, got {value!r}")
    if hint in (str, float) and not isinstance(value, hint):
        raise ValueError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def from_dict(cls: type[T], data: dict, where: str = "") -> T:
    """Build dataclass `cls` from a nested mapping, checking names and types."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - fields)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ValueError(f"unknown config key {prefix}{unknown[0]}; valid keys here: {', '.join(sorted(fields))}")
    required = [
        f.name for f in dataclasses.fields(cls) if f.init and f.default is f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in data]  # e.g. a config's dataset: with no path
    if missing:
        raise ValueError(f"missing config key {where + '.' if where else ''}{missing[0]} (no default)")
    values = {name: _coerce(value, hints[name], f"{where}.{name}" if where else name) for name, value in data.items()}
    return cls(**values)


def to_dict(config) -> dict:
    return dataclasses.asdict(config)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """`a.b=value` entries, values parsed as YAML (so 3, 0.5, true, [1, 2] work)."""
    data = dict(data)
    for override in overrides:
        if "=" not in override:
            raise ValueError(f"override {override!r} must look like key.path=value")
        path, raw = override.split("=", 1)
        keys = path.strip().split(".")
        node = data
        for key in keys[:-1]:
            node[key] = dict(node.get(key) or {})
            node = node[key]
        node[keys[-1]] = parse_yaml(raw, f"--set {override}")
    return data


def yaml_error(error: yaml.YAMLError, source: str) -> ValueError:
    """A one-line error naming the file (or flag), line and column of a YAML syntax error."""
    mark = getattr(error, "problem_mark", None)
    where = source if mark is None else f"{source}, line {mark.line + 1}, column {mark.column + 1}"
    problem = getattr(error, "problem", None) or str(error)
    return ValueError(" ".join(f"{where}: YAML syntax error: {problem}".split()))


def parse_yaml(text: str, source: str):
    """yaml.safe_load, with a syntax error as a ValueError naming `source` and the line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise yaml_error(error, source) from None


def read_yaml(path: str | Path) -> dict:
    """The mapping a YAML config file holds; clear errors for a missing file, bad syntax, or a non-mapping."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    data = parse_yaml(path.read_text(), str(path)) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping")
    return data


def load_config(cls: type[T], path: str | Path | None, overrides: list[str] = ()) -> T:
    """Load `cls` from a YAML file (or from defaults when path is None), then apply overrides."""
    data = {} if path is None else read_yaml(path)
    return from_dict(cls, apply_overrides(data, list(overrides)))


def dump_config(config, path: Path) -> None:
    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
