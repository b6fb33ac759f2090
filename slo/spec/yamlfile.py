"""YAML loading that remembers line numbers and refuses duplicate keys.

PyYAML keeps the last of two equal keys silently; in an SLO spec that hides a second tier or a
second threshold, so a duplicate key is an error here. Mappings and lists come back as dict and
list subclasses that know the line of each key and item, so errors can say `slo.yaml:14`.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode


class LineDict(dict[Any, Any]):
    """A mapping that knows its own line and the line of each key (1-based)."""

    line: int = 0
    key_lines: dict[Any, int]

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line)


class LineList(list[Any]):
    """A list that knows its own line and the line of each item (1-based)."""

    line: int = 0
    item_lines: list[int]

    def line_of(self, index: int) -> int:
        return self.item_lines[index] if index < len(self.item_lines) else self.line


class DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: object, line: int, first_line: int) -> None:
        super().__init__(f"duplicate key {key!r} (first on line {first_line})")
        self.key = key
        self.line = line
        self.first_line = first_line


class _LineLoader(yaml.SafeLoader):
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> LineDict:  # type: ignore[override]
        mapping = LineDict()
        mapping.line = node.start_mark.line + 1
        mapping.key_lines = {}
        self.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            if not isinstance(key, str | int | float | bool) and key is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, "mapping keys must be plain words", key_node.start_mark
                )
            line = key_node.start_mark.line + 1
            if key in mapping.key_lines:
                raise DuplicateKeyError(key, line, mapping.key_lines[key])
            mapping.key_lines[key] = line
            mapping[key] = self.construct_object(value_node, deep=True)  # type: ignore[no-untyped-call]
        return mapping

    def construct_line_sequence(self, node: SequenceNode) -> LineList:
        items = LineList(self.construct_object(child, deep=True) for child in node.value)  # type: ignore[no-untyped-call]
        items.line = node.start_mark.line + 1
        items.item_lines = [child.start_mark.line + 1 for child in node.value]
        return items


def _construct_mapping(loader: _LineLoader, node: Node) -> LineDict:
    assert isinstance(node, MappingNode)
    return loader.construct_mapping(node)


def _construct_sequence(loader: _LineLoader, node: Node) -> LineList:
    assert isinstance(node, SequenceNode)
    return loader.construct_line_sequence(node)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_documents(text: str) -> list[Any]:
    """Every YAML document in `text` (OpenSLO files often hold several)."""
    return list(
        yaml.load_all(text, Loader=_LineLoader)
    )  # a SafeLoader subclass: no arbitrary objects


def error_line(error: yaml.YAMLError) -> int:
    """The 1-based line a YAML error points at, 0 when it points nowhere."""
    if isinstance(error, DuplicateKeyError):
        return error.line
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    return mark.line + 1 if mark is not None else 0


def error_problem(error: yaml.YAMLError) -> str:
    """The YAML error in a few words, without PyYAML's multi-line excerpt."""
    if isinstance(error, DuplicateKeyError):
        return str(error)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    return f"{context}: {problem}" if context else str(problem)
