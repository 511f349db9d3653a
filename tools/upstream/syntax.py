"""Questions about single syntax nodes of vLLM's sources: a function's parameters, its decorators, whether it is
an async generator, a literal default, the names a statement binds, the text at a line; and the records of a
parsed file (:class:`Module`) and a class statement in it (:class:`ClassRef`). :mod:`.source` walks modules and
classes with these."""

from __future__ import annotations

import ast
import bisect
import itertools
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from vllm_hogwild.patches.points import NO_DEFAULT


@dataclass
class Module:
    """One parsed source file."""

    name: str
    path: Path
    relative_path: str  # path shown in reports ("vllm/v1/request.py")
    tree: ast.Module
    source: str
    is_package: bool

    @property
    def package(self) -> str:
        return self.name if self.is_package else self.name.rpartition(".")[0]

    def at(self, node: ast.AST | None) -> str:
        """``"vllm/x.py:12"``: where ``node`` starts (the file alone for no node)."""
        return f"{self.relative_path}:{getattr(node, 'lineno', 1)}" if node is not None else self.relative_path


@dataclass
class ClassRef:
    """A class statement and the module it is in."""

    module: Module
    node: ast.ClassDef

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def identity(self) -> tuple[str, int]:
        return self.module.relative_path, self.node.lineno

    def at(self) -> str:
        return self.module.at(self.node)


@dataclass
class External:
    """A base class outside the tree (``msgspec.Struct``, ``BaseModel``, ``ABC``...): its dotted name."""

    name: str



_BLOCKS = (ast.If, ast.Try, ast.With, ast.AsyncWith, ast.For) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def body_statements(body: Sequence[ast.stmt]) -> Iterable[ast.stmt]:
    """Statements of a module or class body, looking inside if/try/with blocks."""
    for statement in body:
        yield statement
        if isinstance(statement, _BLOCKS):
            for part in ("body", "orelse", "finalbody"):
                yield from body_statements(getattr(statement, part, ()) or ())
            for handler in getattr(statement, "handlers", ()) or ():
                yield from body_statements(handler.body)


def bound_names(statement: ast.stmt) -> list[str]:
    """The names a module-level statement binds."""
    if isinstance(statement, (ast.ClassDef, *_FUNCTIONS)):
        return [statement.name]
    if isinstance(statement, ast.Assign):
        return [node.id for target in statement.targets for node in ast.walk(target) if isinstance(node, ast.Name)]
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        return [statement.target.id]
    if isinstance(statement, ast.ImportFrom):
        return [alias.asname or alias.name for alias in statement.names if alias.name != "*"]
    if isinstance(statement, ast.Import):
        return [alias.asname or alias.name.split(".")[0] for alias in statement.names]
    return []


def binding_rank(statement: ast.stmt) -> int:
    """Which binding of a name to believe: a definition over an import over an assignment."""
    if isinstance(statement, (ast.ClassDef, *_FUNCTIONS)):
        return 3
    if isinstance(statement, (ast.ImportFrom, ast.Import)):
        return 2
    return 1 if isinstance(statement, ast.AnnAssign) and statement.value is None else 2


def decorator_names(node: ast.AST) -> list[str]:
    """``@functools.cache`` -> "cache"; ``@x.setter`` -> "setter" and "property-setter"."""
    names = []
    for decorator in getattr(node, "decorator_list", ()):
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name):
            names.append(target.id)
        elif isinstance(target, ast.Attribute):
            names.append(target.attr)
            if isinstance(target.value, ast.Name) and target.attr in ("setter", "getter", "deleter"):
                names.append("property-" + target.attr)
    return names


def pick_function(nodes: list[ast.AST]) -> ast.AST | None:
    """The definition that counts among several of one name: the last one that is not an ``@overload``."""
    functions = [node for node in nodes if isinstance(node, _FUNCTIONS)]
    real = [node for node in functions if "overload" not in decorator_names(node)]
    getters = [node for node in real if not any(name.startswith("property-") for name in decorator_names(node))]
    return (getters or real or functions or [None])[-1]


def signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[list[str], list[str], dict[str, ast.expr]]:
    """(positional names, all names as inspect lists them incl. '*args'/'**kw', default expressions by name)."""
    arguments = node.args
    positional = [argument.arg for argument in arguments.posonlyargs + arguments.args]
    names = list(positional)
    if arguments.vararg:
        names.append("*" + arguments.vararg.arg)
    names += [argument.arg for argument in arguments.kwonlyargs]
    if arguments.kwarg:
        names.append("**" + arguments.kwarg.arg)
    defaults: dict[str, ast.expr] = {}
    with_position = arguments.posonlyargs + arguments.args
    for argument, default in zip(with_position[len(with_position) - len(arguments.defaults):], arguments.defaults):
        defaults[argument.arg] = default
    for argument, default in zip(arguments.kwonlyargs, arguments.kw_defaults):
        if default is not None:
            defaults[argument.arg] = default
    return positional, names, defaults


def _yields(node: ast.AST) -> bool:
    """Whether the function itself (not a nested one) yields."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        if isinstance(child, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(child, (*_FUNCTIONS, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(child))
    return False


def call_kind(node: ast.AST) -> str:
    """"sync", "async" or "asyncgen"."""
    if isinstance(node, ast.AsyncFunctionDef):
        return "asyncgen" if _yields(node) else "async"
    return "sync"


def _first_parameter(function: ast.AST) -> str:
    if isinstance(function, _FUNCTIONS) and function.args.args:
        return function.args.args[0].arg
    return "self"


@lru_cache(maxsize=None)
def self_assignments(function: ast.AST) -> dict[str, ast.AST]:
    """Attributes ``self.x`` assigned (``=``, ``: T =``, ``+=``, ``setattr(self, "x", ...)``) in a function."""
    found: dict[str, ast.AST] = {}
    first = _first_parameter(function)

    def note(target: ast.AST, statement: ast.AST) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == first:
                found.setdefault(node.attr, statement)

    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, (ast.Attribute, ast.Tuple, ast.List, ast.Starred)):
                    note(target, node)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            note(node.target, node)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) and node.args[0].id == first
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            found.setdefault(node.args[1].value, node)
    return found


def self_calls(function: ast.AST) -> set[str]:
    """The methods a function calls on its first parameter (``self.helper()``)."""
    first = function.args.args[0].arg if function.args.args else "self"
    return {node.func.attr for node in ast.walk(function)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == first}


def is_classvar(annotation: ast.expr) -> bool:
    return "ClassVar" in ast.unparse(annotation)


def literal(node: ast.expr | None) -> Any:
    """The value of a literal expression, or of ``field(default=...)``; :data:`NO_DEFAULT` when there is none."""
    if node is None:
        return NO_DEFAULT
    if isinstance(node, ast.Call):  # field(default=...), Field(default=...), msgspec.field(default=...)
        for keyword in node.keywords:
            if keyword.arg == "default":
                return literal(keyword.value)
        if node.args and ast.unparse(node.func).split(".")[-1] == "Field":
            return literal(node.args[0])
        return NO_DEFAULT
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return NO_DEFAULT


def source_of(module: Module, node: ast.AST) -> tuple[str, int]:
    """A definition's source text (from its first decorator) and its first line number."""
    lines = module.source.splitlines()
    start = min([node.lineno] + [decorator.lineno for decorator in getattr(node, "decorator_list", ())])
    return "\n".join(lines[start - 1: node.end_lineno]), start


def squash(text: str) -> str:
    """``text`` without any whitespace."""
    return re.sub(r"\s+", "", text)


def find_text(source: str, first_line: int, text: str) -> int | None:
    """The line where ``text`` (whitespace ignored) starts in ``source``, or None."""
    squashed = [squash(line) for line in source.splitlines()]
    index = "".join(squashed).find(squash(text))
    if index < 0:
        return None
    line_ends = list(itertools.accumulate(len(line) for line in squashed))
    return first_line + bisect.bisect_right(line_ends, index)


def class_keywords(cls: ClassRef) -> dict[str, Any]:
    """``class X(Base, frozen=True)`` -> ``{"frozen": True}``."""
    return {keyword.arg: literal(keyword.value) for keyword in cls.node.keywords if keyword.arg}


def dataclass_options(cls: ClassRef) -> dict[str, Any]:
    """``@dataclass(frozen=True)`` -> ``{"frozen": True}``."""
    for decorator in cls.node.decorator_list:
        if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).split(".")[-1] == "dataclass":
            return {keyword.arg: literal(keyword.value) for keyword in decorator.keywords if keyword.arg}
    return {}
