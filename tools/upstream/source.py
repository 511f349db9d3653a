"""Reading a ``vllm/`` package's Python sources without importing them.

:class:`SourceTree` parses a module on demand and answers "what is ``module.name``"
(following imports and re-exports), "which class is this", "what is its MRO" and
"where does a class set ``self.x``". The functions of :mod:`.syntax` answer questions about
single syntax nodes (a function's parameters, its decorators, whether it is an
async generator, a literal default...). Both readers use this: the static one
for everything, the runtime one for what only the source says.
"""

from __future__ import annotations

import ast
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

from .syntax import (_FUNCTIONS, ClassRef, External, Module, binding_rank, body_statements, bound_names,
                     pick_function, self_assignments, self_calls)


def release_version(root: Path) -> str:
    """The ``__version__`` in ``root/vllm/_version.py``, or "?"."""
    path = root / "vllm" / "_version.py"
    match = re.search(r"""^__version__\s*=(?:\s*version\s*=)?\s*['"]([^'"]+)['"]""", path.read_text(), re.M) \
        if path.is_file() else None
    return match.group(1) if match else "?"


class SourceTree:
    """The ``vllm`` package's sources under ``root`` (the directory that contains ``vllm/``), parsed on demand."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self._modules: dict[str, Module | None] = {}
        self._bindings: dict[str, dict[str, list[ast.stmt]]] = {}
        self.errors: dict[str, str] = {}  # module -> why it could not be read

    # -- modules -----------------------------------------------------------------------------------

    def module(self, name: str) -> Module | None:
        if name not in self._modules:
            self._modules[name] = self._load(name)
        return self._modules[name]

    def _load(self, name: str) -> Module | None:
        base = self.root.joinpath(*name.split("."))
        for path, is_package in ((base.with_suffix(".py"), False), (base / "__init__.py", True)):
            if path.is_file():
                source = path.read_text(encoding="utf-8", errors="replace")
                relative_path = path.relative_to(self.root).as_posix()
                try:
                    tree = ast.parse(source, filename=str(path))
                except SyntaxError as error:
                    self.errors[name] = f"cannot parse {relative_path}: {error}"
                    return None
                return Module(name, path, relative_path, tree, source, is_package)
        return None

    def module_at(self, path: str | Path) -> Module | None:
        """The module of an installed file (the runtime reader maps live classes to their sources)."""
        try:
            relative = Path(path).resolve().relative_to(self.root.resolve())
        except ValueError:
            return None
        parts = list(relative.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts = parts[:-1]
        return self.module(".".join(parts))

    def _module_bindings(self, module: Module) -> dict[str, list[ast.stmt]]:
        if module.name not in self._bindings:
            table: dict[str, list[ast.stmt]] = {}
            for statement in body_statements(module.tree.body):
                for name in bound_names(statement):
                    table.setdefault(name, []).append(statement)
            self._bindings[module.name] = table
        return self._bindings[module.name]

    @staticmethod
    def _absolute(module: Module, statement: ast.ImportFrom) -> str:
        """The module a ``from ... import`` names, made absolute."""
        if not statement.level:
            return statement.module or ""
        parts = module.package.split(".")
        parts = parts[: len(parts) - (statement.level - 1)] if statement.level > 1 else parts
        return ".".join(parts + ([statement.module] if statement.module else []))

    # -- names -------------------------------------------------------------------------------------

    def resolve(self, module_name: str, name: str, _depth: int = 0) -> tuple[Module, Any] | None:
        """What ``module.name`` is: ``(module, ClassDef/FunctionDef/Assign...)`` or ``(submodule, submodule)``.

        Follows imports and re-exports (``from .x import y`` in a package's ``__init__``).
        """
        module = self.module(module_name)
        if module is None or _depth > 25:
            return None
        candidates = self._module_bindings(module).get(name, [])
        for statement in sorted(candidates, key=binding_rank, reverse=True):
            if isinstance(statement, ast.ImportFrom):
                source = self._absolute(module, statement)
                alias = next(a for a in statement.names if (a.asname or a.name) == name)
                if not source.split(".")[0] == "vllm":
                    return module, External(f"{source}.{alias.name}")
                found = self.resolve(source, alias.name, _depth + 1)
                if found is None:
                    submodule = self.module(f"{source}.{alias.name}")
                    found = (submodule, submodule) if submodule is not None else None
                if found is not None:
                    return found
                continue
            if isinstance(statement, ast.Import):
                alias = next(a for a in statement.names if (a.asname or a.name.split(".")[0]) == name)
                target = alias.name if alias.asname else alias.name.split(".")[0]
                if target.split(".")[0] != "vllm":
                    return module, External(target)
                submodule = self.module(target)
                if submodule is not None:
                    return submodule, submodule
                continue
            return module, statement
        if module.is_package:
            submodule = self.module(f"{module_name}.{name}")
            if submodule is not None:
                return submodule, submodule
        return None

    def resolve_path(self, module_name: str, dotted: str) -> tuple[Module, Any] | None:
        """``module`` then ``A.B.c`` inside it: modules, classes (own bodies) and members."""
        module = self.module(module_name)
        found: tuple[Module, Any] | None = (module, module) if module is not None else None
        for part in dotted.split(".") if dotted else ():
            if found is None:
                return None
            where, node = found
            if isinstance(node, Module):
                found = self.resolve(node.name, part)
            elif isinstance(node, ast.ClassDef):
                members = self.class_members(ClassRef(where, node)).get(part)
                found = (where, members[-1]) if members else None
            else:
                return None
        return found

    def find_class(self, module_name: str, dotted: str) -> ClassRef | None:
        found = self.resolve_path(module_name, dotted)
        if found is not None and isinstance(found[1], ast.ClassDef):
            return ClassRef(*found)
        return None

    def class_in_file(self, path: str | Path, qualified_name: str) -> ClassRef | None:
        """The class statement ``qualified_name`` ("Outer.Inner") in an installed file, or None."""
        module = self.module_at(path)
        if module is None:
            return None
        body: Sequence[ast.stmt] = module.tree.body
        node: ast.ClassDef | None = None
        for part in qualified_name.split("."):
            found = [s for s in body_statements(body) if isinstance(s, ast.ClassDef) and s.name == part]
            if not found:
                return None
            node = found[-1]
            body = node.body
        return ClassRef(module, node) if node is not None else None

    # -- classes -----------------------------------------------------------------------------------

    def class_members(self, cls: ClassRef) -> dict[str, list[ast.stmt]]:
        """The names a class body binds (assignments, annotations, functions, nested classes)."""
        table: dict[str, list[ast.stmt]] = {}
        for statement in body_statements(cls.node.body):
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                table.setdefault(statement.target.id, []).append(statement)
            elif isinstance(statement, ast.Assign):
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        table.setdefault(target.id, []).append(statement)
            elif isinstance(statement, (*_FUNCTIONS, ast.ClassDef)):
                table.setdefault(statement.name, []).append(statement)
        return table

    def base_of(self, cls: ClassRef, expression: ast.expr) -> ClassRef | External:
        """The class a base-class expression of ``cls`` names."""
        while isinstance(expression, ast.Subscript):  # Generic[T], AttentionMetadataBuilder[M]
            expression = expression.value
        if isinstance(expression, ast.Name):
            found = self.resolve(cls.module.name, expression.id)
        elif isinstance(expression, ast.Attribute):
            chain = []
            node: ast.expr = expression
            while isinstance(node, ast.Attribute):
                chain.append(node.attr)
                node = node.value
            if not isinstance(node, ast.Name):
                return External(ast.unparse(expression))
            found = self.resolve(cls.module.name, node.id)
            for part in reversed(chain):
                if found is None or not isinstance(found[1], Module):
                    found = None
                    break
                found = self.resolve(found[1].name, part)
        else:
            return External(ast.unparse(expression))
        if found is not None and isinstance(found[1], ast.ClassDef):
            return ClassRef(*found)
        if found is not None and isinstance(found[1], External):
            return found[1]
        return External(ast.unparse(expression))

    def mro(self, cls: ClassRef) -> list[ClassRef | External]:
        """The class, then its bases depth first, left to right, each once (C3's order for simple trees)."""
        visited: list[ClassRef | External] = []
        seen: set[Any] = set()

        def visit(current: ClassRef | External, depth: int) -> None:
            key = current.identity if isinstance(current, ClassRef) else current.name
            if key in seen or depth > 30:
                return
            seen.add(key)
            visited.append(current)
            if isinstance(current, ClassRef):
                for base in current.node.bases:
                    visit(self.base_of(current, base), depth + 1)

        visit(cls, 0)
        # C3 puts a shared base after every class that derives from it: move each such base last.
        ordered: list[ClassRef | External] = []
        for index, current in enumerate(visited):
            if isinstance(current, ClassRef) and any(
                    isinstance(later, ClassRef) and later is not current and self._derives(later, current)
                    for later in visited[index + 1:]):
                continue
            ordered.append(current)
        for current in visited:
            if isinstance(current, ClassRef) and current not in ordered:
                ordered.append(current)
        return ordered

    def mro_classes(self, cls: ClassRef) -> list[ClassRef]:
        """The classes of the MRO that are in the tree."""
        return [current for current in self.mro(cls) if isinstance(current, ClassRef)]

    def _derives(self, subclass: ClassRef, base: ClassRef, depth: int = 0) -> bool:
        if depth > 30:
            return False
        for expression in subclass.node.bases:
            found = self.base_of(subclass, expression)
            if isinstance(found, ClassRef) and (found.identity == base.identity
                                                or self._derives(found, base, depth + 1)):
                return True
        return False

    def lookup(self, cls: ClassRef, name: str) -> tuple[ClassRef, ast.stmt] | None:
        """The first class of ``cls``'s MRO whose body binds ``name``, and that binding."""
        for current in self.mro_classes(cls):
            members = self.class_members(current).get(name)
            if members:
                function = pick_function(members)
                return current, function if function is not None else members[-1]
        return None

    def where_assigned(self, classes: Sequence[ClassRef], name: str,
                       init_only: bool) -> tuple[str, str] | None:
        """Where a class (its MRO: ``classes``) sets ``self.name``: ("Class.method", "file:line"), or None.

        ``init_only``: only what runs while ``__init__`` runs: ``__init__`` (the most derived one and the
        ``super().__init__`` chain: every ``__init__`` of the MRO) and the ``self.helper()`` methods it calls.
        """
        if not init_only:
            for cls in classes:
                for method_name, statements in self.class_members(cls).items():
                    function = pick_function(statements)
                    if function is None:
                        continue
                    statement = self_assignments(function).get(name)
                    if statement is not None:
                        return f"{cls.name}.{method_name}", cls.module.at(statement)
            return None
        methods: dict[str, tuple[ClassRef, ast.AST]] = {}
        for cls in classes:  # the first in MRO order wins, as at run time
            for method_name, statements in self.class_members(cls).items():
                function = pick_function(statements)
                if function is not None and method_name not in methods:
                    methods[method_name] = (cls, function)
        pending = [(cls, pick_function(self.class_members(cls).get("__init__", []))) for cls in classes]
        pending = [(cls, function) for cls, function in pending if function is not None]
        seen: set[int] = set()
        while pending:
            cls, function = pending.pop(0)
            if id(function) in seen:
                continue
            seen.add(id(function))
            statement = self_assignments(function).get(name)
            if statement is not None:
                return f"{cls.name}.{function.name}", cls.module.at(statement)
            for called in sorted(self_calls(function)):
                if called in methods:
                    pending.append(methods[called])
        return None

    # -- searching the whole tree (where did a thing go?) ------------------------------------------

    @cached_property
    def _files(self) -> tuple[Path, ...]:
        return tuple(sorted((self.root / "vllm").rglob("*.py")))

    def search(self, pattern: str, limit: int = 3) -> list[str]:
        """``file:line`` of the first ``limit`` matches of a regular expression in the tree's files."""
        expression = re.compile(pattern, re.M)
        hits = []
        for path in self._files:
            text = path.read_text(encoding="utf-8", errors="replace")
            for match in expression.finditer(text):
                hits.append(f"{path.relative_to(self.root).as_posix()}:{text.count(chr(10), 0, match.start()) + 1}")
                if len(hits) >= limit:
                    return hits
        return hits
