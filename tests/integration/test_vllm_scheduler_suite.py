"""vLLM's own scheduler unit tests pass unchanged with the Hogwild scheduler, for plain traffic, with and without
async scheduling.

``tests/v1/core/test_scheduler.py`` and ``tests/v1/core/test_async_scheduler.py`` of the
pinned vLLM release (and the helpers they import) are taken from vLLM's sdist (:mod:`tests.integration.vllm_sources`)
and run twice, in pytest subprocesses, unmodified:

- **stock**: vLLM as it is, without this plugin (``VLLM_PLUGINS`` names every
  installed vLLM plugin but ``hogwild``);
- **hogwild**: a ``conftest.py`` generated next to the extracted tests
  registers the plugin (as vLLM does in every process), adds ``{"hogwild": {}}``
  to ``additional_config`` of every ``VllmConfig`` the tests build (the switch
  the Hogwild scheduler reads), and makes every construction of vLLM's
  ``Scheduler`` (``create_scheduler`` in ``tests/v1/core/utils.py``, the direct
  ``Scheduler(...)`` calls in ``test_scheduler.py``) build ``HogwildScheduler``,
  and every construction of ``AsyncScheduler`` (``create_scheduler(async_scheduling=True)``)
  builds ``HogwildAsyncScheduler``, the one the plugin's engines run with async scheduling
  on. ``DiffusionScheduler`` stays as it is (Hogwild has no diffusion scheduler);
  ``object.__new__(...)`` (no ``__init__``) stays stock too. The conftest counts, per
  test, the Hogwild schedulers built, and which.

The test fails when a test that passes with the stock scheduler does not pass
with the Hogwild one. Tests that fail with the stock scheduler on this build
are printed, not required.

Hub models (no hub access): a Hugging Face cache is written under ``tmp_path``
and the runs use it offline (``HF_HOME``, ``HF_HUB_OFFLINE=1``):

- ``facebook/opt-125m``: config only, ``OPTConfig()`` with opt-125m's values
  (its defaults) and its generation config, plus the default model's tokenizer
  (SmolLM2's, :func:`vllm_hogwild.models.default.prepare`);
- ``llava-hf/llava-1.5-7b-hf``: config only, a ``LlavaConfig`` with the real
  repository's values, and a ``LlavaProcessor`` (CLIP image processor, the
  same tokenizer with ``<image>`` added); written only where ``torchvision`` is
  installed: without it vLLM cannot inspect the LLaVA model class (vLLM's CPU
  build does not install it), so the multimodal tests fail in both runs either
  way, and fail fast without the stand-in (no inspection subprocess per test).

``tests/conftest.py`` of vLLM is not extracted: it needs vLLM's test
requirements (``tblib``, ``anthropic``, ...), and its autouse fixtures only
clean up after tests. The one test that takes one of its fixtures
(``caplog_vllm``) errors in both runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from importlib.metadata import distributions
from pathlib import Path

import pytest

from tests.integration import vllm_sources

pytestmark = pytest.mark.vllm

SUITES = ("tests/v1/core/test_scheduler.py", "tests/v1/core/test_async_scheduler.py")
MODES = ("stock", "hogwild")
TIMEOUT_S = 900  # a hang guard: both runs took 56-58 s in a whole suite's run on 2 cores; 15 times that
# Guards against a harness that runs nothing (both runs failing alike would pass).
MIN_STOCK_PASSED = 150
MIN_HOGWILD_EXERCISED = 100  # tests that pass with at least one HogwildScheduler built
MIN_ASYNC_EXERCISED = 10  # of them, tests of test_async_scheduler.py that built a HogwildAsyncScheduler

CONFTEST = r'''"""Generated at test time by vllm-hogwild (tests/integration/test_vllm_scheduler_suite.py), not vLLM."""
import json
import os
from pathlib import Path

import pytest

MODE = os.environ["HOGWILD_SUITE_MODE"]  # "stock" or "hogwild"
RESULTS = Path(os.environ["HOGWILD_SUITE_RESULTS"])

import tests  # noqa: E402  vLLM's tests package, extracted next to this file (not vllm-hogwild's)

assert Path(tests.__file__).resolve().parent == Path(__file__).resolve().parent / "tests", tests.__file__

_built = [0, 0]  # HogwildSchedulers built during the current test, and of them HogwildAsyncSchedulers

if MODE == "hogwild":
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    import vllm_hogwild.plugin
    from vllm_hogwild.scheduler.scheduler import HogwildAsyncScheduler, HogwildScheduler

    vllm_hogwild.plugin.register()  # what vLLM does in every process it starts

    _post_init = VllmConfig.__post_init__

    def _post_init_with_switch(self):
        # the switch: every VllmConfig the tests build carries {"hogwild": {}}
        if isinstance(self.additional_config, dict) and "hogwild" not in self.additional_config:
            self.additional_config = {**self.additional_config, "hogwild": {}}
        _post_init(self)

    VllmConfig.__post_init__ = _post_init_with_switch

    _ours = {Scheduler: HogwildScheduler, AsyncScheduler: HogwildAsyncScheduler}

    def _new(cls, *args, **kwargs):
        # Scheduler(...) and AsyncScheduler(...) build the Hogwild ones (type() then runs their __init__);
        # other subclasses (DiffusionScheduler) stay what they are.
        return object.__new__(_ours.get(cls, cls))

    Scheduler.__new__ = _new

    _init = HogwildScheduler.__init__

    def _counted_init(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        if self.hogwild_options is None:
            raise AssertionError("HogwildScheduler built without additional_config['hogwild']")
        _built[0] += 1
        _built[1] += isinstance(self, HogwildAsyncScheduler)

    HogwildScheduler.__init__ = _counted_init

_results = {}


@pytest.fixture(autouse=True)
def _hogwild_suite_count(request):
    _built[:] = [0, 0]
    yield
    entry = _results.setdefault(request.node.nodeid, {})
    entry["hogwild_schedulers"], entry["hogwild_async_schedulers"] = _built


def pytest_runtest_logreport(report):
    entry = _results.setdefault(report.nodeid, {})
    if report.when != "call" and report.passed:
        return
    if hasattr(report, "wasxfail"):
        outcome = "xpassed" if report.passed else "xfailed"
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
    else:
        outcome = report.outcome
    if entry.get("outcome", "passed") == "passed":  # the first bad phase wins
        entry["outcome"] = outcome
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            reason = crash.message if crash else str(report.longrepr)
            if reason.startswith("file "):  # a fixture lookup error: say which fixture
                errors = [l[1:].strip() for l in report.longreprtext.splitlines() if l.startswith("E ")]
                reason = "\n".join(errors) or reason
            entry["reason"] = reason[:2000]
        elif report.skipped and isinstance(report.longrepr, tuple):
            entry["reason"] = report.longrepr[2]


def pytest_sessionfinish(session):
    RESULTS.write_text(json.dumps({"mode": MODE, "tests": _results}, indent=1, sort_keys=True))
'''


def _hub_cache(hf_home: Path) -> None:
    """Config-only stand-ins for the hub models the tests name, as a Hugging Face cache (see the module doc)."""
    from transformers import GenerationConfig, OPTConfig

    from vllm_hogwild.models.default import prepare

    tokenizer_dir = prepare()
    revision = "0" * 40

    def snapshot(repo: str) -> Path:
        folder = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text(revision)
        path = folder / "snapshots" / revision
        path.mkdir(parents=True)
        return path

    opt = snapshot("facebook/opt-125m")
    OPTConfig(architectures=["OPTForCausalLM"], prefix="</s>", torch_dtype="float16").save_pretrained(opt)
    GenerationConfig(bos_token_id=2, eos_token_id=2, pad_token_id=1).save_pretrained(opt)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, opt / name)

    if importlib.util.find_spec("torchvision") is None:
        return  # vLLM cannot inspect LLaVA without it: each test would only pay for a failing inspection subprocess
    from transformers import (AutoTokenizer, CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaProcessor)

    llava = snapshot("llava-hf/llava-1.5-7b-hf")
    LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=1024, image_size=336, intermediate_size=4096,
                                       num_attention_heads=16, num_hidden_layers=24, patch_size=14,
                                       projection_dim=768, vocab_size=32000),
        text_config=LlamaConfig(vocab_size=32064, max_position_embeddings=4096, rms_norm_eps=1e-5,
                                torch_dtype="float16"),
        image_token_index=32000, pad_token_id=32001, projector_hidden_act="gelu", vision_feature_layer=-2,
        vision_feature_select_strategy="default", architectures=["LlavaForConditionalGeneration"],
        torch_dtype="float16",
    ).save_pretrained(llava)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
        tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="default", image_token="<image>",
        num_additional_image_tokens=1,
    ).save_pretrained(llava)


def _env(mode: str, root: Path, tmp_path: Path) -> dict[str, str]:
    import vllm_hogwild

    env = dict(os.environ)
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "PYTEST_ADDOPTS",
                # set by this project's tests/conftest.py for its engine tests, not vLLM's
                "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE"):
        env.pop(key, None)
    plugin_root = str(Path(vllm_hogwild.__file__).resolve().parents[1])  # the plugin under test
    env.update(
        HOGWILD_SUITE_MODE=mode,
        HOGWILD_SUITE_RESULTS=str(tmp_path / f"{mode}.json"),
        HF_HOME=str(tmp_path / "hf"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_CACHE_ROOT=str(tmp_path / f"vllm-cache-{mode}"),
        OMP_NUM_THREADS="1",  # the two runs share the machine
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONPATH=os.pathsep.join(p for p in (plugin_root, env.get("PYTHONPATH")) if p),
    )
    if mode == "stock":
        others = sorted({ep.name for dist in distributions() for ep in dist.entry_points
                         if ep.group.startswith("vllm.") and ep.name != "hogwild"})
        env["VLLM_PLUGINS"] = ",".join(others)
    return env


def _start(mode: str, root: Path, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / f"{mode}.log"
    command = [sys.executable, "-m", "pytest", *SUITES, "-c", "pyproject.toml", "--rootdir", str(root),
               "-p", "no:cacheprovider", "-q", "-rfE", "--tb=short"]
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=root, env=_env(mode, root, tmp_path), stdout=out,
                                stderr=subprocess.STDOUT)
    return proc, log


def _summary(mode: str, results: dict[str, dict], log: Path) -> str:
    counts = Counter(r.get("outcome", "not run") for r in results.values())
    tail = log.read_text().strip().splitlines()[-1:] or [""]  # pytest's own summary line, with its time
    line = f"  {mode:8s} {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}  [{tail[0].strip('= ')}]"
    if mode == "hogwild":
        built = sum(1 for r in results.values() if r.get("hogwild_schedulers"))
        built_async = sum(1 for r in results.values() if r.get("hogwild_async_schedulers"))
        line += f"; HogwildScheduler built in {built} tests, HogwildAsyncScheduler in {built_async}"
    return line


def _reason(text: str | None) -> str:
    """The first two lines of a failure (pydantic puts the cause on the second)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return " | ".join(lines[:2])[:400]


def test_vllm_scheduler_tests_pass_with_the_hogwild_scheduler(tmp_path: Path) -> None:
    import vllm

    assert vllm.__version__.split("+")[0] == vllm_sources.VLLM_VERSION, (
        f"installed vLLM {vllm.__version__}, tests pinned to {vllm_sources.VLLM_VERSION}: bump vllm_sources"
    )
    root = vllm_sources.extract(tmp_path / "vllm")
    assert vllm_sources.unresolved_test_imports(root) == []
    (root / "conftest.py").write_text(CONFTEST)
    _hub_cache(tmp_path / "hf")

    started = time.monotonic()
    runs = {mode: _start(mode, root, tmp_path) for mode in MODES}  # in parallel: about 40 s each
    results = {}
    for mode, (proc, log) in runs.items():
        try:
            proc.wait(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            for other, _ in runs.values():
                other.kill()
            pytest.fail(f"{mode} run over {TIMEOUT_S} s; its log:\n{log.read_text()[-5000:]}")
        data = tmp_path / f"{mode}.json"
        # pytest exits 0 (all passed) or 1 (some failed); anything else: the run itself broke
        assert proc.returncode in (0, 1) and data.is_file(), (
            f"{mode} run: exit {proc.returncode}\n{log.read_text()[-5000:]}")
        results[mode] = json.loads(data.read_text())["tests"]

    stock, hogwild = results["stock"], results["hogwild"]

    def outcome(res: dict[str, dict], test: str) -> str:
        return res.get(test, {}).get("outcome", "not run")

    regressions = sorted(t for t in stock if outcome(stock, t) == "passed" and outcome(hogwild, t) != "passed")
    gains = sorted(t for t in hogwild if outcome(hogwild, t) == "passed" and outcome(stock, t) != "passed")
    stock_failing = sorted(t for t in stock if outcome(stock, t) not in ("passed", "skipped"))

    lines = [f"vLLM {vllm_sources.VLLM_VERSION} {' + '.join(SUITES)}: {len(stock)} tests",
             _summary("stock", stock, runs["stock"][1]), _summary("hogwild", hogwild, runs["hogwild"][1]),
             f"  both runs in parallel: {time.monotonic() - started:.0f} s"]
    lines.append(f"not passing with the stock scheduler on this build ({len(stock_failing)}; not required):")
    reasons = Counter(_reason(stock[t].get("reason")) for t in stock_failing)
    lines += [f"    {n:3d} x {reason}" for reason, n in reasons.most_common()]
    lines += [f"    {t.split('::')[-1]}" for t in stock_failing]
    lines.append(f"passing with stock, not with Hogwild ({len(regressions)}):")
    lines += [f"    {t.split('::')[-1]}: {outcome(hogwild, t)}: {hogwild.get(t, {}).get('reason', '')[:1500]}"
              for t in regressions]
    unswapped = sorted(t for t in hogwild if outcome(hogwild, t) == "passed"
                       and not hogwild[t].get("hogwild_schedulers"))
    lines.append(f"passing in the hogwild run without building a HogwildScheduler ({len(unswapped)}: "
                 "DiffusionScheduler, object.__new__, no scheduler):")
    lines += [f"    {t.split('::')[-1]}" for t in unswapped]
    if gains:
        lines.append(f"passing with Hogwild, not with stock ({len(gains)}):")
        lines += [f"    {t.split('::')[-1]}: stock {outcome(stock, t)}" for t in gains]
    report = "\n".join(lines)
    print(report)

    assert set(stock) == set(hogwild), "the two runs collected different tests"
    assert not regressions, report
    passed = sum(1 for t in stock if outcome(stock, t) == "passed")
    assert passed >= MIN_STOCK_PASSED, f"only {passed} pass with the stock scheduler: the harness is broken\n{report}"
    exercised = sum(1 for t in hogwild if outcome(hogwild, t) == "passed") - len(unswapped)
    assert exercised >= MIN_HOGWILD_EXERCISED, f"only {exercised} passing tests built a HogwildScheduler\n{report}"
    exercised_async = sum(1 for t, r in hogwild.items() if "test_async_scheduler" in t and outcome(hogwild, t) == "passed"
                          and r.get("hogwild_async_schedulers"))
    assert exercised_async >= MIN_ASYNC_EXERCISED, (
        f"only {exercised_async} passing async tests built a HogwildAsyncScheduler\n{report}")
