"""The runtime reader: the installed vLLM, imported; its live objects (signatures, descriptors, fields, MROs).

What only the source says (``self.x = ...`` in ``__init__``, a line a method must
contain, what a function reads of an argument) it reads from the installed files
of the classes' real MROs.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Any, Iterable

from .check import CHANGED, MISSING, Broken, Checker, Field, Member, Result, Signature, SourceText
from vllm_hogwild.patches.points import NO_DEFAULT, TouchPoint
from .source import SourceTree
from .syntax import ClassRef


def _unwrap(function: Any) -> Any:
    """The vLLM function under the plugin's own wrappers (``patches._wrap`` keeps it as ``_hogwild_original``)."""
    for _ in range(10):
        original = getattr(function, "_hogwild_original", None)
        if original is None:
            return function
        function = original
    return function


def _function_of(value: Any) -> Any:
    """The function a ``staticmethod`` / ``classmethod`` holds, or ``value`` itself."""
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


class RuntimeReader:
    """Answers the checker's questions from the installed vLLM (imports it)."""

    errors_are_findings = True  # an import or attribute that raises is a finding about that row

    def __init__(self) -> None:
        import vllm

        self.tree = SourceTree(Path(vllm.__file__).parent.parent)
        self.version = getattr(vllm, "__version__", "?")

    # -- finding things ----------------------------------------------------------------------------

    def _get(self, module: str, dotted: str) -> Any:
        try:
            found = importlib.import_module(module)
        except ImportError as error:
            raise Broken(MISSING, f"cannot import {module}: {error}") from None
        for part in dotted.split(".") if dotted else ():
            if not hasattr(found, part):
                raise Broken(MISSING, f"{getattr(found, '__name__', found)} has no {part}")
            found = getattr(found, part)
        return found

    def find_class(self, module: str, dotted: str) -> type:
        cls = self._get(module, dotted)
        if not isinstance(cls, type):
            raise Broken(CHANGED, f"{dotted} is no longer a class ({type(cls).__name__})")
        return cls

    def find_in_module(self, module: str, name: str, kind: str) -> Any:
        return self._get(module, name)

    def find_member(self, cls: type, name: str) -> Member | None:
        definer = next((current for current in cls.__mro__ if name in current.__dict__), None)
        if definer is None:
            return None
        return Member(definer.__dict__[name], definer.__name__, inherited=definer is not cls)

    def env_var(self, module: str, name: str) -> tuple[bool, str]:
        envs = importlib.import_module(module)
        return name in getattr(envs, "environment_variables", {}), ""

    def where(self, value: Any) -> str:
        """"vllm/x.py:12" for a function or class, "vllm/x.py" for what has a file, else ""."""
        try:
            value = _function_of(value)
            function = inspect.unwrap(_unwrap(value)) if callable(value) else value
            code = getattr(function, "__code__", None)
            path = inspect.getsourcefile(function) or ""
            relative = Path(path).resolve().relative_to(self.tree.root.resolve()).as_posix()
            if code is not None:
                return f"{relative}:{code.co_firstlineno}"
            if isinstance(function, type):
                source = self._class_source(function)
                return source.at() if source else relative
            return relative
        except (TypeError, ValueError, OSError):
            return ""

    def _class_source(self, cls: type) -> ClassRef | None:
        """The class statement of a live class, in the installed files."""
        try:
            path = inspect.getsourcefile(cls)
        except TypeError:
            return None
        return self.tree.class_in_file(path, cls.__qualname__) if path else None

    # -- classes -----------------------------------------------------------------------------------

    def class_name(self, cls: type) -> str:
        return cls.__name__

    def class_where(self, cls: type) -> str:
        return self.where(cls)

    def derives_from(self, cls: type, base: str) -> bool:
        module, _, name = base.rpartition(".")
        return issubclass(cls, self._get(module, name))

    def base_names(self, cls: type) -> list[str]:
        return [current.__name__ for current in cls.__mro__[1:]]

    def abstract_methods(self, cls: type) -> dict[str, str]:
        return {name: "" for name in getattr(cls, "__abstractmethods__", ())}

    def refuses_new_attributes(self, cls: type) -> tuple[str, str] | None:
        where = self.where(cls)
        params = getattr(cls, "__dataclass_params__", None)
        if params is not None and params.frozen:
            return "now a frozen dataclass", where
        if hasattr(cls, "model_fields") and hasattr(cls, "model_config"):  # pydantic
            if cls.model_config.get("extra") != "allow":
                return "a pydantic model without extra='allow'", where
        elif cls.__dictoffset__ == 0:
            return "instances have no __dict__ (slots or msgspec): new attributes are refused", where
        return None

    def refuses_assignment(self, cls: type, name: str) -> tuple[str, str] | None:
        params = getattr(cls, "__dataclass_params__", None)
        if params is not None and params.frozen:
            return f"now a frozen dataclass: the plugin assigns {name}", self.where(cls)
        config = getattr(cls, "__struct_config__", None)  # msgspec
        if config is not None and config.frozen:
            return f"now a frozen msgspec Struct: the plugin assigns {name}", self.where(cls)
        model_config = getattr(cls, "model_config", None)
        if hasattr(cls, "model_fields") and isinstance(model_config, dict):
            for option in ("frozen", "validate_assignment"):
                if model_config.get(option):
                    return f"the pydantic model now sets {option}=True: the plugin assigns {name}", self.where(cls)
        return None

    def defines(self, cls: type, name: str) -> bool:
        return (any(name in current.__dict__ for current in cls.__mro__)
                or name in getattr(cls, "__struct_fields__", ()) or name in getattr(cls, "model_fields", {}))

    def field(self, cls: type, name: str) -> Field | None:
        """A dataclass, msgspec or pydantic field, or an annotation anywhere in the MRO."""
        found, default = self._declared_field(cls, name)
        if not found:
            return None
        return Field(self.where(cls), default, repr(default))

    @staticmethod
    def _declared_field(cls: type, name: str) -> tuple[bool, Any]:
        if dataclasses.is_dataclass(cls):
            for field in dataclasses.fields(cls):
                if field.name == name:
                    return True, field.default if field.default is not dataclasses.MISSING else NO_DEFAULT
        elif hasattr(cls, "__struct_fields__"):  # msgspec
            names = cls.__struct_fields__
            if name in names:
                defaults = getattr(cls, "__struct_defaults__", ())
                index = names.index(name) - (len(names) - len(defaults))
                return True, defaults[index] if index >= 0 else NO_DEFAULT
        elif hasattr(cls, "model_fields"):  # pydantic
            info = cls.model_fields.get(name)
            if info is not None:
                return True, info.default
        annotated = any(name in current.__dict__.get("__annotations__", {}) for current in cls.__mro__) or any(
            name in getattr(current, "__annotations__", {}) for current in cls.__mro__)
        return annotated, NO_DEFAULT

    def other_binding(self, cls: type, name: str) -> tuple[str, str] | None:
        return None  # the live class only says that no field of this name is declared

    def class_attribute(self, cls: type, name: str) -> str | None:
        """A class attribute, property or field default somewhere in the MRO: where the class is."""
        if any(name in current.__dict__ for current in cls.__mro__):
            return self.where(cls)
        return None

    def class_constant(self, cls: type, name: str) -> str | None:
        return "" if hasattr(cls, name) else None

    def source_classes(self, cls: type) -> list[ClassRef]:
        """The class statements of the MRO's vLLM classes, in the installed files."""
        return [source for current in cls.__mro__ if current.__module__.split(".")[0] == "vllm"
                and (source := self._class_source(current)) is not None]

    # -- callables and sources ---------------------------------------------------------------------

    def not_a_function(self, value: Any) -> str | None:
        function = _unwrap(_function_of(value))
        return None if callable(function) else type(function).__name__

    def decorators(self, value: Any) -> list[str]:
        """What the class ``__dict__`` holds, said as decorators: staticmethod, classmethod, property, cache."""
        found = [name for kind, name in ((staticmethod, "staticmethod"), (classmethod, "classmethod"),
                                         (property, "property")) if isinstance(value, kind)]
        if hasattr(value, "cache_clear"):
            found.append("cache")
        return found

    def signature(self, value: Any) -> Signature:
        positional, names, defaults = [], [], {}
        for parameter in inspect.signature(_unwrap(_function_of(value))).parameters.values():
            if parameter.kind is parameter.VAR_POSITIONAL:
                names.append("*" + parameter.name)
            elif parameter.kind is parameter.VAR_KEYWORD:
                names.append("**" + parameter.name)
            else:
                names.append(parameter.name)
                if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
                    positional.append(parameter.name)
            if parameter.default is not parameter.empty:
                defaults[parameter.name] = parameter.default
        return Signature(positional, names, defaults)

    def call_kind(self, value: Any) -> str:
        function = inspect.unwrap(_unwrap(_function_of(value)))
        if inspect.isasyncgenfunction(function):
            return "asyncgen"
        return "async" if inspect.iscoroutinefunction(function) else "sync"

    def function_syntax(self, value: Any) -> tuple[ast.AST, str, int] | None:
        """The function's source parsed (its file, and the offset that makes its line numbers the file's)."""
        function = inspect.unwrap(_unwrap(_function_of(value)))
        lines, first_line = inspect.getsourcelines(function)
        node = ast.parse(textwrap.dedent("".join(lines))).body[0]
        return node, self.where(value).split(":")[0], first_line - 1

    def source_text(self, value: Any) -> SourceText | None:
        target = _function_of(value) if isinstance(value, (staticmethod, classmethod)) else _unwrap(value)
        try:
            lines, first_line = inspect.getsourcelines(target)
        except (TypeError, OSError):
            return None
        return SourceText("".join(lines), self.where(value).split(":")[0], first_line)


def check_runtime(points: Iterable[TouchPoint] | None = None) -> list[Result]:
    """Check the table against the installed vLLM (imports it)."""
    return Checker(RuntimeReader()).check(points)
