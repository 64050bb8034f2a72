"""Frozen-dataclass schema machinery: YAML mappings in, validated objects out.

Every config section in gpufeed is a frozen dataclass. This module turns plain mappings (as
``yaml.safe_load`` returns them) into those dataclasses, rejecting unknown keys, wrong types and
out-of-range values with an error that names the key path, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from gpufeed.core._object_path import ObjectPath, url_scheme
from gpufeed.core._text import quoted


class ConfigError(ValueError):
    """A config value is missing, unknown, of the wrong type or out of range.

    Attributes:
        key_path: Dotted path of the offending key, e.g. ``loader.batch_size``.
    """

    def __init__(self, key_path: str, message: str) -> None:
        self.key_path = key_path
        self.message = message
        super().__init__(f"config key '{key_path or '<root>'}': {message}")


def option(
    default: Any = dataclasses.MISSING,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    doc: str = "",
    convert: typing.Callable[[Any, str], Any] | None = None,
) -> Any:
    """A dataclass field with numeric bounds that :func:`from_mapping` enforces.

    Args:
        default: Default value; mutable defaults are not allowed (configs are frozen).
        ge, gt, le, lt: Inclusive/exclusive bounds for numbers (and for each item of a tuple).
        doc: One-line description, shown by ``gpufeed config --describe``.
        convert: ``convert(value, key_path)`` reads the raw value instead of the field's type, for
            a value with more than one spelling (``size_px``: ``224`` or ``[352, 224]``); it
            raises :class:`ConfigError` itself, and the bounds are checked on what it returns.
    """
    meta = {"ge": ge, "gt": gt, "le": le, "lt": lt, "doc": doc, "convert": convert}
    return dataclasses.field(default=default, metadata=meta)


def check_ranges(section: Any, *names: str) -> None:
    """Reject a ``(low, high)`` field whose low end is above its high end.

    Bounds on each end are checked by :func:`from_mapping`; the order of the two ends is not a
    bound, so a section's ``__post_init__`` calls this for its range fields.

    Args:
        section: The config dataclass being built.
        names: Its ``(low, high)`` fields.

    Raises:
        ConfigError: A range is empty; the key is the field's name.
    """
    for name in names:
        lo, hi = getattr(section, name)
        if lo > hi:
            raise ConfigError(name, f"range {[lo, hi]} is empty: the first value must be <= the second")


def _describe_type(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_describe_type(a) for a in get_args(tp))
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {_describe_type(args[0])}"
        return f"list of {len(args)} ({', '.join(_describe_type(a) for a in args)})"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    if tp is Path:
        return "path"
    if tp is ObjectPath:
        return "s3:// URL"
    if isinstance(tp, type) and hasattr(tp, "config_value"):  # SizePx, read by its own convert
        return "int | list of 2 (int, int)"
    return getattr(tp, "__name__", str(tp))


def _check_bounds(value: Any, meta: typing.Mapping[str, Any], key: str) -> None:
    for bound, ok, words in (
        ("ge", lambda v, b: v >= b, ">="),
        ("gt", lambda v, b: v > b, ">"),
        ("le", lambda v, b: v <= b, "<="),
        ("lt", lambda v, b: v < b, "<"),
    ):
        limit = meta.get(bound)
        if limit is None:
            continue
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if isinstance(item, (int, float)) and not ok(item, limit):
                raise ConfigError(key, f"value {quoted(value)} is out of range: must be {words} {limit}")


# The words YAML 1.1 (PyYAML's safe loader) reads as booleans, by the boolean they become.
_YAML_BOOL_WORDS = {True: ("on", "yes", "true", "y"), False: ("off", "no", "false", "n")}


def _convert(value: Any, tp: Any, key: str) -> Any:
    origin = get_origin(tp)
    if origin is Literal:
        allowed = get_args(tp)
        if isinstance(value, bool) and all(isinstance(a, str) for a in allowed):
            # `amp: off` arrives as False: the allowed word it was written as, where only one fits.
            words = [a for a in allowed if a.lower() in _YAML_BOOL_WORDS[value]]
            if value and not words and "off" in allowed:
                # `compile: true`, as HF's Trainer and Lightning take their switches: the first mode that is on.
                words = [a for a in allowed if a != "off"][:1]
            value = words[0] if len(words) == 1 else value
        if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            raise ConfigError(key, f"value {quoted(value)} is not allowed; allowed: {', '.join(map(str, allowed))}")
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ConfigError(key, f"null is not allowed; expected {_describe_type(tp)}")
        errors = {}
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key)
            except ConfigError as err:
                errors[arg] = err
        if len(errors) == 1:
            raise next(iter(errors.values()))
        if ObjectPath in errors and isinstance(value, str) and url_scheme(value):  # a URL: what is wrong with it
            raise errors[ObjectPath]
        raise ConfigError(key, f"value {quoted(value)} is not a {_describe_type(tp)}")
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected {_describe_type(tp)}, got {quoted(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(key, f"expected {_describe_type(tp)}, got {len(value)} items")
        return tuple(_convert(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, key)
    if value is None:
        raise ConfigError(key, f"null is not allowed; expected {_describe_type(tp)}")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {quoted(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {quoted(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {quoted(value)}")
        if not math.isfinite(value):  # YAML's .inf and .nan: no setting means them (lr .inf trained to NaN)
            raise ConfigError(key, f"expected a finite number, got {quoted(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {quoted(value)}")
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)) or str(value) == "":
            raise ConfigError(key, f"expected a path, got {quoted(value)}")
        if isinstance(value, str) and url_scheme(value):
            # pathlib would read s3://b/k as the folder s3:/b/k; only dataset roots take URLs.
            raise ConfigError(key, f"expected a local path, got the URL {quoted(value)}")
        return Path(value)
    if tp is ObjectPath:
        try:
            return value if isinstance(value, ObjectPath) else ObjectPath(str(value))
        except ValueError as err:
            raise ConfigError(key, str(err)) from None
    raise TypeError(f"unsupported config field type {tp!r} at {key}")  # a schema bug, not user input


def from_mapping(cls: type, data: Any, key_path: str = "") -> Any:
    """Build the frozen dataclass ``cls`` from a mapping, validating every key.

    Args:
        cls: A dataclass type whose fields use the types this module understands (bool, int,
            float, str, Path, Literal, Optional, tuples and nested dataclasses).
        data: The mapping to read; ``None`` means "all defaults".
        key_path: Dotted path of ``data`` inside the whole config, for error messages.

    Raises:
        ConfigError: Naming the key path, the bad value and what is allowed.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(key_path, f"expected a mapping of keys to values, got {quoted(data)}")
    hints = get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(map(str, data)) - set(known))
    if unknown:
        where = f"{key_path}.{unknown[0]}" if key_path else unknown[0]
        raise ConfigError(where, f"unknown key; allowed keys here: {', '.join(sorted(known))}")
    kwargs = {}
    for name, fld in known.items():
        sub = f"{key_path}.{name}" if key_path else name
        if name not in data:
            no_default = fld.default is dataclasses.MISSING
            if no_default and fld.default_factory is dataclasses.MISSING:
                raise ConfigError(sub, f"required key is missing ({_describe_type(hints[name])})")
            continue
        convert = fld.metadata.get("convert")
        value = convert(data[name], sub) if convert else _convert(data[name], hints[name], sub)
        _check_bounds(value, fld.metadata, sub)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except ConfigError as err:
        # __post_init__ checks name keys relative to their own section; root them here.
        full = ".".join(p for p in (key_path, err.key_path) if p)
        raise ConfigError(full, err.message) from None


def to_mapping(obj: Any) -> Any:
    """The inverse of :func:`from_mapping`: plain dicts, lists, strings and numbers."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "config_value"):  # a value with several spellings (SizePx): written as users write it
        return to_mapping(obj.config_value())
    if isinstance(obj, tuple):
        return [to_mapping(v) for v in obj]
    if isinstance(obj, (Path, ObjectPath)):
        return str(obj)
    return obj


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """Rows of (key path, type, default, doc) for every leaf of a config schema."""
    rows = []
    hints = get_type_hints(cls)
    for fld in dataclasses.fields(cls):
        key = f"{prefix}{fld.name}"
        tp = hints[fld.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, key + "."))
            continue
        default = fld.default if fld.default is not dataclasses.MISSING else "(required)"
        rows.append((key, _describe_type(tp), repr(to_mapping(default)), fld.metadata.get("doc", "")))
        # An optional section (data.train: null until given) lists its own keys under it.
        for arg in get_args(tp) if get_origin(tp) in (Union, types.UnionType) else ():
            if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                rows.extend(describe(arg, key + "."))
    return rows
