"""The training forward (vllm_hogwild/models/lockstep.py) computes what the engine computes: against the dense
float64 oracle (tests/hogwild_oracle.py, written from the design alone), batched and alone, with a control (the flat
pass over each reader's view) that misses. No vLLM."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from tests.hogwild_oracle import DenseHogwild
from vllm_hogwild.models.lockstep import TrainingGroup, flat_logprobs, group_logits, group_logprobs


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
                      initializer_range=0.2)
    return LlamaForCausalLM(cfg).to(torch.float64).eval()


@pytest.fixture(scope="module")
def oracle(model):
    return DenseHogwild(copy.deepcopy(model))


def groups(seed: int, count: int, n: int) -> list[TrainingGroup]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        prompt = tuple(rng.randrange(97) for _ in range(rng.randint(2, 12)))
        outputs = tuple(tuple(rng.randrange(97) for _ in range(rng.randint(1, 9))) for _ in range(n))
        out.append(TrainingGroup(prompt, outputs))
    return out


def err(a, b) -> float:
    return max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["contiguous", "isolated"])
def test_the_training_forward_equals_the_dense_oracle(model, oracle, n: int, layout: str) -> None:
    for group in groups(n, 3, n):  # workers of different lengths: some stop early, their lanes stay readable
        with torch.no_grad():
            got = group_logprobs(model, group, layout)
        want = oracle.logprobs(list(group.prompt), [list(o) for o in group.outputs], layout=layout)
        assert err(got, want) < 1e-10


def test_the_flat_pass_misses_unless_nobody_reads_a_co_worker(model, oracle) -> None:
    group = groups(7, 1, 3)[0]
    want = oracle.logprobs(list(group.prompt), [list(o) for o in group.outputs])
    assert err(flat_logprobs(model, group), want) > 1e-2  # co-workers' K/V recomputed in the reader's context
    iso = oracle.logprobs(list(group.prompt), [list(o) for o in group.outputs], layout="isolated")
    assert err(flat_logprobs(model, group, "isolated"), iso) < 1e-6


def test_a_batch_equals_its_groups_one_by_one(model) -> None:
    batch = groups(11, 4, 3)  # different prompt and output lengths: padded
    with torch.no_grad():
        first, lanes, _, fed = group_logits(model, batch)
        for b, group in enumerate(batch):
            f1, l1, _, fed1 = group_logits(model, [group])
            assert torch.allclose(first[b], f1[0], atol=1e-10)
            for w in range(3):
                k = int(fed1[0, w])
                assert torch.allclose(lanes[b, w, :k], l1[0, w, :k], atol=1e-10)


def test_gradients_flow_through_every_token(model) -> None:
    group = groups(3, 1, 2)[0]
    m = copy.deepcopy(model).train()
    first, lanes, _, fed = group_logits(m, [group])
    (first.sum() + lanes[0, 0, : int(fed[0, 0])].sum()).backward()
    assert all(p.grad is not None for p in m.model.layers[0].self_attn.parameters())


def test_bad_arguments_name_the_field(model) -> None:
    with pytest.raises(ValueError, match="layout"):
        group_logits(model, groups(1, 1, 2), layout="combined")
    with pytest.raises(ValueError, match="groups"):
        group_logits(model, [*groups(1, 1, 2), *groups(2, 1, 3)])


def test_a_heads_attention_is_what_a_plain_forward_attends(model) -> None:
    """One worker's view is ``[prompt][own]``: the head's attention of its token ``j`` is the plain eager forward's
    attention row at that token (Hugging Face's, an independent computation); the logits are unchanged."""
    group = groups(5, 1, 1)[0]
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    ids = torch.tensor([list(group.prompt) + list(group.outputs[0][:group.fed(0)])])
    with torch.no_grad():
        plain = eager(input_ids=ids, output_attentions=True).attentions
        first, lanes, _, fed = group_logits(model, [group])
        for layer in range(3):
            for head in range(4):
                f2, l2, _, _, att = group_logits(model, [group], attention=(layer, head))
                assert torch.equal(f2, first) and torch.equal(l2, lanes)
                p, k = len(group.prompt), int(fed[0, 0])
                for j in range(k):
                    want = plain[layer][0, head, p + j, :p + j + 1]
                    assert torch.allclose(att[0, 0, j, :p + j + 1], want, atol=1e-10)
                    assert float(att[0, 0, j, p + j + 1:].abs().sum()) == 0.0


def test_a_heads_attention_reads_what_the_view_reads(model) -> None:
    """Three workers: token ``j`` reads co-workers' tokens ``0..j`` and its own ``0..j``, nothing else, and its
    attention sums to one."""
    group = groups(9, 1, 3)[0]
    with torch.no_grad():
        _, _, plen, fed, att = group_logits(model, [group], attention=(1, 2))
    p, t = int(plen[0]), att.shape[2]
    for w in range(3):
        for j in range(int(fed[0, w])):
            row = att[0, w, j]
            assert abs(float(row.sum()) - 1.0) < 1e-10
            for o in range(3):
                lane = row[p + o * t:p + (o + 1) * t]
                reads = min(j + 1, int(fed[0, o]))
                assert float(lane[reads:].abs().sum()) == 0.0 and float(lane[:reads].min()) > 0.0
    with pytest.raises(ValueError, match="attention"):
        group_logits(model, [group], attention=(3, 0))
    with pytest.raises(ValueError, match="attention"):
        group_logits(model, [group], layout="isolated", attention=(0, 0))
