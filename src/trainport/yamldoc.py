"""YAML documents from users (job files, selection specs), read with bounded aliases.

YAML lets a document name a node (``&a``) and repeat it (``*a``). The parser shares the
repeated node, so reading stays cheap, but everything that walks the result afterwards
(validation, JSON encoding, an error message that shows a value) sees every repetition:
nine aliases of nine aliases of nine ... make a few hundred bytes stand for billions of
values. :func:`load_yaml` counts the nodes the document stands for once its aliases are
expanded and refuses one past :data:`MAX_EXPANDED_NODES` beyond what it spells out, and
a node that contains itself, each with one line.
"""

from __future__ import annotations

from typing import Any

import yaml

from trainport.errors import ValidationError

__all__ = ["MAX_EXPANDED_NODES", "load_yaml"]

#: How many more nodes than it spells out a document may stand for through aliases; a
#: job file that repeats its channel settings a few times stays far below.
MAX_EXPANDED_NODES = 10_000


def load_yaml(text: str, source: str) -> Any:
    """The document in ``text``, or a ValidationError naming ``source`` (e.g. "the job file
    x.yaml") when it is not YAML or expands its aliases past the limit."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        written = _size(node, limit=None)
        if written is None or _size(node, limit=written + MAX_EXPANDED_NODES, expand=True) is None:
            raise ValidationError(
                f"{source} repeats YAML aliases (*name) to more than {MAX_EXPANDED_NODES} "
                "values beyond what it spells out, or inside themselves; write the repeated "
                "parts out or repeat less"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ValidationError(f"{source} is not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise ValidationError(f"{source} nests its values too deeply to read") from exc
    finally:
        loader.dispose()


class _TooLarge(Exception):
    """Measuring stopped: past the limit, or a node that contains itself (endless)."""


def _size(root: yaml.Node, *, limit: int | None, expand: bool = False) -> int | None:
    """How many nodes ``root`` holds: each node once, or with ``expand`` once per way of
    reaching it, as a reader of the loaded value meets it. None past ``limit`` or on a node
    that contains itself. Each node's size is worked out once, so a bomb is measured in
    time linear in its text."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key] if expand else 0
        if key in open_nodes:
            raise _TooLarge
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        open_nodes.discard(key)
        sizes[key] = total
        if limit is not None and total > limit:
            raise _TooLarge
        return total

    try:
        return size(root)
    except _TooLarge:
        return None
