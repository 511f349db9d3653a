"""What each kind of touch point requires, checked through a :class:`Reader`.

The :class:`Checker` holds the rules (a method the plugin wraps must be in the
class's own ``__dict__``, its leading parameters must be these, a field's default
that, a class the plugin writes to must not be frozen, ...). It never looks at
vLLM itself: it asks a reader, which finds modules, classes and members and
answers questions about them. Two readers implement :class:`Reader`:
:class:`~.runtime.RuntimeReader` (the installed vLLM, imported) and
:class:`~.static.StaticReader` (a release's sources, parsed).

Each touch point gets a :class:`Result`: OK, CHANGED (found, but not as the
plugin relies on it) or MISSING, with a detail and where it was found.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

from vllm_hogwild.patches.points import (ABSTRACT, ATTRIBUTE, CLASS, CONSTANT, ENV_VAR, FIELD, FUNCTION, INIT_ATTRIBUTE, METHOD,
                    NO_DEFAULT, READS, SETTABLE, SOURCE, TouchPoint)
from .source import SourceTree
from .syntax import ClassRef, find_text, signature
from vllm_hogwild.patches.touch_points import TOUCH_POINTS

OK, CHANGED, MISSING = "OK", "CHANGED", "MISSING"


@dataclass
class Result:
    point: TouchPoint
    status: str
    detail: str = ""
    where: str = ""  # "vllm/x.py:12"

    @property
    def ok(self) -> bool:
        return self.status == OK

    def line(self) -> str:
        point = self.point
        runner = f"[{point.runner}] " if point.runner else ""
        head = f"{self.status:<8} {point.kind:<10} {runner}{point.target}"
        where = f"  [{self.where}]" if self.where else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{head}{where}{detail}"


class Broken(Exception):
    """A touch point that does not hold: its status (CHANGED / MISSING), why, and where."""

    def __init__(self, status: str, detail: str, where: str = "") -> None:
        super().__init__(detail)
        self.status, self.detail, self.where = status, detail, where


@dataclass
class Member:
    """A class member as found in the first class of the MRO that defines it."""

    value: Any  # what the reader hands back to its other methods
    defined_in: str  # the simple name of that class
    inherited: bool  # not defined by the class itself


@dataclass
class Field:
    """A declared field (dataclass, msgspec, pydantic) and its default."""

    where: str
    default: Any  # NO_DEFAULT when it has none (or none a reader can tell)
    default_shown: str  # how a report shows the default


@dataclass
class Signature:
    positional: list[str]  # positional parameters, in order
    names: list[str]  # every parameter, "*args" and "**kwargs" spelled so
    defaults: dict[str, Any]  # parameter -> default (NO_DEFAULT where a reader cannot tell)


@dataclass
class SourceText:
    text: str
    file: str  # "vllm/x.py", or "" where unknown
    first_line: int


class Reader(Protocol):
    """What the checker asks of a vLLM. ``cls`` and ``value`` are the reader's own handles.

    Lookups that fail raise :class:`Broken` with the reader's reason (a module that does not import or parse,
    a name that is not there); everything else returns an answer.
    """

    tree: SourceTree  # the sources of this vLLM (the installed files, for the runtime reader)
    version: str  # its release ("0.33.0"; "?" when unknown: every row applies)
    errors_are_findings: bool  # an exception while checking a row is reported as that row's MISSING

    # -- finding things (each raises Broken when it finds nothing) --
    def find_class(self, module: str, dotted: str) -> Any:
        """The class ``module.dotted``."""

    def find_in_module(self, module: str, name: str, kind: str) -> Any:
        """A module-level name (``kind``: what the row expects there, for the hint when it is missing)."""

    def find_member(self, cls: Any, name: str) -> Member | None:
        """``name`` in the first class of the MRO that defines it, or None."""

    def env_var(self, module: str, name: str) -> tuple[bool, str]:
        """Whether vLLM reads the environment variable, and where (the module, when it does not)."""

    def where(self, value: Any) -> str:
        """"vllm/x.py:12" for a found value ("" where unknown)."""

    # -- classes --
    def class_name(self, cls: Any) -> str: ...
    def class_where(self, cls: Any) -> str: ...

    def derives_from(self, cls: Any, base: str) -> bool:
        """Whether ``cls`` subclasses ``base`` ("module.Class")."""

    def base_names(self, cls: Any) -> list[str]:
        """The MRO after the class itself, by name (for the report)."""

    def abstract_methods(self, cls: Any) -> dict[str, str]:
        """Name -> where ("" where unknown) of each method still abstract."""

    def refuses_new_attributes(self, cls: Any) -> tuple[str, str] | None:
        """(why, where) when instances cannot take a new attribute (frozen, slots, msgspec, pydantic), or None."""

    def refuses_assignment(self, cls: Any, name: str) -> tuple[str, str] | None:
        """(why, where) when assigning ``name`` on an instance would fail (frozen, pydantic validation), or None."""

    def defines(self, cls: Any, name: str) -> bool:
        """Whether vLLM binds ``name`` on the class or its MRO (attribute, method, field)."""

    def field(self, cls: Any, name: str) -> Field | None:
        """The declared field ``name`` (dataclass, msgspec, pydantic, annotation), or None."""

    def other_binding(self, cls: Any, name: str) -> tuple[str, str] | None:
        """(what ``name`` is instead of a field, where) when the reader can tell, or None."""

    def class_attribute(self, cls: Any, name: str) -> str | None:
        """Where the MRO binds ``name`` at class level (not a bare annotation), or None."""

    def class_constant(self, cls: Any, name: str) -> str | None:
        """Where the class attribute ``name`` (an enum member...) is ("" where unknown), or None."""

    def source_classes(self, cls: Any) -> list[ClassRef]:
        """The class statements of the MRO's vLLM classes, for what only the sources say (``self.x = ...``)."""

    # -- callables and sources --
    def not_a_function(self, value: Any) -> str | None:
        """None for a function; else what it is now."""

    def decorators(self, value: Any) -> list[str]:
        """The decorators as names: "staticmethod", "classmethod", "property", "cache"..."""

    def signature(self, value: Any) -> Signature: ...

    def call_kind(self, value: Any) -> str:
        """"sync", "async" or "asyncgen"."""

    def function_syntax(self, value: Any) -> tuple[ast.AST, str, int] | None:
        """(the function's syntax tree, its file, what to add to its line numbers), or None for no function."""

    def source_text(self, value: Any) -> SourceText | None:
        """The source of a function or class, or None where there is none."""


def where_now(tree: SourceTree, name: str, kind: str) -> str:
    """"; NAME now at FILE:LINE, ..." (or "; no NAME anywhere in vllm/"): a hint for something missing."""
    if kind in (CLASS, SETTABLE, ABSTRACT):
        hits = tree.search(rf"^[ \t]*class {re.escape(name)}\b")
    elif kind in (METHOD, FUNCTION):
        hits = tree.search(rf"^[ \t]*(async[ \t]+)?def {re.escape(name)}\(")
    elif kind == SOURCE:
        return ""
    else:
        hits = tree.search(rf"(self\.{re.escape(name)}[ \t]*(:[^=\n]*)?=[^=]|^[ \t]*{re.escape(name)}[ \t]*[:=])")
    return f"; {name} now at {', '.join(hits)}" if hits else f"; no {name} anywhere in vllm/"


def _in_parentheses(where: str) -> str:
    return f" ({where})" if where else ""


class Checker:
    """Checks touch points against one vLLM, through its reader."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    def check(self, points: Iterable[TouchPoint] | None = None) -> list[Result]:
        """One :class:`Result` per touch point (the whole table by default), in order."""
        results = []
        version = self.reader.version
        for point in TOUCH_POINTS if points is None else points:
            if not point.applies_to(version):
                continue  # the row is for other releases (TouchPoint.since / before)
            try:
                detail, where = self.check_one(point)
                results.append(Result(point, OK, detail, where))
            except Broken as broken:
                results.append(Result(point, broken.status, broken.detail, broken.where))
            except Exception as error:  # importing vLLM runs its code: what it raises is a finding too
                if not self.reader.errors_are_findings:
                    raise
                results.append(Result(point, MISSING, f"{type(error).__name__}: {error}"))
        return results

    def check_one(self, point: TouchPoint) -> tuple[str, str]:
        """(detail, where) when the touch point holds; raises :class:`Broken` when it does not."""
        if point.kind == ENV_VAR:
            return self._env_var(point)
        if point.kind in (CLASS, SETTABLE, ABSTRACT):
            cls = self.reader.find_class(point.module, point.name)
            return {CLASS: self._class, SETTABLE: self._settable, ABSTRACT: self._abstract}[point.kind](point, cls)
        if not point.owner:  # module level: FUNCTION, CONSTANT, SOURCE or READS of a function or class
            value = self.reader.find_in_module(point.module, point.name, point.kind)
            if point.kind == CONSTANT:
                return "", self.reader.where(value)
            return self._callable_or_source(point, value)
        cls = self.reader.find_class(point.module, point.owner)
        if point.kind in (METHOD, SOURCE, READS):
            return self._member(point, cls)
        if point.kind == FIELD:
            return self._field(point, cls)
        if point.kind in (ATTRIBUTE, INIT_ATTRIBUTE):
            return self._attribute(point, cls)
        if point.kind == CONSTANT:
            return self._class_constant(point, cls)
        raise ValueError(point.kind)

    # -- module level ------------------------------------------------------------------------------

    def _env_var(self, point: TouchPoint) -> tuple[str, str]:
        found, where = self.reader.env_var(point.module, point.name)
        if not found:
            raise Broken(MISSING, f"{point.name} is no longer an environment variable vLLM reads", where)
        return "", where

    # -- classes -----------------------------------------------------------------------------------

    def _class(self, point: TouchPoint, cls: Any) -> tuple[str, str]:
        where = self.reader.class_where(cls)
        if point.base and not self.reader.derives_from(cls, point.base):
            bases = ", ".join(self.reader.base_names(cls))
            raise Broken(CHANGED, f"no longer a subclass of {point.base} (bases: {bases})", where)
        return "", where

    def _settable(self, point: TouchPoint, cls: Any) -> tuple[str, str]:
        """Instances take new attributes, and vLLM does not define the plugin's own names itself."""
        where = self.reader.class_where(cls)
        refusal = self.reader.refuses_new_attributes(cls)
        if refusal is not None:
            raise Broken(CHANGED, *refusal)
        clashes = [name for name in plugin_attribute_names(point) if self.reader.defines(cls, name)]
        if clashes:
            raise Broken(CHANGED, f"vLLM now defines {', '.join(clashes)} on {self.reader.class_name(cls)} itself",
                         where)
        return "", where

    def _abstract(self, point: TouchPoint, cls: Any) -> tuple[str, str]:
        """The class's abstract methods are all among those the plugin's subclass implements."""
        where = self.reader.class_where(cls)
        abstract = self.reader.abstract_methods(cls)
        extra = sorted(set(abstract) - set(point.params))
        if extra:
            raise Broken(CHANGED, "new abstract methods the plugin's subclass lacks: "
                         + ", ".join(name + _in_parentheses(abstract[name]) for name in extra), where)
        return "", where

    def _writable(self, point: TouchPoint, cls: Any) -> None:
        """``writes``: the plugin assigns this name; the class must take the assignment as it is."""
        if point.writes:
            refusal = self.reader.refuses_assignment(cls, point.leaf)
            if refusal is not None:
                raise Broken(CHANGED, *refusal)

    # -- members -----------------------------------------------------------------------------------

    def _missing_member(self, point: TouchPoint, cls: Any, kind: str) -> Broken:
        """MISSING: the class has no such member (``kind``: what to search the tree for, for the hint)."""
        what = "field " if kind == FIELD else ""
        return Broken(MISSING, f"{self.reader.class_name(cls)} has no {what}{point.leaf}"
                      + where_now(self.reader.tree, point.leaf, kind), self.reader.class_where(cls))

    def _member(self, point: TouchPoint, cls: Any) -> tuple[str, str]:
        """A method (or the source of one): found in the MRO, and where the plugin's wrapping needs it."""
        member = self.reader.find_member(cls, point.leaf)
        if member is None:
            raise self._missing_member(point, cls, METHOD)
        where = self.reader.where(member.value)
        name = self.reader.class_name(cls)
        if point.own and member.inherited:
            raise Broken(CHANGED, f"{point.leaf} is inherited from {member.defined_in}{_in_parentheses(where)}, "
                                  f"not defined in {name}'s own body: patches._wrap replaces it in {name}.__dict__",
                         where)
        if point.defined_by and member.defined_in != point.defined_by:
            raise Broken(CHANGED, f"{name}.{point.leaf} is now defined by {member.defined_in}"
                                  f"{_in_parentheses(where)}, not inherited from {point.defined_by}", where)
        return self._callable_or_source(point, member.value)

    def _class_constant(self, point: TouchPoint, cls: Any) -> tuple[str, str]:
        where = self.reader.class_constant(cls, point.leaf)
        if where is None:
            raise self._missing_member(point, cls, CONSTANT)
        return "", where

    def _field(self, point: TouchPoint, cls: Any) -> tuple[str, str]:
        """A declared field, with the default the plugin expects, writable where the plugin writes it."""
        field = self.reader.field(cls, point.leaf)
        if field is None:
            other = self.reader.other_binding(cls, point.leaf)
            if other is not None:
                raise Broken(CHANGED, *other)
            raise self._missing_member(point, cls, FIELD)
        if point.default is not NO_DEFAULT and field.default != point.default:
            raise Broken(CHANGED, f"default now {field.default_shown} (expected {point.default!r})", field.where)
        self._writable(point, cls)
        return "", field.where

    def _attribute(self, point: TouchPoint, cls: Any) -> tuple[str, str]:
        """ATTRIBUTE / INIT_ATTRIBUTE: bound in a class body, else set on ``self`` (while ``__init__`` runs)."""
        where = self.reader.class_attribute(cls, point.leaf)
        if where is not None:
            found = "", where
        else:
            try:
                found = attribute_in_sources(self.reader.tree, self.reader.source_classes(cls), point)
            except Broken as broken:
                if broken.status == MISSING:
                    broken.detail += where_now(self.reader.tree, point.leaf, ATTRIBUTE)
                raise
        self._writable(point, cls)
        return found

    # -- callables and sources ---------------------------------------------------------------------

    def _callable_or_source(self, point: TouchPoint, value: Any) -> tuple[str, str]:
        if point.kind == READS:
            return self._reads(point, value)
        if point.kind == SOURCE:
            return self._source(point, value)
        where = self.reader.where(value)
        now = self.reader.not_a_function(value)
        if now is not None:
            raise Broken(CHANGED, f"{point.name} is no longer a function (now {now})", where)
        problems = decorator_problems(point, self.reader.decorators(value))
        problems += parameter_problems(point, self.reader.signature(value))
        if point.call is not None and (kind := self.reader.call_kind(value)) != point.call:
            problems.append(f"now {kind} (expected {point.call})")
        if problems:
            raise Broken(CHANGED, "; ".join(problems), where)
        return "", where

    def _source(self, point: TouchPoint, value: Any) -> tuple[str, str]:
        """The object's source contains the text (whitespace ignored); where: the line it starts on."""
        where = self.reader.where(value)
        source = self.reader.source_text(value)
        if source is None:
            raise Broken(CHANGED, f"{point.name} is no longer a function or class", where)
        line = find_text(source.text, source.first_line, point.text or "")
        if line is None:
            raise Broken(CHANGED, f"its source no longer contains {point.text!r}", where)
        return "", f"{source.file}:{line}" if source.file else where

    def _reads(self, point: TouchPoint, value: Any) -> tuple[str, str]:
        where = self.reader.where(value)
        syntax = self.reader.function_syntax(value)
        if syntax is None:
            raise Broken(CHANGED, f"{point.name} is no longer a function", where)
        problem = reads_problem(point, *syntax)
        if problem:
            raise Broken(CHANGED, problem, where)
        return "", where


# -- the rules, as plain functions ---------------------------------------------------------------------

def plugin_attribute_names(point: TouchPoint) -> list[str]:
    """SETTABLE: the plugin's own new attributes (``hogwild*``), which vLLM must not define; the other names
    replace a vLLM method on one instance (``_prepare_inputs``, ``allocate_slots``)."""
    return [name for name in point.params if name.startswith("hogwild")]


def decorator_problems(point: TouchPoint, decorators: list[str]) -> list[str]:
    """``decorators``: the names a reader sees ("staticmethod", "classmethod", "property", "cache"...)."""
    if point.decorator == "cache":
        if not {"cache", "lru_cache"} & set(decorators):
            return ["no longer @functools.cache (no cache_clear)"]
        return []
    if point.decorator is not None:
        if point.decorator not in decorators:
            return [f"no longer a {point.decorator} (decorators: {', '.join(decorators) or 'none'})"]
        return []
    if point.kind == METHOD:
        return [f"now a {name}" for name in ("staticmethod", "classmethod", "property") if name in decorators]
    return []


def parameter_problems(point: TouchPoint, found: Signature) -> list[str]:
    """Leading (or exact) parameters, keywords and defaults, against the signature found."""
    problems = []
    shown = ", ".join(found.names)
    if point.exact:
        if found.names != list(point.params):
            problems.append(f"parameters now ({shown}), expected exactly ({', '.join(point.params)})")
    elif point.params and found.positional[: len(point.params)] != list(point.params):
        problems.append(f"parameters now ({shown}), expected to start ({', '.join(point.params)})")
    for keyword in point.keywords:
        if keyword not in found.names:
            problems.append(f"no parameter {keyword!r} (now: {shown})")
    for name, expected in point.defaults:
        if name in found.names and found.defaults.get(name, NO_DEFAULT) != expected:
            default = found.defaults.get(name, NO_DEFAULT)
            problems.append(f"{name}'s default now {'none' if default is NO_DEFAULT else repr(default)} "
                            f"(expected {expected!r})")
    return problems


def reads_problem(point: TouchPoint, node: ast.AST, file: str, line_offset: int) -> str:
    """READS: what the function reads of its parameter ``point.text`` beyond ``point.params`` ("" when nothing)."""
    parameter = point.text
    _, names, _ = signature(node)
    if parameter not in names:
        return f"no parameter {parameter!r} any more (now: {', '.join(names)})"
    reads: dict[str, int] = {}
    for child in ast.walk(node):
        if isinstance(child, ast.Attribute) and isinstance(child.value, ast.Name) and child.value.id == parameter:
            reads.setdefault(child.attr, child.lineno + line_offset)
        elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Name)
              and child.func.id in ("getattr", "hasattr") and len(child.args) >= 2
              and isinstance(child.args[0], ast.Name) and child.args[0].id == parameter
              and isinstance(child.args[1], ast.Constant)):
            reads.setdefault(str(child.args[1].value), child.lineno + line_offset)
    extra = sorted(set(reads) - set(point.params))
    if not extra:
        return ""
    return "now reads " + ", ".join(f"{parameter}.{name} ({file}:{reads[name]})" for name in extra) + \
        f"; the plugin's stand-in has only {', '.join(point.params)}"


def attribute_in_sources(tree: SourceTree, classes: list[ClassRef], point: TouchPoint) -> tuple[str, str]:
    """ATTRIBUTE / INIT_ATTRIBUTE in the sources of a class's MRO (``classes``): (detail, where), or raises.

    A class-level binding (assignment, property, method) counts; then ``self.x = ...`` (while ``__init__``
    runs, for INIT_ATTRIBUTE); a bare annotation (``x: T`` in a class body) only declares the name.
    """
    bare = None
    for cls in classes:
        for statement in tree.class_members(cls).get(point.leaf, []):
            if isinstance(statement, ast.AnnAssign) and statement.value is None:
                bare = bare or (cls, statement)
            else:
                return "", cls.module.at(statement)
    init_only = point.kind == INIT_ATTRIBUTE
    assigned = tree.where_assigned(classes, point.leaf, init_only)
    if assigned is not None:
        return f"set in {assigned[0]}", assigned[1]
    if init_only:
        later = tree.where_assigned(classes, point.leaf, init_only=False)
        if later is not None:
            raise Broken(CHANGED, f"no longer set while __init__ runs, only in {later[0]}", later[1])
    if bare is not None:
        cls, statement = bare
        if init_only:
            raise Broken(CHANGED, f"only declared (an annotation in {cls.name}), never set while __init__ runs",
                         cls.module.at(statement))
        return f"declared in {cls.name} (an annotation only)", cls.module.at(statement)
    name = classes[0].name if classes else point.owner
    raise Broken(MISSING, f"{name} never sets {point.leaf}", classes[0].at() if classes else "")
