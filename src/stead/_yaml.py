"""YAML files validated by pydantic models, with every error pointing at `file:line:`.

The file is parsed twice: `yaml.compose` gives the node tree (with line marks) and the constructed data is
validated by a pydantic model. A pydantic error location (`("tools", 1)`) is mapped back to the node it
names by walking the tree, so the message can say which line is wrong. Used by agent definitions and by
scripted model files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from stead.errors import DefinitionError

__all__ = [
    "MAX_YAML_DEPTH",
    "MAX_YAML_VALUES",
    "YamlDocument",
    "line_of",
    "load_yaml_model",
    "parse_yaml",
    "read_yaml",
    "validation_error",
]

M = TypeVar("M", bound=pydantic.BaseModel)


class YamlDocument:
    """The parsed data of one YAML file and its node tree."""

    def __init__(self, path: Path, data: Any, root: yaml.Node | None) -> None:
        self.path = path
        self.data = data
        self.root = root

    def line(self, loc: Sequence[int | str], *, key: bool = False) -> int:
        """The 1-based line of the node at `loc` (of its key when `key`), or of its nearest ancestor."""
        return line_of(self.root, loc, key=key)

    def error(self, message: str, loc: Sequence[int | str] = (), *, key: bool = False) -> DefinitionError:
        return DefinitionError(message, path=str(self.path), line=self.line(loc, key=key))


def line_of(root: yaml.Node | None, loc: Sequence[int | str], *, key: bool = False) -> int:
    """Walk mappings (by key) and sequences (by index) along `loc`; return the deepest line reached."""
    if root is None:
        return 1
    node: yaml.Node = root
    line = node.start_mark.line + 1
    for part in loc:
        child: yaml.Node | None = None
        key_node: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == str(part):
                    key_node, child = k, v
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node = child
        line = (key_node if key and key_node is not None and part == loc[-1] else child).start_mark.line + 1
    return line


def read_yaml(path: str | Path, *, what: str = "file") -> YamlDocument:
    """Read and parse a YAML file; syntax errors and unreadable files become `DefinitionError`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DefinitionError(f"{what} not found", path=str(p)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise DefinitionError(f"cannot read {what}: {e}", path=str(p)) from None
    root, data = parse_yaml(text, str(p))
    doc = YamlDocument(p, data, root)
    _check_duplicate_keys(doc, root)
    return doc


def parse_yaml(text: str, path: str | None = None) -> tuple[yaml.Node | None, Any]:
    """The node tree and the data of one YAML document (safe tags only). SEC6k3: a document whose aliases
    (`*name` of an `&name` anchor) would expand it past `MAX_YAML_VALUES` values is refused before it is
    constructed or walked — a few hundred bytes of nested aliases can otherwise stand for billions of
    values ("billion laughs"); one nested past `MAX_YAML_DEPTH` levels is refused too."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except RecursionError:
            raise DefinitionError(
                f"the YAML nests more than {MAX_YAML_DEPTH} levels deep", path=path
            ) from None
        if root is not None:
            _check_expansion(root, path)
            data = loader.construct_document(root)
        else:
            data = None
    except yaml.MarkedYAMLError as e:
        raise _syntax_error(Path(path or "<text>"), e) from None
    except yaml.YAMLError as e:
        raise DefinitionError(f"YAML error: {e}", path=path, line=1) from None
    finally:
        loader.dispose()
    return root, data


MAX_YAML_VALUES = 100_000
"""SEC6k3: values a YAML document may stand for once its aliases are expanded."""
MAX_YAML_DEPTH = 100
"""SEC6k3: how deeply a YAML document may nest."""


def _check_expansion(root: yaml.Node, path: str | None) -> None:
    """Count the values `root` stands for with every alias expanded (each node's count is computed once, so
    this costs the size of the node graph, not of its expansion); refuse past the limits."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # nodes whose children are being counted (an alias to one is a cycle)
    # iterative post-order: (node, depth, children done)
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if not done:
            if id(node) in open_:
                raise DefinitionError(
                    "the YAML refers to itself through an alias", path=path, line=node.start_mark.line + 1
                )
            open_.add(id(node))
            if depth > MAX_YAML_DEPTH:
                raise DefinitionError(
                    f"the YAML nests more than {MAX_YAML_DEPTH} levels deep",
                    path=path,
                    line=node.start_mark.line + 1,
                )
            stack.append((node, depth, True))
            stack.extend((c, depth + 1, False) for c in children if id(c) not in sizes)
            continue
        total = 1 + sum(sizes.get(id(c), 0) for c in children)
        if total > MAX_YAML_VALUES:
            raise DefinitionError(
                f"the YAML stands for more than {MAX_YAML_VALUES:,} values once its aliases (*name) are "
                "expanded: refused (anchors and aliases may repeat a value, not multiply a document)",
                path=path,
                line=node.start_mark.line + 1,
            )
        sizes[id(node)] = total
        open_.discard(id(node))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _syntax_error(path: Path, e: yaml.MarkedYAMLError) -> DefinitionError:
    """Point at the line where the problem starts. Usually that is the problem mark; but when the parser
    ran into the end of the file (an unterminated quote or bracket), the problem mark is the last line and
    the context mark — where the unclosed construct began — is the useful one."""
    problem = e.problem or ""
    if e.context_mark is not None and e.context and ("end of stream" in problem or "<stream end>" in problem):
        what = e.context.removeprefix("while scanning ").removeprefix("while parsing ")
        end = f" at line {e.problem_mark.line + 1}" if e.problem_mark is not None else ""
        problem = problem.replace("<stream end>", "the end of the file")
        return DefinitionError(
            f"YAML syntax error: {what} starts here and is never closed ({problem}{end})",
            path=str(path),
            line=e.context_mark.line + 1,
        )
    mark = e.problem_mark or e.context_mark
    line = mark.line + 1 if mark is not None else 1
    text = "; ".join(x for x in (e.context, e.problem) if x) or "invalid YAML"
    return DefinitionError(f"YAML syntax error: {text}", path=str(path), line=line)


def _check_duplicate_keys(doc: YamlDocument, node: yaml.Node | None) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                if k.value in seen:
                    raise DefinitionError(
                        f"duplicate key {k.value!r}", path=str(doc.path), line=k.start_mark.line + 1
                    )
                seen.add(k.value)
            _check_duplicate_keys(doc, v)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_duplicate_keys(doc, item)


def _field(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_error(doc: YamlDocument, error: pydantic.ValidationError) -> DefinitionError:
    """The first validation error as `file:line: field: message` (later ones listed after it)."""
    problems: list[tuple[int, str]] = []
    for err in error.errors(include_url=False):
        # drop the tagged-union / function-validator markers pydantic inserts into locations
        loc = [p for p in err["loc"] if isinstance(p, int) or not str(p).startswith(("function-", "tagged-"))]
        kind = err["type"]
        if kind == "extra_forbidden":
            line = doc.line(loc, key=True)
            parent = _field(loc[:-1])
            msg = f"unknown key {loc[-1]!r}" + (f" in {parent}" if parent else "")
        elif kind == "missing":
            line = doc.line(loc[:-1])
            msg = f"{_field(loc)}: required field is missing"
        else:
            line = doc.line(loc)
            text = str(err["msg"])
            if text.startswith("Value error, "):
                text = text[len("Value error, ") :]
            field = _field(loc) or "(document)"
            msg = f"{field}: {text}"
        problems.append((line, msg))
    line, first = problems[0]
    more = [f"{doc.path}:{ln}: {m}" for ln, m in problems[1:]]
    if more:
        first += " (also: " + "; ".join(more) + ")"
    return DefinitionError(first, path=str(doc.path), line=line)


def load_yaml_model(path: str | Path, model: type[M], *, what: str = "file") -> tuple[M, YamlDocument]:
    """Parse `path` and validate it as `model`; every problem is a `DefinitionError` with file and line."""
    doc = read_yaml(path, what=what)
    if doc.data is None:
        raise doc.error(f"{what} is empty")
    if not isinstance(doc.data, dict):
        raise doc.error(f"{what} must be a YAML mapping (key: value lines), not {type(doc.data).__name__}")
    try:
        value = model.model_validate(doc.data)
    except pydantic.ValidationError as e:
        raise validation_error(doc, e) from None
    return value, doc
