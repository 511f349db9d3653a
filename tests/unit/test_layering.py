"""The package layering of docs/architecture.md, checked by import-linter's contracts (.importlinter).

``test_contracts_kept`` runs ``lint-imports`` on the real tree and fails with its
report when a contract is broken. The other tests prove the contracts can fail:
the same ``.importlinter`` text, with the root package renamed, is pointed at a
throwaway package laid out like ``vllm_hogwild`` (written to ``tmp_path``); the
clean tree keeps every contract, and each variant adds one import that breaks a
rule, which must be reported by the contract that states it, with its line.
Imports inside functions count, as they do on the real tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".importlinter"
TOY = "toy_hogwild"

# Run import-linter's CLI with this interpreter (the venv's), wherever its script lies.
LINT = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]


def lint(cwd: Path, config: Path) -> subprocess.CompletedProcess:
    # A hang guard: the lint takes under a second here, 120 s is over 100 times that.
    env = dict(os.environ, PYTHONPATH=str(cwd), NO_COLOR="1", COLUMNS="200")
    return subprocess.run(
        [*LINT, str(config), "--no-cache", "--no-logo"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )


def test_contracts_kept():
    result = lint(ROOT, CONFIG)
    report = result.stdout + result.stderr
    assert result.returncode == 0, f"import-linter: a layering contract is broken\n{report}"


# A package laid out like vllm_hogwild; every import here is one the rules allow.
CLEAN = {
    "__init__.py": "",
    "core/__init__.py": "",
    "core/log.py": "import logging\n",
    "core/options.py": "import torch\nfrom toy_hogwild.core.log import logging\n",
    "core/errors.py": "",
    "core/machine.py": "import os\n",
    "core/patterns.py": "from toy_hogwild.core.errors import *\n",
    "core/protocol_text.py": "from toy_hogwild.core import patterns\n",
    "core/stats.py": "",
    "core/stats_channel.py": "from toy_hogwild.core import stats\n",
    "core/wire.py": "",
    "core/views/__init__.py": "",
    "core/views/spans.py": "",
    "core/replay/__init__.py": "",
    "core/replay/step_log.py": "from toy_hogwild.core import wire\n",
    "core/forkjoin/__init__.py": "",
    "core/forkjoin/families.py": "from toy_hogwild.core.views import spans\n",
    "core/protocol/__init__.py": "",
    "core/protocol/driver.py": "from toy_hogwild.core.forkjoin import families\nfrom toy_hogwild.core import protocol_text\n",
    "core/groups/__init__.py": "",
    "core/groups/table.py": (
        "from toy_hogwild.core.protocol import driver\nfrom toy_hogwild.core.replay import step_log\n"
        "from toy_hogwild.core.views.spans import *\n"
    ),
    "attention/__init__.py": "",
    "attention/paths.py": "import torch\nfrom toy_hogwild.core import options\n",
    "runner/__init__.py": "",
    "runner/forcing.py": "import vllm.v1\nfrom toy_hogwild.attention import paths\nfrom toy_hogwild.core import log\n",
    "scheduler/__init__.py": "",
    "scheduler/scheduler.py": "from vllm.v1.core.sched.scheduler import Scheduler\nfrom toy_hogwild.core import options\n",
    "serving/__init__.py": "",
    "serving/metrics.py": "import vllm\nfrom toy_hogwild.attention.paths import torch\nfrom toy_hogwild.core import log\n",
    "switch.py": (
        "from toy_hogwild.attention import paths\nfrom toy_hogwild.core import options\n"
        "def processor():\n    from toy_hogwild.runner import forcing\n"
    ),
    "patches/__init__.py": (
        "from toy_hogwild import switch\nfrom toy_hogwild.scheduler import scheduler\n"
        "from toy_hogwild.serving import metrics\nfrom toy_hogwild.runner import forcing\n"
    ),
    "plugin.py": "from toy_hogwild import patches\n",
    "tasks/__init__.py": "",
    "tasks/links.py": "import random\n",
    "models/__init__.py": "",
    "models/solve.py": "import torch\nimport vllm\nfrom toy_hogwild.tasks import links\n",
    "training/__init__.py": "",
    "training/train_links.py": "from toy_hogwild.models import solve\nfrom toy_hogwild.tasks import links\n",
    "tools/__init__.py": "",
    "tools/demo.py": "import vllm\nfrom toy_hogwild import plugin, switch\nfrom toy_hogwild.scheduler import scheduler\n",
}

# (file, line added, the contract's name as .importlinter gives it, what the report names)
VIOLATIONS = {
    # The way attention/cpu_layout.py imports vLLM's ops: lazily, inside a function.
    "attention-lazy-vllm": (
        "attention/paths.py",
        "def probe():\n    from vllm import _custom_ops as ops\n",
        "core and attention import no vllm",
        f"{TOY}.attention.paths -> vllm (l.4)",
    ),
    "core-vllm": ("core/log.py", "import vllm.config\n", "core and attention import no vllm", f"{TOY}.core.log -> vllm"),
    "core-attention": (
        "core/log.py",
        "from toy_hogwild.attention import paths\n",
        "Layers: a package imports only from the layers below it",
        f"{TOY}.core.log -> {TOY}.attention.paths",
    ),
    "attention-runner": (
        "attention/paths.py",
        "from toy_hogwild.runner import forcing\n",
        "Layers: a package imports only from the layers below it",
        f"{TOY}.attention.paths -> {TOY}.runner.forcing",
    ),
    "scheduler-attention": (
        "scheduler/scheduler.py",
        "from toy_hogwild.attention import paths\n",
        "The engine core (scheduler) imports nothing of the workers' attention",
        f"{TOY}.scheduler.scheduler -> {TOY}.attention.paths",
    ),
    "scheduler-runner": (
        "scheduler/scheduler.py",
        "from toy_hogwild.runner import forcing\n",
        "Layers: a package imports only from the layers below it",
        f"{TOY}.scheduler.scheduler -> {TOY}.runner.forcing",
    ),
    "scheduler-patches": (
        "scheduler/scheduler.py",
        "def patches():\n    import toy_hogwild.patches\n",
        "Layers: a package imports only from the layers below it",
        f"{TOY}.scheduler.scheduler -> {TOY}.patches",
    ),
    "runner-serving": (
        "runner/forcing.py",
        "from toy_hogwild.serving import metrics\n",
        "Layers: a package imports only from the layers below it",
        f"{TOY}.runner.forcing -> {TOY}.serving.metrics",
    ),
    "serving-scheduler": (
        "serving/metrics.py",
        "from toy_hogwild.scheduler import scheduler\n",
        "Layers: a package imports only from the layers below it",
        f"{TOY}.serving.metrics -> {TOY}.scheduler.scheduler",
    ),
    "serving-tools": (
        "serving/metrics.py",
        "from toy_hogwild.tools import demo\n",
        "Layers: a package imports only from the layers below it",
        f"{TOY}.serving.metrics -> {TOY}.tools.demo",
    ),
    "switch-serving": (
        "switch.py",
        "from toy_hogwild.serving import metrics\n",
        "The switch imports neither the scheduler nor the front end",
        f"{TOY}.switch -> {TOY}.serving.metrics",
    ),
    "core-views-groups": (
        "core/views/spans.py",
        "def table():\n    from toy_hogwild.core.groups import table\n",
        "core's sub-packages: a subsystem imports only from the ones below it",
        f"{TOY}.core.views.spans -> {TOY}.core.groups.table",
    ),
    "core-views-replay": (
        "core/views/spans.py",
        "from toy_hogwild.core.replay import step_log\n",
        "core's sub-packages: a subsystem imports only from the ones below it",
        f"{TOY}.core.views.spans -> {TOY}.core.replay.step_log",
    ),
    "core-base-protocol": (
        "core/options.py",
        "from toy_hogwild.core.protocol import driver\n",
        "core's sub-packages: a subsystem imports only from the ones below it",
        f"{TOY}.core.options -> {TOY}.core.protocol.driver",
    ),
    "new-core-module": (
        "core/extra.py",
        "",
        "core's sub-packages: a subsystem imports only from the ones below it",
        f"{TOY}.core.extra",
    ),
    "tasks-torch": (
        "tasks/links.py",
        "import torch\n",
        "The tasks are pure: no torch, no vLLM, nothing else of the package",
        f"{TOY}.tasks.links -> torch",
    ),
    "tasks-core": (
        "tasks/links.py",
        "def log():\n    from toy_hogwild.core import log\n",
        "The tasks are pure: no torch, no vLLM, nothing else of the package",
        f"{TOY}.tasks.links -> {TOY}.core.log",
    ),
    "models-training": (
        "models/solve.py",
        "def runs():\n    from toy_hogwild.training import train_links\n",
        "Layers: a package imports only from the layers below it",
        f"{TOY}.models.solve -> {TOY}.training.train_links",
    ),
    "training-tools": (
        "training/train_links.py",
        "from toy_hogwild.tools import demo\n",
        "Layers: a package imports only from the layers below it",
        f"{TOY}.training.train_links -> {TOY}.tools.demo",
    ),
    "new-top-level-module": (
        "extra.py",
        "",
        "Layers: a package imports only from the layers below it",
        f"{TOY}.extra",
    ),
}


def toy_tree(tmp_path: Path, extra: tuple[str, str] | None = None) -> Path:
    files = dict(CLEAN)
    if extra is not None:
        name, text = extra
        files[name] = files.get(name, "") + text
    for name, text in files.items():
        path = tmp_path / TOY / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    # The real contracts, the root package renamed (the external `vllm` stays).
    config = tmp_path / ".importlinter"
    config.write_text(CONFIG.read_text().replace("vllm_hogwild", TOY))
    return config


def test_toy_tree_keeps_the_contracts(tmp_path):
    result = lint(tmp_path, toy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_contract_reports_the_violation(tmp_path, case):
    name, line, contract, shown = VIOLATIONS[case]
    result = lint(tmp_path, toy_tree(tmp_path, (name, line)))
    report = result.stdout + result.stderr
    assert result.returncode != 0, report
    assert f"{contract} BROKEN" in report, report
    assert shown in report, report


# -- the shipped package and the development folders -----------------------------------------------------

DEV_FOLDERS = ("benchmarks", "tools", "tests")  # beside the package in the checkout; setup.py installs none
MAX_MODULE_LINES = 500


def _imported_tops(path: Path) -> set[str]:
    import ast

    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            tops |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.partition(".")[0])
    return tops


def test_the_package_imports_no_development_folder():
    """An installed plugin has no benchmarks/, tools/ or tests/: nothing in it may import them."""
    offenders = {str(p.relative_to(ROOT)): sorted(_imported_tops(p) & set(DEV_FOLDERS))
                 for p in (ROOT / "vllm_hogwild").rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


def test_no_two_modules_of_the_package_share_a_file_name():
    """A file name says which module it is: ``metrics.py`` in two folders is two names for a reader to keep apart."""
    seen: dict[str, list[str]] = {}
    for path in (ROOT / "vllm_hogwild").rglob("*.py"):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {name: where for name, where in seen.items() if len(where) > 1}


def test_the_package_ships_no_development_folder():
    from setuptools import find_packages

    shipped = find_packages(where=str(ROOT), include=["vllm_hogwild", "vllm_hogwild.*"])
    assert "vllm_hogwild" in shipped and all(p.startswith("vllm_hogwild") for p in shipped)
    assert "packages=find_packages(include=[\"vllm_hogwild\", \"vllm_hogwild.*\"])" in (ROOT / "setup.py").read_text()


@pytest.mark.parametrize("folder", ["vllm_hogwild", "benchmarks", "tools"])
def test_no_module_over_500_lines(folder):
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / folder).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_the_model_runner_v2_shim_is_the_tests_only() -> None:
    """The interpreter shim that lets vLLM 0.32 run Model Runner V2 on a CPU (tests/runner_v2_shim/) is a test
    fixture: nothing in the package loads it or registers a Triton backend."""
    root = Path(__file__).resolve().parents[2]
    for path in (root / "vllm_hogwild").rglob("*.py"):
        text = path.read_text()
        assert "runner_v2_shim" not in text and "backends[\"cpu\"]" not in text and "sitecustomize" not in text, path
    shim = (root / "tests" / "runner_v2_shim" / "sitecustomize.py").read_text()
    assert "TEST-ONLY" in shim and 'backends["cpu"]' in shim
