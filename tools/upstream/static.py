"""The static reader: a release's ``vllm/`` sources, parsed with :mod:`ast`, never imported."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .check import CHANGED, MISSING, Broken, Checker, Field, Member, Result, Signature, SourceText, where_now
from vllm_hogwild.patches.points import CLASS, ENV_VAR, TouchPoint
from .source import SourceTree, release_version
from .syntax import (ClassRef, External, Module, call_kind, class_keywords, dataclass_options, decorator_names,
                     is_classvar, literal, pick_function, signature, source_of)

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@dataclass
class Definition:
    """What a name is in the sources: a statement (class, function, assignment...) or a module, and its module."""

    module: Module
    node: Any

    @property
    def where(self) -> str:
        return self.module.at(self.node if not isinstance(self.node, Module) else None)


def _is_pydantic(mro: list[ClassRef | External]) -> bool:
    return any(isinstance(cls, External) and cls.name.split(".")[-1] == "BaseModel" for cls in mro)


class StaticReader:
    """Answers the checker's questions from the sources under ``root`` (the directory containing ``vllm/``)."""

    errors_are_findings = False  # nothing of vLLM runs: an exception here is the tool's own bug

    def __init__(self, root: Path | str) -> None:
        self.tree = SourceTree(root)
        self.version = release_version(Path(root))

    # -- finding things ----------------------------------------------------------------------------

    def _module(self, module: str, name: str, kind: str) -> Module:
        """The parsed module; ``name`` and ``kind`` say what was looked for there (for the hint)."""
        found = self.tree.module(module)
        if found is None and module in self.tree.errors:
            raise Broken(MISSING, self.tree.errors[module])
        if found is None:
            raise Broken(MISSING, f"no module {module}" + where_now(self.tree, name, kind))
        return found

    def find_class(self, module: str, dotted: str) -> ClassRef:
        source = self._module(module, dotted.split(".")[0], CLASS)
        cls = self.tree.find_class(module, dotted)
        if cls is None:
            raise Broken(MISSING, f"no class {dotted} in {source.relative_path}"
                         + where_now(self.tree, dotted.split(".")[-1], CLASS), source.relative_path)
        return cls

    def find_in_module(self, module: str, name: str, kind: str) -> Definition:
        source = self._module(module, name.split(".")[0], kind)
        found = self.tree.resolve(module, name)
        if found is None:
            raise Broken(MISSING, f"no {name} in {source.relative_path}" + where_now(self.tree, name, kind),
                         source.relative_path)
        if isinstance(found[1], External):
            raise Broken(CHANGED, f"{name} now comes from outside vLLM ({found[1].name})", source.relative_path)
        return Definition(*found)

    def find_member(self, cls: ClassRef, name: str) -> Member | None:
        found = self.tree.lookup(cls, name)
        if found is None:
            return None
        definer, node = found
        return Member(Definition(definer.module, node), definer.name, inherited=definer.node is not cls.node)

    def env_var(self, module: str, name: str) -> tuple[bool, str]:
        """Whether ``name`` is a key of a dict literal in the module (``environment_variables``), and where."""
        source = self._module(module, name, ENV_VAR)
        for node in ast.walk(source.tree):
            if isinstance(node, ast.Dict):
                for key in node.keys:
                    if isinstance(key, ast.Constant) and key.value == name:
                        return True, source.at(key)
        return False, source.relative_path

    def where(self, value: Definition) -> str:
        return value.where

    # -- classes -----------------------------------------------------------------------------------

    def class_name(self, cls: ClassRef) -> str:
        return cls.name

    def class_where(self, cls: ClassRef) -> str:
        return cls.at()

    def derives_from(self, cls: ClassRef, base: str) -> bool:
        module, _, name = base.rpartition(".")
        return any(isinstance(current, ClassRef) and current.name == name and current.module.name == module
                   for current in self.tree.mro(cls)[1:])

    def base_names(self, cls: ClassRef) -> list[str]:
        return [current.name for current in self.tree.mro(cls)[1:]]

    def abstract_methods(self, cls: ClassRef) -> dict[str, str]:
        """Name -> where, for the methods still ``@abstractmethod`` in the MRO (the first definition counts)."""
        abstract: dict[str, str] = {}
        decided: set[str] = set()
        for current in self.tree.mro_classes(cls):
            for name, statements in self.tree.class_members(current).items():
                if name in decided:
                    continue
                decided.add(name)
                function = pick_function(statements)
                if function is not None and "abstractmethod" in decorator_names(function):
                    abstract[name] = current.module.at(function)
        return abstract

    def _model_config(self, mro: list[ClassRef | External]) -> ast.stmt | None:
        """A pydantic model's ``model_config = ...`` (the first class of the MRO that sets one)."""
        return next((statement for current in mro if isinstance(current, ClassRef)
                     for statement in self.tree.class_members(current).get("model_config", [])), None)

    def refuses_new_attributes(self, cls: ClassRef) -> tuple[str, str] | None:
        """Why instances would refuse a new attribute (detail, where): frozen, slots, msgspec, pydantic."""
        mro = self.tree.mro(cls)
        for current in mro:
            if isinstance(current, External):
                short_name = current.name.split(".")[-1]
                if short_name == "Struct" and not any(isinstance(other, ClassRef)
                                                      and class_keywords(other).get("dict") is True for other in mro):
                    return "now a msgspec.Struct without dict=True: new attributes are refused", cls.at()
                if short_name == "NamedTuple":
                    return "now a NamedTuple", cls.at()
                continue
            options = dataclass_options(current)
            if options.get("frozen") is True:
                return f"{current.name} is now a frozen dataclass", current.at()
            if current is cls and (options.get("slots") is True or "__slots__" in self.tree.class_members(current)):
                return f"{current.name} now declares __slots__", current.at()
        if _is_pydantic(mro):
            config = self._model_config(mro)
            if config is None or not re.search(r"""extra\s*[=:]\s*['"]allow['"]""", ast.unparse(config)):
                return ("a pydantic model without extra='allow': the new field is refused (or dropped from the "
                        "response)"), cls.at()
        return None

    def refuses_assignment(self, cls: ClassRef, name: str) -> tuple[str, str] | None:
        """Why assigning ``name`` on an instance would fail (detail, where): frozen, or pydantic validation."""
        mro = self.tree.mro(cls)
        for current in mro:
            if not isinstance(current, ClassRef):
                continue
            if dataclass_options(current).get("frozen") is True:
                return f"{current.name} is now a frozen dataclass: the plugin assigns {name}", current.at()
            if class_keywords(current).get("frozen") is True:
                return f"{current.name} is now frozen: the plugin assigns {name}", current.at()
        if _is_pydantic(mro):
            config = self._model_config(mro)
            text = ast.unparse(config) if config is not None else ""
            for option in ("frozen", "validate_assignment"):
                if re.search(rf"""{option}['"]?\s*[=:]\s*True""", text):
                    return (f"the pydantic model now sets {option}=True: the plugin assigns {name} (and may store "
                            f"its own objects in it)"), cls.at()
        return None

    def defines(self, cls: ClassRef, name: str) -> bool:
        return self.tree.lookup(cls, name) is not None

    def field(self, cls: ClassRef, name: str) -> Field | None:
        """The first annotated (not ClassVar) ``name`` in the MRO's class bodies."""
        for current in self.tree.mro_classes(cls):
            for statement in self.tree.class_members(current).get(name, []):
                if isinstance(statement, ast.AnnAssign) and not is_classvar(statement.annotation):
                    shown = ast.unparse(statement.value) if statement.value is not None else "none"
                    return Field(current.module.at(statement), literal(statement.value), shown)
        return None

    def other_binding(self, cls: ClassRef, name: str) -> tuple[str, str] | None:
        """What ``name`` is instead of a declared field (detail, where): a method, an assignment, ``self.x``."""
        found = self.tree.lookup(cls, name)
        if found is not None:
            return (f"{name} is no longer a declared field ({type(found[1]).__name__})",
                    found[0].module.at(found[1]))
        assigned = self.tree.where_assigned(self.tree.mro_classes(cls), name, init_only=False)
        if assigned is not None:
            return f"{name} is no longer a declared field (set in {assigned[0]})", assigned[1]
        return None

    def class_attribute(self, cls: ClassRef, name: str) -> str | None:
        """Where a class body of the MRO binds ``name`` (a bare annotation does not count)."""
        for current in self.tree.mro_classes(cls):
            for statement in self.tree.class_members(current).get(name, []):
                if not (isinstance(statement, ast.AnnAssign) and statement.value is None):
                    return current.module.at(statement)
        return None

    def class_constant(self, cls: ClassRef, name: str) -> str | None:
        found = self.tree.lookup(cls, name)
        return found[0].module.at(found[1]) if found is not None else None

    def source_classes(self, cls: ClassRef) -> list[ClassRef]:
        return self.tree.mro_classes(cls)

    # -- callables and sources ---------------------------------------------------------------------

    def not_a_function(self, value: Definition) -> str | None:
        if isinstance(value.node, _FUNCTIONS):
            return None
        return "a module" if isinstance(value.node, Module) else type(value.node).__name__

    def decorators(self, value: Definition) -> list[str]:
        return decorator_names(value.node)

    def signature(self, value: Definition) -> Signature:
        positional, names, defaults = signature(value.node)
        return Signature(positional, names, {name: literal(node) for name, node in defaults.items()})

    def call_kind(self, value: Definition) -> str:
        return call_kind(value.node)

    def function_syntax(self, value: Definition) -> tuple[ast.AST, str, int] | None:
        """(the function's node, its file, 0: the node's line numbers are the file's)."""
        if not isinstance(value.node, _FUNCTIONS):
            return None
        return value.node, value.module.relative_path, 0

    def source_text(self, value: Definition) -> SourceText | None:
        if not isinstance(value.node, (*_FUNCTIONS, ast.ClassDef)):
            return None
        text, first_line = source_of(value.module, value.node)
        return SourceText(text, value.module.relative_path, first_line)


def check_static(root: Path | str, points: Iterable[TouchPoint] | None = None) -> list[Result]:
    """Check the table against the vLLM sources under ``root`` (the directory containing ``vllm/``); no import."""
    return Checker(StaticReader(root)).check(points)
