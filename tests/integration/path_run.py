"""The real engine with one segment-attention path, scored against the dense oracle (run as a subprocess).

    VLLM_HOGWILD_ATTENTION=triton TRITON_INTERPRET=1 python -m tests.integration.path_run MODEL OUT.json

Raw ``contiguous`` groups of 2 and 4 workers and ``collab`` groups (``combined``,
section headers, paragraph prefixes, redundancy checks, the finisher) of 2 and 4, in
one ``generate`` call, in a KV cache too small for all of them at once: groups are
preempted whole and resume by replay, whose re-fed rows the path runs too. Writes
each group's max |logprob - oracle| and the preemptions to OUT.json. A subprocess
because ``TRITON_INTERPRET`` must be set before Triton is first imported.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the scheduler's records, in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

COLLAB_STEP_END = "[jqyz]"  # frequent in random text, absent from every text the engine forces (Dave has a v)
RAW = [(2, 45), (4, 64)]  # workers, prompt length
COLLAB = [2, 4]
COLLAB_BUDGET = 48  # tokens per worker
FINISHER = 6
NUM_BLOCKS = 24  # x 32 tokens: the groups' budgets take about 44


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from tests.hogwild_checks import collab_errors, max_err
    from tests.hogwild_oracle import DenseHogwild
    from tests.integration.conftest import make_llm, scheduler_of, shutdown
    from tests.integration.test_offline import hogwild_params, prompt_ids, sampled_logprobs
    from vllm_hogwild.attention.paths import path_of
    from vllm_hogwild.core.protocol_text import FINISHER_SUFFIX

    model, out_path = sys.argv[1], sys.argv[2]
    llm = make_llm(model, additional_config={"hogwild": {"max_workers": 4}}, num_gpu_blocks_override=NUM_BLOCKS,
                   max_model_len=(NUM_BLOCKS - 1) * 32, max_num_batched_tokens=128)
    try:
        prompts = [{"prompt_token_ids": prompt_ids(p, seed=300 + i)} for i, (_, p) in enumerate(RAW)]
        params = [hogwild_params(n, 32, seed=30 + i) for i, (n, _) in enumerate(RAW)]
        for i, n in enumerate(COLLAB):
            p = hogwild_params(n, COLLAB_BUDGET, seed=40 + i, layout="combined")
            p.ignore_eos, p.logprobs = False, 1
            p.extra_args["hogwild"] = {"protocol": "collab", "step_end": COLLAB_STEP_END, "redundancy_every": 40,
                                       "finisher": FINISHER}
            prompts.append({"prompt_token_ids": prompt_ids(40, seed=400 + i)})
            params.append(p)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        stats = scheduler_of(llm).table.stats
        ended = list(stats.ended)[-len(prompts):]
        preemptions, replayed = stats.num_group_preemptions, stats.num_replayed_tokens
        path = path_of(llm.llm_engine.vllm_config.additional_config)
        tokenizer = llm.get_tokenizer()
    finally:
        shutdown(llm)
    oracle = DenseHogwild(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32))
    suffix = tokenizer.encode(FINISHER_SUFFIX["math"], add_special_tokens=False)
    cases = []
    for k, out in enumerate(outputs):
        tokens = [list(c.token_ids) for c in out.outputs]
        got = [sampled_logprobs(c) for c in out.outputs]
        if k < len(RAW):
            err = max_err(got, oracle.logprobs(prompts[k]["prompt_token_ids"], tokens))
            cases.append({"case": f"raw contiguous n={RAW[k][0]}", "err": err})
            continue
        record = next(e for e in ended if e.num_workers == len(tokens) and e.prompt_len == len(out.prompt_token_ids))
        forced = range(0)
        if record.finisher is not None:  # the finisher's suffix and greedy tokens are forced
            own = tokens[record.finisher]
            start = next(i for i in range(len(own)) if own[i:i + len(suffix)] == suffix)
            forced = range(start, start + len(suffix) + FINISHER)
        err, wrong, ends = collab_errors(oracle, tokenizer, list(out.prompt_token_ids), tokens, got,
                                         COLLAB_STEP_END, record.finisher, forced)
        cases.append({"case": f"collab combined n={len(tokens)}", "err": err, "without_headers": wrong,
                      "steps": sum(len(e) for e in ends), "finisher": record.finisher})
    with open(out_path, "w") as f:
        json.dump({"path": path, "cases": cases, "group_preemptions": preemptions, "replayed_tokens": replayed}, f)


if __name__ == "__main__":
    main()
