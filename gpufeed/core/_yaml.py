"""The one YAML reader for files a user (or an attacker) hands gpufeed: bounded before it is parsed.

gpufeed's config, a DeepEthogram project's ``project_config.yaml`` and each ``record.yaml`` go
through :func:`read_yaml`. PyYAML's ``safe_load`` runs no code, but nothing else stops it: a
369-byte file of nested anchors ("billion laughs") loads as a small graph of shared lists that
expands to a billion strings the moment anything walks it (a copy, a ``repr`` in an error
message), and a file of a million ``[`` exhausts the parser's recursion. So, before a value is
built:

* the file is read up to :data:`YAML_MAX_BYTES` (a config is a few KB) and must be UTF-8;
* composing stops past :data:`YAML_MAX_ALIASES` aliases (``*name``) or :data:`YAML_MAX_DEPTH`
  levels of nesting;
* the composed graph's *expanded* size (every alias counted as the copy it stands for, computed
  once per node, so a billion is found in a few hundred steps) must stay under
  :data:`YAML_MAX_VALUES`, and an alias inside its own anchor (a cycle) is refused.

Numbers read as YAML 1.2 reads them: ``3e-4`` and ``1.5e3`` are floats, as every YAML 1.2 parser
(and JSON) reads them, where YAML 1.1's resolver, PyYAML's, asks for a dot and a signed exponent
(``3.0e-4``) and reads the usual spelling as the *string* ``'3e-4'`` that the config then refused.

Errors are :class:`YamlError`, one line naming the file, the rule and the line number, never the
file's text (PyYAML's own messages quote the offending line; only their problem and position
are kept).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gpufeed.core._object_path import ObjectPath
from gpufeed.core._storage import data_path, open_binary

__all__ = [
    "YAML_MAX_ALIASES",
    "YAML_MAX_BYTES",
    "YAML_MAX_DEPTH",
    "YAML_MAX_VALUES",
    "YamlError",
    "parse_yaml",
    "read_yaml",
]

YAML_MAX_BYTES = 1 << 20  # 1 MiB: DeepEthogram's project_config.yaml is about 3 KB, a training config less
YAML_MAX_ALIASES = 100  # configs seldom hold any; PyYAML's dump writes one per repeated object
YAML_MAX_DEPTH = 64  # nesting levels; Python's recursion limit is far above
YAML_MAX_VALUES = 100_000  # scalars, lists and mappings after expanding every alias
_PROBLEM_CHARS = 120


class YamlError(ValueError):
    """A YAML file or text refused: unreadable, too large, not UTF-8, not YAML, or past a budget."""


class _Refused(Exception):
    def __init__(self, why: str, mark) -> None:
        super().__init__(why)
        self.why, self.mark = why, mark


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that counts aliases and nesting while composing (see the module docs)."""

    def __init__(self, stream: str, max_aliases: int, max_depth: int) -> None:
        super().__init__(stream)
        self._aliases, self._depth = 0, 0
        self._max_aliases, self._max_depth = max_aliases, max_depth

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self._max_aliases:
                raise _Refused(f"more than {self._max_aliases} aliases (*name)", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > self._max_depth:
                raise _Refused(f"nested deeper than {self._max_depth} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# The exponent forms YAML 1.1's float resolver misses (no dot, or an unsigned exponent); PyYAML's
# float constructor reads them as Python's float() does.
_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expanded_size(root, limit: int) -> None:
    """Refuse a graph whose aliases expand past ``limit`` values, or that contains itself.

    Post-order over distinct nodes (an alias is the node it names, met again): each node's
    expanded size is computed once, so the cost is the file's size, never the expansion's.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the nodes whose children are still being sized: the current path
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            if total > limit:
                raise _Refused(f"its aliases expand to more than {limit:,} values", node.start_mark)
            sizes[key] = total
        elif key in open_nodes:
            raise _Refused("an alias refers to a node that contains it (a cycle)", node.start_mark)
        elif key not in sizes:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def _where(mark) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def parse_yaml(
    text: str,
    source: str,
    *,
    max_aliases: int = YAML_MAX_ALIASES,
    max_depth: int = YAML_MAX_DEPTH,
    max_values: int = YAML_MAX_VALUES,
) -> Any:
    """Parse one YAML document like ``yaml.safe_load``, within the budgets of the module docs.

    Args:
        text: The document.
        source: What it is, for messages (``"config file train.yaml"``).

    Raises:
        YamlError: ``"<source> is not valid YAML: <problem> at line L, column C"``, or the budget
            it broke; never quoting the text.
    """
    loader = None
    try:
        loader = _BoundedLoader(text, max_aliases, max_depth)  # its reader refuses control characters at once
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded_size(node, max_values)
        return loader.construct_document(node)
    except _Refused as refused:
        raise YamlError(f"{source} is refused: {refused.why}{_where(refused.mark)}") from None
    except yaml.MarkedYAMLError as err:
        # PyYAML's problem may hold a name from the text (an anchor, a tag): cut, as any quoted value.
        problem = " ".join(", ".join(str(part) for part in (err.context, err.problem) if part).split())
        problem = problem if len(problem) <= _PROBLEM_CHARS else problem[: _PROBLEM_CHARS - 3] + "..."
        raise YamlError(f"{source} is not valid YAML: {problem}{_where(err.problem_mark)}") from None
    except yaml.reader.ReaderError as err:
        code = err.character if isinstance(err.character, int) else ord(err.character[:1] or b"\0")
        raise YamlError(
            f"{source} is not valid YAML: {err.reason}: character #x{code:04x} at offset {err.position}"
        ) from None
    except yaml.YAMLError as err:  # no position to show
        raise YamlError(f"{source} is not valid YAML: {type(err).__name__}") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml(path: str | Path | ObjectPath, what: str, *, max_bytes: int = YAML_MAX_BYTES) -> Any:
    """Read and parse the YAML file ``path`` (:func:`parse_yaml`), at most ``max_bytes`` of it.

    Args:
        what: What the file is, starting the messages (``"config file"``, ``"record"``).

    Raises:
        YamlError: One line naming ``what``, the path and what is wrong.
    """
    path = data_path(path)
    try:
        with open_binary(path) as fh:  # s3://: a ranged read of at most max_bytes + 1
            data = fh.read(max_bytes + 1)
    except OSError as err:
        raise YamlError(f"cannot read {what} {path}: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise YamlError(f"{what} {path} is larger than {max_bytes:,} bytes, the limit for a YAML file; refused unread")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise YamlError(
            f"{what} {path} is not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start} (line {line})"
        ) from None
    return parse_yaml(text, f"{what} {path}")
