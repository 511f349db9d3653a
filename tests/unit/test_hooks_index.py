"""The runtime hooks (the rows of vllm_hogwild/patches/ that carry one) against the code and the upstream diffs.

Both directions: every hook row names code that installs it, and every wrap the code installs has a row.
The diffs live in the top-level patches/ with their index (patches/README.md): every diff is listed there,
every diff a hook or an area module names exists there, and every link of the index resolves.
Pure: no vLLM import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import vllm_hogwild.patches as hooks

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "vllm_hogwild" / "patches"  # the runtime touch points: the rows, the hooks, the wraps
DIFFS = ROOT / "patches"  # the upstream diffs and their index
INDEX = DIFFS / "README.md"
DIFF_NAME = re.compile(r"\b\d\d-[a-z0-9-]+\.patch\b")


def test_every_hook_names_its_upstream_patch_or_why_there_is_none() -> None:
    patches = {p.name for p in DIFFS.glob("*.patch")}
    for hook in hooks.HOOKS:
        if hook.patch.startswith("none: "):
            assert len(hook.patch) > 40, hook  # a reason, not a placeholder
        else:
            assert hook.patch in patches, hook
    assert {h.mechanism for h in hooks.HOOKS} == {"class", "instance", "override", "kernel", "function"}
    assert len({h.target for h in hooks.HOOKS}) == len(hooks.HOOKS)


def test_every_class_hook_names_its_wrapper() -> None:
    for hook in hooks.HOOKS:
        assert bool(hook.hook) == (hook.mechanism == "class"), hook
        if hook.hook:
            where, _, name = hook.hook.partition(":")
            source = (ROOT / (where.replace(".", "/") + ".py")).read_text()
            assert f"def {name}(" in source, hook


def _setattr_names(path: Path) -> set[str]:
    """Names the module sets on objects: setattr(obj, NAME, ...), obj.NAME = ..., and self.NAME = self.other
    (an instance's own method replaced by another of its methods)."""
    tree = ast.parse(path.read_text())
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and len(node.args) == 3:
            arg = node.args[1]
            names.add(arg.value if isinstance(arg, ast.Constant) else constants.get(getattr(arg, "id", None)))
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if not isinstance(target, ast.Attribute):
                    continue
                owner = getattr(target.value, "id", None)
                rebinds_own_method = (owner == "self" and isinstance(node.value, ast.Attribute)
                                      and getattr(node.value.value, "id", None) == "self")
                if owner not in ("self", "cls") or rebinds_own_method:
                    names.add(target.attr)
    return names - {None}


# Names a module sets on vLLM objects that are state, not wraps: no behaviour of vLLM's is replaced by them.
STATE = {
    "vllm_hogwild.scheduler.kv": set(),
    "vllm_hogwild.runner.v1": {"_hogwild_hook"},  # the mark that a runner is already wrapped
    "vllm_hogwild.runner.v2": {"_hogwild_hook"},
    "vllm_hogwild.scheduler.scheduler": {"spec_token_ids", "num_computed_tokens"},  # request fields
}


def test_instance_wraps_are_the_ones_the_code_installs() -> None:
    """Both directions: each instance row is set by its module, and each name a module sets on a vLLM object is
    an instance row or state named in ``STATE``."""
    indexed: dict[str, set[str]] = {}
    for hook in hooks.HOOKS:
        if hook.mechanism == "instance":
            indexed.setdefault(hook.where, set()).add(hook.method)
    assert set(indexed) == set(STATE)
    for where, methods in indexed.items():
        installed = _setattr_names(ROOT / (where.replace(".", "/") + ".py"))
        assert methods <= installed, (where, methods - installed)
        assert installed - STATE[where] == methods, (where, "set, not indexed:", installed - STATE[where] - methods)
        assert not methods & STATE[where], where


def test_the_both_directions_check_misses_an_unindexed_wrap(tmp_path) -> None:
    """The control: a module that replaces one more method than its rows name is caught."""
    source = (ROOT / "vllm_hogwild/runner/v2.py").read_text() + "\n\ndef _x(s):\n    s.sample = s.other\n"
    (tmp_path / "m.py").write_text(source)
    methods = {h.method for h in hooks.HOOKS if h.where == "vllm_hogwild.runner.v2"}
    assert _setattr_names(tmp_path / "m.py") - STATE["vllm_hogwild.runner.v2"] != methods


def test_kernels_and_functions_are_the_ones_the_code_replaces() -> None:
    """Each kernel or function row is replaced by its module, under the name the row gives."""
    rows = [h for h in hooks.HOOKS if h.mechanism in ("kernel", "function")]
    assert rows
    for hook in rows:
        module, _, name = hook.target.partition(":")
        source = (ROOT / (hook.where.replace(".", "/") + ".py")).read_text()
        if hook.mechanism == "kernel":  # registered under vLLM's dotted kernel name
            assert f'"{module}.{name}"' in source, hook
        else:  # assigned on its module
            assert f".{name} = " in source and module.rpartition(".")[2] in source, hook


def _wrappers(path: Path) -> set[str]:
    """The module's class wraps: top-level functions called as ``wrap(original, self, ...)``."""
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and len(node.args.args) >= 2 and node.args.args[0].arg == "original"}


def test_class_wraps_are_the_rows_and_live_in_the_folder() -> None:
    """Both directions for class wraps: each ``class`` row's wrapper is a wrap function of its module in the
    folder, each wrap function in the folder is some row's wrapper, and no module outside the folder defines
    one (a vLLM class wrapped elsewhere would have no row)."""
    rows = {h.hook for h in hooks.HOOKS if h.mechanism == "class"}
    assert all(h.startswith("vllm_hogwild.patches.") for h in rows), rows
    defined = {f"vllm_hogwild.patches.{path.stem}:{name}" for path in FOLDER.glob("*.py") for name in _wrappers(path)}
    assert defined == rows, ("defined, no row:", defined - rows, "row, not defined:", rows - defined)
    elsewhere = {f"{path.relative_to(ROOT)}:{name}" for path in (ROOT / "vllm_hogwild").rglob("*.py")
                 if FOLDER not in path.parents for name in _wrappers(path)}
    assert not elsewhere, elsewhere


def test_the_class_wrap_check_misses_a_wrap_without_a_row(tmp_path) -> None:
    """The control: one more wrap function in an area module is one the rows do not name."""
    source = (FOLDER / "stat_logger.py").read_text() + "\n\ndef extra_wrap(original, self):\n    return original(self)\n"
    (tmp_path / "stat_logger.py").write_text(source)
    named = {h.hook.partition(":")[2] for h in hooks.HOOKS if h.where == "vllm_hogwild.patches.stat_logger"}
    assert _wrappers(tmp_path / "stat_logger.py") - named == {"extra_wrap"}


def test_every_diff_in_the_folder_is_named_by_a_hook_or_says_what_it_retires() -> None:
    """No diff without a row: each is some hook's patch, or retires code the folder's docs name (05, 09)."""
    named = {h.patch for h in hooks.HOOKS}
    docs = "".join(path.read_text() for path in FOLDER.glob("*.py"))
    for diff in DIFFS.glob("*.patch"):
        assert diff.name in named or diff.name in docs, diff.name


def test_the_diffs_are_top_level_not_in_the_package() -> None:
    assert sorted(p.name for p in DIFFS.glob("*.patch")), "no upstream diffs in patches/"
    assert not list(FOLDER.glob("*.patch")) and not (FOLDER / "README.md").exists(), \
        "the upstream diffs and their index live in the top-level patches/, not in vllm_hogwild/patches/"


def _diff_names_named_by_the_folder() -> dict[str, set[str]]:
    """Every ``NN-....patch`` a hook (``HOOKS``' patch) names, or the package's modules (docstrings, comments, log
    messages: the area modules and the code a diff retires) and the docs name."""
    named: dict[str, set[str]] = {}
    for hook in hooks.HOOKS:
        if not hook.patch.startswith("none: "):
            named.setdefault(hook.patch, set()).add(f"the hook on {hook.target}")
    texts = [*(ROOT / "vllm_hogwild").rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    for path in texts:
        for name in DIFF_NAME.findall(path.read_text()):
            named.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return named


def test_every_diff_a_hook_or_an_area_module_names_exists() -> None:
    named = _diff_names_named_by_the_folder()
    assert named, "no hook names an upstream diff"
    present = {p.name for p in DIFFS.glob("*.patch")}
    missing = {name: sorted(where) for name, where in named.items() if name not in present}
    assert not missing, f"named, but not in patches/: {missing}"


def _links(text: str) -> list[str]:
    """The Markdown links' targets (``[text](target)``), anchors dropped."""
    return [target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", text)]


def test_the_index_lists_every_diff_and_the_hook_module_it_retires() -> None:
    text = INDEX.read_text()
    links = _links(text)
    for diff in sorted(DIFFS.glob("[0-9]*.patch")):
        assert diff.name in links, f"patches/README.md does not link {diff.name}"
        row = next((line for line in text.splitlines() if f"]({diff.name})" in line), "")
        modules = {t for t in _links(row) if t.startswith("../vllm_hogwild/patches/") and t.endswith(".py")}
        assert modules, f"the index's row for {diff.name} links no hook module in vllm_hogwild/patches/"
        for module in modules:  # the module it links names the diff
            assert diff.name in (DIFFS / module).read_text(), (diff.name, module)
    assert not [t for t in links if DIFF_NAME.fullmatch(t) and not (DIFFS / t).is_file()]


def test_every_link_of_the_index_resolves() -> None:
    links = [t for t in _links(INDEX.read_text()) if t and "://" not in t]
    assert links
    broken = [t for t in links if not (DIFFS / t).resolve().exists()]
    assert not broken, f"patches/README.md links what does not exist: {broken}"


def test_the_index_checks_catch_an_unlisted_diff_and_a_broken_link(tmp_path) -> None:
    """The control: a diff missing from the index, and a link to a module that is not there, are found."""
    text = INDEX.read_text().replace("](12-runner-placed-tokens.patch)", "](13-gone.patch)")
    text += "\n[x](../vllm_hogwild/patches/nowhere.py)\n"
    links = _links(text)
    assert "12-runner-placed-tokens.patch" not in links
    assert [t for t in links if not (DIFFS / t).resolve().exists()] == ["13-gone.patch", "../vllm_hogwild/patches/nowhere.py"]
