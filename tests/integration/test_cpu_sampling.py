"""vLLM 0.32's CPU rejection sampler, as vLLM's worker process sets it up, before and after the plugin's fixes.

The engine-level checks (drafts accepted under random sampling, seeded runs
repeating, ``top_k`` with speculation) are in ``speculative_cases.py``.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.vllm


@pytest.fixture
def cpu_sampler(monkeypatch):
    """This process's rejection sampler with vLLM's CPU kernel fallbacks, as ``WorkerWrapperBase.init_worker``
    registers them; restored afterwards."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON
    from vllm.v1.sample import rejection_sampler
    from vllm.v1.sample.ops import topk_topp_sampler

    if HAS_TRITON or not current_platform.is_cpu():
        pytest.fail("these checks are for vLLM's CPU build without Triton (the project's CPU set-up)")
    monkeypatch.setattr(topk_topp_sampler, "apply_top_k_only", topk_topp_sampler.apply_top_k_only)
    current_platform.register_triton_kernel_overrides()
    yield rejection_sampler
    current_platform.register_triton_kernel_overrides()


def _metadata(temperature, top_k=None, top_p=None):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    batch = len(temperature)
    return SamplingMetadata(
        temperature=torch.tensor(temperature), all_greedy=False, all_random=True,
        top_p=None if top_p is None else torch.tensor(top_p),
        top_k=None if top_k is None else torch.tensor(top_k, dtype=torch.int32), generators={},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def test_the_temperatures_reach_the_rejection_sampler_intact(cpu_sampler) -> None:
    from vllm_hogwild.runner import cpu_sampling

    temperatures, drafts = [0.1, 0.7, 1.3], [3, 1, 2]  # per request; its draft rows
    cu = torch.tensor(drafts, dtype=torch.int32).cumsum(0).to(torch.int32)
    expected = torch.tensor([t for t, d in zip(temperatures, drafts) for _ in range(d)])

    def scale_seen() -> torch.Tensor:
        """The factor the sampler divides each draft row's logits by: its request's temperature, if intact."""
        logits = torch.ones(int(cu[-1]), 8)
        out = cpu_sampler.apply_sampling_constraints(logits, cu, _metadata(temperatures))
        return 1.0 / out[:, 0]

    before = cpu_sampler.expand_batch_to_tokens(torch.tensor(temperatures), cu, int(cu[-1]))
    vllm_is_broken = not torch.allclose(before, expected)
    replaced = cpu_sampling.install()
    assert (cpu_sampling.EXPAND_KERNEL in replaced) == vllm_is_broken, (replaced, before)
    torch.testing.assert_close(scale_seen(), expected)
    # int32 top-k and float top-p go through the same kernel
    top_k = cpu_sampler.expand_batch_to_tokens(torch.tensor([5, 1, 9], dtype=torch.int32), cu, int(cu[-1]))
    assert top_k.dtype == torch.int32 and top_k.tolist() == [5, 5, 5, 1, 9, 9]
    # greedy rows (temperature GREEDY_TEMPERATURE, 0, in vLLM's batch) become 1, as the Triton kernel makes them
    greedy = cpu_sampler.expand_batch_to_tokens(torch.tensor([0.0, 0.5, 0.5]), cu, int(cu[-1]),
                                                replace_from=cpu_sampler.GREEDY_TEMPERATURE, replace_to=1)
    assert greedy.tolist() == [1.0, 1.0, 1.0, 0.5, 0.5, 0.5]
    assert cpu_sampling.install() == [], "a second install replaces nothing"
    print(f"\nvLLM's fallback gave {before.tolist()} for {expected.tolist()}; replaced: {replaced}")


def test_top_k_in_a_step_without_drafts_leaves_the_empty_rows(cpu_sampler) -> None:
    from vllm_hogwild.runner import cpu_sampling

    cu = torch.zeros(2, dtype=torch.int32)  # two requests, no draft rows
    metadata = _metadata([0.7, 0.7], top_k=[5, 5])
    try:
        cpu_sampler.apply_sampling_constraints(torch.empty(0, 8), cu, metadata)
        vllm_fails = False
    except RuntimeError:
        vllm_fails = True
    replaced = cpu_sampling.install()
    assert ("vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_only" in replaced) == vllm_fails, replaced
    assert cpu_sampler.apply_sampling_constraints(torch.empty(0, 8), cu, metadata).shape == (0, 8)
    # rows that exist are still cut to their top k
    logits = torch.arange(16, dtype=torch.float32).reshape(2, 8)
    cut = cpu_sampler.apply_sampling_constraints(logits, torch.tensor([1, 2], dtype=torch.int32),
                                                 _metadata([1.0, 1.0], top_k=[2, 3]))
    assert torch.isfinite(cut).sum(dim=1).tolist() == [2, 3], cut
