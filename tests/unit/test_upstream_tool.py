"""The static upstream checker on tiny synthetic ``vllm/`` trees (no vLLM import), and the table's coverage.

A "release" here is a few files written to ``tmp_path``: the baseline passes,
and each variant moves or changes one thing the table relies on, which must be
reported as CHANGED or MISSING with the file and line where it is now.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tools import upstream as up
from tools.upstream import TouchPoint as P
from tools.upstream import cli as upstream_cli
from tools.upstream import fetch as upstream_fetch

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "vllm/__init__.py": """
        import typing
        if typing.TYPE_CHECKING:
            from vllm.pkg.mod import Thing
    """,
    "vllm/envs.py": """
        environment_variables = {
            "VLLM_FLAG": lambda: None,
        }
    """,
    "vllm/pkg/__init__.py": """
        from .mod import Thing, helper
    """,
    "vllm/pkg/base.py": """
        import abc
        from dataclasses import dataclass


        class Base(abc.ABC):
            def __init__(self, config):
                self.config = config
                self._setup()

            def _setup(self):
                self.ready = True

            @abc.abstractmethod
            def run(self, x): ...

            def inherited(self, a, b):
                return a + b
    """,
    "vllm/pkg/mod.py": """
        from dataclasses import dataclass, field

        from vllm.pkg.base import Base


        class Thing(Base):
            def __init__(self, config, size):
                super().__init__(config)
                self.size = size

            def run(self, x, y=None):
                return self.queue.push(x)

            @staticmethod
            def make(parser):
                return parser

            async def serve(self, request, raw_request=None):
                return request

            async def stream(self, prompt):
                yield prompt

            def later(self):
                self.late = 1

            @property
            def prop(self):
                return 1

            def read(self, request):
                return request.request_id, request.prompt


        @dataclass
        class Out:
            a: int
            b: int | None = None
            c: list = field(default_factory=list)


        def helper(x, *, key=0):
            return x
    """,
}

M = "vllm.pkg.mod"
POINTS = [
    P("vllm.pkg", "Thing", up.CLASS, "t", base="vllm.pkg.base.Base"),
    P(M, "Thing.run", up.METHOD, "t", params=("self", "x"), own=True),
    P(M, "Thing.inherited", up.METHOD, "t", params=("self", "a", "b")),
    P(M, "Thing.make", up.METHOD, "t", params=("parser",), own=True, decorator="staticmethod"),
    P(M, "Thing.serve", up.METHOD, "t", params=("self", "request", "raw_request"), exact=True,
      defaults=(("raw_request", None),), call="async"),
    P(M, "Thing.stream", up.METHOD, "t", params=("self", "prompt"), call="asyncgen"),
    P(M, "Thing.size", up.INIT_ATTRIBUTE, "t"),
    P(M, "Thing.ready", up.INIT_ATTRIBUTE, "t"),  # set by a helper __init__ calls, in the base class
    P(M, "Thing.late", up.ATTRIBUTE, "t"),
    P(M, "Thing.prop", up.ATTRIBUTE, "t"),
    P(M, "Thing", up.SOURCE, "t", text="self.queue.push( x )"),
    P(M, "Thing", up.SETTABLE, "t", params=("hogwild_x",)),
    P(M, "Thing", up.ABSTRACT, "t", params=("run",)),
    P(M, "Thing.read", up.READS, "t", params=("request_id", "prompt"), text="request"),
    P(M, "Out.b", up.FIELD, "t", default=None, writes=True),
    P(M, "Out", up.SETTABLE, "t", params=("hogwild_y",)),
    P(M, "helper", up.FUNCTION, "t", params=("x",), keywords=("key",)),
    P("vllm.pkg", "helper", up.FUNCTION, "t", params=("x",)),  # a re-export through the package
    P("vllm", "Thing", up.CONSTANT, "t"),  # the lazy top-level name, resolved through TYPE_CHECKING
    P("vllm.envs", "VLLM_FLAG", up.ENV_VAR, "t"),
]


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def key(p: up.TouchPoint) -> tuple[str, str]:
    """How the tests name a row: its name inside ``vllm.pkg.mod``, else its whole target."""
    return (p.name if p.module == M else p.target, p.kind)


def results(root: Path, points=POINTS) -> dict[tuple[str, str], up.Result]:
    return {key(p): r for p, r in zip(points, up.check_static(root, points))}


def variant(tmp_path: Path, rel: str, old: str, new: str) -> dict[tuple[str, str], up.Result]:
    """The baseline with ``old`` replaced by ``new`` in ``rel`` (both dedented; re-indented where ``old`` is)."""
    files = dict(BASE)
    text = textwrap.dedent(files[rel])
    old, new = textwrap.dedent(old).strip("\n"), textwrap.dedent(new).strip("\n")
    for indent in ("", "    ", "        "):
        here = textwrap.indent(old, indent)
        if "\n" + here in "\n" + text:
            files[rel] = text.replace(here, textwrap.indent(new, indent), 1)
            return results(write_tree(tmp_path, files))
    raise AssertionError(f"{old!r} not in {rel}")


def line(rel: str, needle: str, files: dict[str, str] = BASE) -> str:
    """``rel:N``: where ``needle`` first appears in the tree's file."""
    text = textwrap.dedent(files[rel]).lstrip("\n")
    return f"{rel}:{text[: text.index(needle)].count(chr(10)) + 1}"


def broken(found: dict) -> dict[tuple[str, str], up.Result]:
    return {k: r for k, r in found.items() if not r.ok}


def test_baseline_is_all_ok_and_located(tmp_path) -> None:
    found = results(write_tree(tmp_path, BASE))
    assert not broken(found), [r.line() for r in broken(found).values()]
    assert found[("Thing.run", up.METHOD)].where == line("vllm/pkg/mod.py", "def run")
    assert found[("Thing.inherited", up.METHOD)].where == line("vllm/pkg/base.py", "def inherited")
    assert found[("Thing.ready", up.INIT_ATTRIBUTE)].detail == "set in Base._setup"
    assert found[("Thing.ready", up.INIT_ATTRIBUTE)].where == line("vllm/pkg/base.py", "self.ready")
    assert found[("Thing", up.SOURCE)].where == line("vllm/pkg/mod.py", "self.queue.push")
    assert found[("vllm.Thing", up.CONSTANT)].where == line("vllm/pkg/mod.py", "class Thing")
    assert found[("vllm.pkg.helper", up.FUNCTION)].where == line("vllm/pkg/mod.py", "def helper")


def test_a_method_moved_to_the_base_class_is_reported_for_the_wrap(tmp_path) -> None:
    found = variant(tmp_path, "vllm/pkg/mod.py", """
            def run(self, x, y=None):
                return self.queue.push(x)
        """, """
            def walk(self, x, y=None):
                return self.queue.push(x)
        """)
    r = found[("Thing.run", up.METHOD)]
    assert r.status == up.CHANGED and "inherited from Base" in r.detail
    assert r.where == line("vllm/pkg/base.py", "def run")
    assert set(broken(found)) == {("Thing.run", up.METHOD)}


def test_a_renamed_or_reordered_parameter_is_changed(tmp_path) -> None:
    found = variant(tmp_path, "vllm/pkg/mod.py", "def run(self, x, y=None):", "def run(self, value, y=None):")
    r = found[("Thing.run", up.METHOD)]
    assert r.status == up.CHANGED and "(self, value, y)" in r.detail and r.where == line("vllm/pkg/mod.py", "def run")
    found = variant(tmp_path, "vllm/pkg/mod.py", "def helper(x, *, key=0):", "def helper(x, *, flag=0):")
    assert found[("helper", up.FUNCTION)].status == up.CHANGED
    assert "no parameter 'key'" in found[("helper", up.FUNCTION)].detail


def test_exact_parameters_defaults_decorators_and_async(tmp_path) -> None:
    found = variant(tmp_path, "vllm/pkg/mod.py", "async def serve(self, request, raw_request=None):",
                    "async def serve(self, request, raw_request=None, extra=1):")
    assert "expected exactly" in found[("Thing.serve", up.METHOD)].detail
    found = variant(tmp_path, "vllm/pkg/mod.py", "async def serve(self, request, raw_request=None):",
                    "async def serve(self, request, raw_request=0):")
    assert "raw_request's default now 0" in found[("Thing.serve", up.METHOD)].detail
    found = variant(tmp_path, "vllm/pkg/mod.py", "async def serve(self, request, raw_request=None):",
                    "def serve(self, request, raw_request=None):")
    assert "now sync (expected async)" in found[("Thing.serve", up.METHOD)].detail
    found = variant(tmp_path, "vllm/pkg/mod.py", "yield prompt", "return prompt")
    assert "now async (expected asyncgen)" in found[("Thing.stream", up.METHOD)].detail
    found = variant(tmp_path, "vllm/pkg/mod.py", """
            @staticmethod
            def make(parser):
        """, """
            @classmethod
            def make(cls, parser):
        """)
    detail = found[("Thing.make", up.METHOD)].detail
    assert "no longer a staticmethod" in detail and "(cls, parser)" in detail


def test_a_missing_attribute_and_one_no_longer_set_in_init(tmp_path) -> None:
    found = variant(tmp_path, "vllm/pkg/mod.py", "self.size = size", "self.capacity = size")
    r = found[("Thing.size", up.INIT_ATTRIBUTE)]
    assert r.status == up.MISSING and "never sets size" in r.detail
    found = variant(tmp_path, "vllm/pkg/mod.py", "self.late = 1", "self.late = 1\nself.size = 2")
    assert found[("Thing.size", up.INIT_ATTRIBUTE)].ok  # still set in __init__ too
    files = dict(BASE)
    files["vllm/pkg/mod.py"] = textwrap.dedent(BASE["vllm/pkg/mod.py"]).replace(
        "        self.size = size\n", "        pass\n").replace("self.late = 1", "self.size = 1")
    found = results(write_tree(tmp_path, files))
    r = found[("Thing.size", up.INIT_ATTRIBUTE)]
    assert r.status == up.CHANGED and "only in Thing.later" in r.detail
    assert r.where == line("vllm/pkg/mod.py", "self.size = 1", files)
    found = variant(tmp_path, "vllm/pkg/mod.py", """
            @property
            def prop(self):
                return 1
        """, "")
    assert found[("Thing.prop", up.ATTRIBUTE)].status == up.MISSING


def test_a_function_moved_to_another_module_is_missing_with_where_it_went(tmp_path) -> None:
    files = dict(BASE)
    mod = textwrap.dedent(BASE["vllm/pkg/mod.py"])
    files["vllm/pkg/mod.py"] = mod[: mod.index("def helper")]
    files["vllm/pkg/__init__.py"] = "from .mod import Thing\nfrom .other import helper\n"
    files["vllm/pkg/other.py"] = "import os\n\n\ndef helper(x, *, key=0):\n    return x\n"
    found = results(write_tree(tmp_path, files))
    r = found[("helper", up.FUNCTION)]
    assert r.status == up.MISSING and "now at vllm/pkg/other.py:4" in r.detail
    assert found[("vllm.pkg.helper", up.FUNCTION)].where == "vllm/pkg/other.py:4"  # the re-export follows


def test_a_file_that_does_not_parse_is_named(tmp_path) -> None:
    found = variant(tmp_path, "vllm/pkg/mod.py", "def later(self):", "def later(self)")
    r = found[("Thing.run", up.METHOD)]
    assert r.status == up.MISSING and r.detail.startswith("cannot parse vllm/pkg/mod.py")


def test_a_missing_module_or_class_names_where_it_lives_now(tmp_path) -> None:
    files = {k: v for k, v in BASE.items() if k != "vllm/pkg/mod.py"}
    files["vllm/pkg/__init__.py"] = "from .moved import Thing, helper\n"
    files["vllm/pkg/moved.py"] = BASE["vllm/pkg/mod.py"]
    found = results(write_tree(tmp_path, files))
    r = found[("Thing.run", up.METHOD)]
    assert r.status == up.MISSING and "no module vllm.pkg.mod" in r.detail
    assert line("vllm/pkg/moved.py", "class Thing", files) in r.detail
    assert found[("vllm.pkg.Thing", up.CLASS)].ok  # the package still exports it


def test_sources_fields_settable_abstract_reads_env(tmp_path) -> None:
    found = variant(tmp_path, "vllm/pkg/mod.py", "return self.queue.push(x)", "return self.queue.append(x)")
    assert "no longer contains 'self.queue.push( x )'" in found[("Thing", up.SOURCE)].detail
    found = variant(tmp_path, "vllm/pkg/mod.py", "b: int | None = None", "b: int | None = 0")
    assert "default now 0 (expected None)" in found[("Out.b", up.FIELD)].detail
    found = variant(tmp_path, "vllm/pkg/mod.py", "@dataclass\nclass Out:", "@dataclass(frozen=True)\nclass Out:")
    assert "frozen dataclass" in found[("Out", up.SETTABLE)].detail
    assert "frozen dataclass: the plugin assigns b" in found[("Out.b", up.FIELD)].detail
    found = variant(tmp_path, "vllm/pkg/mod.py", "@dataclass\nclass Out:", "@dataclass(slots=True)\nclass Out:")
    assert "__slots__" in found[("Out", up.SETTABLE)].detail
    found = variant(tmp_path, "vllm/pkg/mod.py", "c: list = field(default_factory=list)",
                    "c: list = field(default_factory=list)\nhogwild_y: int = 0")
    assert "now defines hogwild_y" in found[("Out", up.SETTABLE)].detail
    found = variant(tmp_path, "vllm/pkg/base.py", """
            def inherited(self, a, b):
        """, """
            @abc.abstractmethod
            def close(self): ...

            def inherited(self, a, b):
        """)
    assert "new abstract methods the plugin's subclass lacks: close (vllm/pkg/base.py:" in \
        found[("Thing", up.ABSTRACT)].detail
    found = variant(tmp_path, "vllm/pkg/mod.py", "return request.request_id, request.prompt",
                    "return request.request_id, request.prompt, getattr(request, 'salt')")
    assert f"now reads request.salt ({line('vllm/pkg/mod.py', 'return request.request_id')})" in \
        found[("Thing.read", up.READS)].detail
    found = variant(tmp_path, "vllm/envs.py", '"VLLM_FLAG"', '"VLLM_OTHER"')
    assert found[("vllm.envs.VLLM_FLAG", up.ENV_VAR)].status == up.MISSING
    found = variant(tmp_path, "vllm/pkg/mod.py", "class Thing(Base):", "class Thing:")
    assert "no longer a subclass of vllm.pkg.base.Base" in found[("vllm.pkg.Thing", up.CLASS)].detail


def test_msgspec_and_pydantic_classes(tmp_path) -> None:
    files = dict(BASE)
    files["vllm/pkg/models.py"] = """
        import msgspec
        from pydantic import BaseModel, ConfigDict


        class Open(BaseModel):
            model_config = ConfigDict(extra="allow")


        class Response(Open):
            choices: list


        class Closed(BaseModel):
            choices: list


        class Strict(Open):
            model_config = ConfigDict(extra="allow", validate_assignment=True)
            text: str


        class Wire(msgspec.Struct, array_like=True):
            ids: list


        class FrozenWire(msgspec.Struct, frozen=True, dict=True):
            ids: list
    """
    points = [P("vllm.pkg.models", n, up.SETTABLE, "t", params=("hogwild",)) for n in
              ("Response", "Closed", "Wire", "FrozenWire")]
    points += [P("vllm.pkg.models", "Strict.text", up.FIELD, "t", writes=True),
               P("vllm.pkg.models", "Wire.ids", up.FIELD, "t", writes=True),
               P("vllm.pkg.models", "FrozenWire.ids", up.FIELD, "t", writes=True)]
    found = {p.name: r for p, r in zip(points, up.check_static(write_tree(tmp_path, files), points))}
    assert found["Response"].ok
    assert "extra='allow'" in found["Closed"].detail
    assert "msgspec.Struct without dict=True" in found["Wire"].detail
    assert found["FrozenWire"].ok  # dict=True takes new attributes
    assert "validate_assignment=True" in found["Strict.text"].detail
    assert found["Wire.ids"].ok
    assert "frozen" in found["FrozenWire.ids"].detail


def test_cli_reports_each_point_and_fails_when_something_broke(tmp_path, capsys, monkeypatch) -> None:
    root = write_tree(tmp_path / "ok", BASE)
    monkeypatch.setattr(upstream_cli, "check_static", lambda r, points=tuple(POINTS): up.check_static(r, points))
    assert up.main(["--src", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"{len(POINTS)} touch points: {len(POINTS)} OK, 0 CHANGED, 0 MISSING" in out
    assert out.count("\nOK ") + out.startswith("OK ") == len(POINTS)
    files = dict(BASE)
    files["vllm/pkg/mod.py"] = textwrap.dedent(BASE["vllm/pkg/mod.py"]).replace("self.size = size", "pass")
    bad = write_tree(tmp_path / "bad", files)
    assert up.main(["--src", str(bad), "-q"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("MISSING  init-attr  vllm.pkg.mod.Thing.size")
    assert "1 MISSING" in out


def test_patches_are_applied_in_order_to_a_copy(tmp_path) -> None:
    root = write_tree(tmp_path / "src", {"vllm/a.py": "x = 1\ny = 2\n"})
    first = tmp_path / "01.patch"
    first.write_text("--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1,2 +1,2 @@\n-x = 1\n+x = 10\n y = 2\n")
    second = tmp_path / "02.patch"  # applies only after the first
    second.write_text("--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1,2 +1,2 @@\n-x = 10\n+x = 100\n y = 2\n")
    third = tmp_path / "03.patch"
    third.write_text("--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1,2 +1,2 @@\n-x = 3\n+x = 4\n y = 2\n")
    got = up.check_patches(root, [first, second, third])
    assert [(name, ok) for name, ok, _ in got] == [("01.patch", True), ("02.patch", True), ("03.patch", False)]
    assert "patch failed" in got[2][2] or "does not apply" in got[2][2]
    assert (root / "vllm/a.py").read_text() == "x = 1\ny = 2\n"  # the sources themselves are untouched


def test_patches_without_dir_means_the_checkouts_top_level_folder(tmp_path, capsys) -> None:
    """``--patches`` alone applies the checkout's ``patches/`` (the diffs are not in the package); a folder with
    no diff fails, saying where the diffs are, rather than passing with nothing applied."""
    parser = upstream_cli._parser()
    assert parser.parse_args(["--runtime", "--patches"]).patches == ROOT / "patches" == upstream_cli.PATCHES
    assert parser.parse_args(["--runtime", "--patches", "d"]).patches == Path("d")
    assert parser.parse_args(["--runtime"]).patches is None
    assert sorted(upstream_cli.PATCHES.glob("[0-9]*.patch"))
    assert upstream_cli._print_patches(tmp_path, tmp_path) is False
    assert "no upstream diffs" in capsys.readouterr().out


# -- the wheel ----------------------------------------------------------------------------------


def test_pick_wheel_takes_the_x86_64_linux_wheel() -> None:
    files = [{"filename": n, "url": n, "sha256": None} for n in (
        "vllm-0.33.0.tar.gz", "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl",
        "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", "vllm-0.33.1-cp38-abi3-manylinux_2_28_x86_64.whl")]
    assert up.pick_wheel(files, "0.33.0")["filename"] == "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert up.pick_wheel(files, "0.34.0") is None


def test_extract_sources_keeps_only_the_python_files_of_vllm(tmp_path) -> None:
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/__init__.py", "")
        zf.writestr("vllm/_version.py", "__version__ = version = '9.9.9'\n")
        zf.writestr("vllm/v1/core/x.py", "X = 1\n")
        zf.writestr("vllm/_C.abi3.so", b"\0" * 10)
        zf.writestr("vllm-9.9.9.dist-info/METADATA", "Name: vllm\n")
        zf.writestr("vllm/../evil.py", "")
    dest = tmp_path / "vllm-9.9.9"
    assert up.extract_sources(wheel, dest) == 3
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "vllm/__init__.py", "vllm/_version.py", "vllm/v1/core/x.py"]
    assert up.release_version(dest) == "9.9.9"


def test_fetch_sources_uses_the_cache_without_the_network(tmp_path, monkeypatch) -> None:
    cached = write_tree(tmp_path / "vllm-1.2.3", {"vllm/__init__.py": "", "vllm/_version.py": "__version__ = '1.2.3'\n"})
    (cached / ".complete").write_text("{}\n")
    monkeypatch.setattr(upstream_fetch, "find_wheel", lambda *a, **k: pytest.fail("no lookup for a cached release"))
    assert up.fetch_sources("1.2.3", tmp_path, log=lambda m: None) == cached


# -- the table ----------------------------------------------------------------------------------


def test_the_tool_imports_no_vllm() -> None:
    code = "import sys, tools.upstream as u; assert u.TOUCH_POINTS; " \
           "assert not [m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')], 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_table_rows_are_well_formed() -> None:
    seen = set()
    for p in up.TOUCH_POINTS:
        assert p.kind in up.KINDS, p
        assert p.module == "vllm" or p.module.startswith("vllm."), p
        assert p.used_by, p
        key = (p.module, p.name, p.kind, p.text)
        assert key not in seen, p
        seen.add(key)
        if p.kind in (up.SOURCE, up.READS):
            assert p.text, p
        if p.own or p.decorator or p.call or p.exact or p.defaults or p.keywords:
            assert p.kind in (up.METHOD, up.FUNCTION), p
        if p.kind == up.SETTABLE:
            assert p.params, p


def _vllm_imports() -> set[tuple[str, str, str]]:
    """(file, module, name) of every ``from vllm... import name`` in the plugin (not this tool)."""
    found = set()
    for path in sorted((ROOT / "vllm_hogwild").rglob("*.py")):
        if (ROOT / "vllm_hogwild" / "tools" / "upstream") in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module and (
                    node.module == "vllm" or node.module.startswith("vllm.")):
                for alias in node.names:
                    found.add((path.relative_to(ROOT).as_posix(), node.module, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "vllm" or alias.name.startswith("vllm."):
                        found.add((path.relative_to(ROOT).as_posix(), alias.name, ""))
    return found


def test_every_vllm_name_the_plugin_imports_is_in_the_table() -> None:
    imports = _vllm_imports()
    assert any(module == "vllm.v1.core.sched.scheduler" for _, module, _ in imports)  # the scan sees the plugin

    def covered(module: str, name: str) -> bool:
        for p in up.TOUCH_POINTS:
            if p.module == module and (not name or p.name == name or p.name.startswith(name + ".")):
                return True
            if name and p.module == f"{module}.{name}":  # `from vllm import _custom_ops`
                return True
        return False

    missing = sorted(f"{f}: from {m} import {n}" for f, m, n in imports if not covered(m, n))
    assert not missing, "add these rows to their area module in vllm_hogwild/patches/:\n" + "\n".join(missing)
