"""Benchmarks against stock vLLM and the alternatives, measured side by side in one engine.

A development tool beside the package, not in it: run it from the checkout's root.

    python -m benchmarks.bench decode    [--workers 2 4 8] [--prompt-lens 200 1500] [--max-tokens 128] [--rounds 2]
    python -m benchmarks.bench recompute [--workers 2 4] [--prompt-lens 1000] [--max-tokens 64] [--every 1 16 64]
    python -m benchmarks.bench overhead  [--groups 64 256] [--workers 4] [--plain 64] [--max-tokens 32]
                                         [--rounds 2] [--repeats 1] [--model tiny]
    python -m benchmarks.bench answer    [--workers 1 2 4 8] [--tasks 64] [--seed 0]
                                                 [--layouts contiguous isolated interleaved]
    python -m benchmarks.bench speculative [--workers 2 4] [--temperatures 0.1 0.7] [--methods ngram draft]
                                                   [--items 40] [--max-tokens 160] [--rounds 2]
    python -m benchmarks.bench verify    [--workers 2] [--temperature 0.1] [--items 40] [--max-tokens 160]
    python -m benchmarks.bench split     [--workers 8] [--prompt-len 1500] [--max-tokens 128] [--dtype float32]
                                                   [--compiled]
    python -m benchmarks.bench capacity  [--groups 16] [--workers 4] [--max-tokens 448] [--blocks 2000 96 64 48]
                                                 [--protocol raw|multiverse]
    python -m benchmarks.bench forkjoin  [--parts 2 4 8] [--requests 2] [--max-tokens 48] [--rounds 2]
    (each: [--model DIR] [--json OUT.json] [--plot OUT.png])
    python -m benchmarks.bench plan      [--rounds 3] [--steps 24] [--quick] [--json OUT.json]  (no engine)

- ``decode``: decode tokens/s of a Hogwild group of N workers vs stock ``n=N``
  sampling of the same prompt. Decode time is a run's wall time minus the
  wall time of the same request with ``max_tokens=1`` (prefill and first
  token), so both sides pay the same prefill; the two run in turn (the whole
  run first in even rounds, second in odd ones). Runs alternate stock and
  Hogwild with fresh prompts (no prefix-cache reuse between runs); medians.
  Also the KV memory: the blocks the group held at its end (from the
  scheduler) against N independent copies of the final view, which is what N
  sequences that each carry the whole shared text would hold.
- ``recompute``: the alternative to a shared cache: N independent sequences,
  each re-prefilling its co-workers' new text every K tokens (its prompt is
  the contiguous view ``[prompt][co-workers' text][own text]``; vLLM's prefix
  cache reuses what did not move). Whole wall time of N x T tokens, prefill
  included, against one Hogwild group (contiguous layout) making the same.
- ``overhead``: scheduler time per engine step (``schedule`` plus
  ``update_from_output``) with G Hogwild groups of N workers and P plain
  requests in a Hogwild engine, against the same load as stock ``n=N``
  requests in a stock engine (vLLM's own scheduler, no plugin switch), for
  each G of ``--groups``; every sequence runs at once (``max_num_seqs`` and
  the KV cache are set to fit them), rounds alternate the two engines
  (``--repeats R``: R runs of each load per engine process, each a row).
  ``--model tiny`` uses a tiny random model: the scheduler's work does not
  depend on the model.
- ``answer``: time to a correct answer with the trained collaborator
  (``benchmarks/bench/answer.py``): Roman numerals for 12 to 24 listed
  numbers, N workers in raw mode, accuracy, mean sequential steps and
  duplicated items per layout, with two controls (``isolated``: nobody sees a
  claim; ``interleaved``: claims are seen only once an entry is finished), a
  computed fixed split, and the planner's wall-clock model fitted on N=1 and
  N=2 against the other N.
- ``speculative``: speculative decoding inside Hogwild groups, on a workload
  where n-gram lookup accepts well: every worker copies a numbered list from
  the prompt and goes on with it. For each N and temperature, four
  configurations on the same prompts: stock ``n=N``, stock ``n=N`` with
  speculation, a Hogwild group, a Hogwild group with speculation. One engine
  without ``speculative_config``, then one per method: a draft model (the
  model as its own draft: the mechanics, at a target's cost per draft token)
  and n-gram lookup (plain requests in a Hogwild engine run exactly as in
  stock vLLM). Per configuration: engine steps, tokens per step, wall time
  (medians over rounds) and the acceptance rate. The summary gives each
  speedup over stock ``n=N`` in wall time, speculation's and Hogwild's, and
  the two together against their product. A greedy stock ``n=1`` request per
  engine is the reference. On the CPU the plugin's worker first fixes vLLM
  0.32's rejection sampler (``vllm_hogwild/runner/cpu_sampling.py``); the
  stock rows run in the same Hogwild engine, so they get the fix too.
- ``verify``: where a speculative step's time goes: milliseconds per engine
  step of stock ``n=N`` and of a Hogwild group, with n-gram speculation on the
  ``speculative`` workload, split into the model forward (and within it the
  native and the segment attention), the segment plan, the sampler and the
  drafting; the group twice, its verify rows on the compiled CPU op and on
  the block buckets (where every step with a multi-token row went before).
  Timed by wrapping those functions in the engine's process (the worker runs
  in-process here).
- ``split``: where a decode step's time goes, stock ``n=N`` against a Hogwild
  group of N (the ``decode`` workload at one N and prompt length): milliseconds
  per decode step for the weights and the rest of the model, the native
  attention (plain rows, and the Hogwild rows' K/V writes), the segment
  attention, the plan, the runner's Python, sampling and the scheduler; a
  run's parts minus those of its ``max_tokens=1`` twin (the two in turn, as in
  ``decode``), over the decode steps.
  Timed like ``verify``.
- ``capacity``: many groups with long budgets whose workers mostly stop early
  (at one of a few stop tokens, the reasoning-serving case), all submitted at
  once, in KV caches of decreasing size (``num_gpu_blocks_override``, block
  size 128): Hogwild with ``kv: on-demand`` (lanes take blocks as they grow,
  groups preempted whole and resumed by exact replay), Hogwild with ``kv:
  reserve`` (every lane's whole budget at admission) and stock ``n=N``
  sampling of the same prompts (no plugin switch). Engine steps, wall time,
  groups preempted and tokens replayed, and each configuration's steps against
  its own with the largest cache. Every configuration is an engine of its own,
  in its own process; ``--model tiny`` (the default here) keeps the steps cheap.
  ``--protocol multiverse``: the groups are fork/join requests instead (a
  trunk and ``--workers - 1`` branch lanes, the prompt ending in a goal of as
  many parts, every sequence stopping at the same stop tokens), on-demand and
  reserve only (a stock engine has no fork).
- ``forkjoin``: a fork-heavy workload: requests whose prompts end in a
  Multiverse goal of 2, 4 or 8 outlines (the fork starts at once), each
  branch ending at ``--branch-end``. Three sides in one engine, the last two
  with the fork/join run's own token counts (``ignore_eos``) and prompts
  salted apart: fork/join in the plugin; the same tokens decoded one after
  another by one plain request (an engine without branches); the branches as
  plain requests side by side, then the join as one request that re-prefills
  them (an engine with a prefix cache only). Sequential decode steps (per
  request), engine steps, prompt tokens the engine computed, wall time.
- ``plan``: the host time of a decode step's segment-attention plan, no
  engine: the GPU path's planner (steady and from scratch) beside the CPU
  op's planner on the same rows, for groups of 2 to 8 workers at 1k to 32k
  tokens and 32 x 8 and 256 x 4 groups (:mod:`benchmarks.bench.plan`).
"""


from .capacity import CAPACITY_KINDS, capacity_kinds
from .cli import build_parser, main, run
from .common import ROOT
from .forkjoin import FORKJOIN_SIDES, goal_prompt
from .report import markdown, plot
from .speculative import VERIFY_CONFIGS, VERIFY_PARTS

__all__ = ["CAPACITY_KINDS", "FORKJOIN_SIDES", "ROOT", "VERIFY_CONFIGS", "VERIFY_PARTS", "build_parser", "capacity_kinds",
           "goal_prompt", "main", "markdown", "plot", "run"]
