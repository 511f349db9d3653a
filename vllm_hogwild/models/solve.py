"""The trained collaborators on their task: an engine, a group's sampling, its budget, what came out.

The demo (``vllm_hogwild.tools.demo``) and the ``answer`` benchmark (``benchmarks/bench``) both run the
collaborators through these.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Sequence

from vllm_hogwild.tasks import roman
from vllm_hogwild.models.roman_collaborator import MIN_P, TEMPERATURE

LAYOUTS = ("contiguous", "isolated", "interleaved", "greedy")  # greedy: contiguous, every worker top_k=1
TOKENS_PER_ITEM = 10  # each worker's budget per listed number: an entry takes 5 to 11 tokens
MAX_MODEL_LEN = 2048  # the collaborator's max_position_embeddings: prompt + N x budget must fit


def engine(model: str | None, protocol: str = "raw"):
    """An engine of the collaborator (``raw``) or of the fork/join collaborator (``multiverse``), or ``model``."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM

    from vllm_hogwild.models import roman_collaborator as collaborator

    from vllm_hogwild.models import collaborator_forkjoin

    default = collaborator_forkjoin.model_dir() if protocol == "multiverse" else collaborator.model_dir()
    if model is None and not (default / "config.json").exists():
        raise ValueError(f"--model: no trained model ships in {default} yet; train one with `python -m "
                         f"vllm_hogwild.training.train --protocols {protocol} --out DIR` and pass --model DIR")
    return LLM(model=model or str(default), dtype="float32", enforce_eager=True, seed=0,
               max_model_len=MAX_MODEL_LEN, max_num_seqs=256, additional_config={"hogwild": {"max_workers": 8}})


def budget(num_items: int) -> int:
    """Each worker's ``max_tokens`` for tasks of up to ``num_items`` numbers (one worker may have to do them all)."""
    return TOKENS_PER_ITEM * num_items + 8


def params(num_workers: int, layout: str, seed: int, max_tokens: int):
    """The group's sampling; ``layout`` ``greedy`` is the contiguous layout with every worker's argmax
    (``top_k=1``): what the workers are without the sampling that breaks their symmetry."""
    from vllm import SamplingParams

    hogwild = {"layout": "contiguous" if layout == "greedy" else layout, "protocol": "raw"}
    if layout == "interleaved":
        hogwild["step_end"] = roman.ENTRY_END
    return SamplingParams(n=num_workers, temperature=TEMPERATURE, min_p=MIN_P, top_k=1 if layout == "greedy" else 0,
                          seed=seed, max_tokens=max_tokens, extra_args={"hogwild": hogwild})


def steps_of(output) -> int:
    """Sequential engine steps of one group: its longest worker output (each token one step)."""
    return max(len(c.token_ids) for c in output.outputs)


def texts_of(output) -> list[str]:
    return [c.text for c in sorted(output.outputs, key=lambda c: c.index)]


def run_groups(llm, tasks: list[roman.Task], num_workers: int, layout: str, seed: int) -> tuple[list, float]:
    t0 = time.perf_counter()
    sampling = params(num_workers, layout, seed, budget(max(t.num_items for t in tasks)))
    outs = llm.generate([roman.prompt(t) for t in tasks], sampling, use_tqdm=False)
    return outs, time.perf_counter() - t0


FJ_MAX_TOKENS = 160  # each lane's budget: the trunk's goal and conclusion, a branch's entries


def forkjoin_params(seed: int):
    from vllm import SamplingParams

    return SamplingParams(n=1, temperature=TEMPERATURE, min_p=MIN_P, seed=seed, max_tokens=FJ_MAX_TOKENS,
                          extra_args={"hogwild": {"protocol": "multiverse"}})


def forkjoin_score(task: roman.Task, output):
    """``(score, tree)`` of one fork/join request's output."""
    from vllm_hogwild.models import collaborator_forkjoin as F

    completion = output.outputs[0]
    tree = completion.hogwild or {}
    branches = [b["text"].split(":", 1)[-1] for b in tree.get("branches", ())]
    conclusion = completion.text.split(F.JOIN_HEADER, 1)[1] if F.JOIN_HEADER in completion.text else ""
    return F.check(task, branches, conclusion, forked=bool(tree.get("forked"))), tree




# -- the links collaborator (vllm_hogwild.tasks.links) -------------------------------------------------------------

LINKS_MAX_MODEL_LEN = 4096  # the links collaborator's max_position_embeddings


def links_engine(model: str | None = None, collaborator: str = "links", **kwargs):
    """An engine of the links collaborator (or the merges collaborator, ``collaborator="merges"``, or ``model``)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM

    from vllm_hogwild.models import links_collaborator, merges_collaborator

    module = {"links": links_collaborator, "merges": merges_collaborator}[collaborator]
    default = module.model_dir()
    if model is None and not (default / "config.json").exists():
        raise ValueError(f"--model: no trained {collaborator} collaborator ships in {default} yet; train one with "
                         f"`{module.COMMAND} --out DIR` and pass --model DIR")
    args = dict(model=model or str(default), dtype="float32", enforce_eager=True, seed=0,
                max_model_len=LINKS_MAX_MODEL_LEN, max_num_seqs=256, additional_config={"hogwild": {"max_workers": 8}})
    args.update(kwargs)
    return LLM(**args)


def links_budget(tasks) -> int:
    """Each worker's ``max_tokens``: all of a task's items and its end (one worker may have to do them all)."""
    return max(sum(t.costs()) for t in tasks) + 2


def links_params(num_workers: int, layout: str, seed: int, max_tokens: int, step_end: str = "[;!]",
                 barred: Sequence[int] = ()):
    """A links group's sampling; ``interleaved`` (a control) reads a co-worker's entry once it is finished (ended
    by ``step_end``: a merges entry also ends at a reference, ``"[;!=]"``); ``barred``: token ids no worker may
    write (a logit bias of -100: the checking collaborator's checks turned off)."""
    from vllm import SamplingParams

    from vllm_hogwild.models.links_collaborator import MIN_P as LINKS_MIN_P
    from vllm_hogwild.models.links_collaborator import TEMPERATURE as LINKS_TEMPERATURE

    hogwild = {"layout": "contiguous" if layout == "greedy" else layout, "protocol": "raw"}
    if layout == "interleaved":
        hogwild["step_end"] = step_end
    return SamplingParams(n=num_workers, temperature=LINKS_TEMPERATURE, min_p=LINKS_MIN_P,
                          top_k=1 if layout == "greedy" else 0, seed=seed, max_tokens=max_tokens,
                          logit_bias={t: -100.0 for t in barred} or None, extra_args={"hogwild": hogwild})


def run_links_groups(llm, tasks, num_workers: int, layout: str, seed: int,
                     barred: Sequence[int] = ()) -> tuple[list, float]:
    """Links tasks: every group to its end (in find mode the links collaborator ends it at the find); ``barred``:
    token ids no worker may write (:func:`links_params`)."""
    t0 = time.perf_counter()
    params = links_params(num_workers, layout, seed, links_budget(tasks), barred=barred)
    outs = llm.generate([t.prompt() for t in tasks], params, use_tqdm=False)
    return outs, time.perf_counter() - t0


def check_tokens(llm) -> list[int]:
    """The ids of the check claims (``"\\nb?"``, one token a letter) in the engine's tokenizer: the checking
    collaborator's; empty for a tokenizer without them (the links collaborator's)."""
    from vllm_hogwild.tasks import links as L

    tok = llm.get_tokenizer()
    ids = [tok.encode(f"\n{letter}{L.CHECK}", add_special_tokens=False) for letter in L.SLOTS]
    return [i[0] for i in ids] if all(len(i) == 1 for i in ids) else []


@dataclass(frozen=True)
class GroupRun:
    """One group's run as its client saw it: each worker's text and token ids (worker order), and its sequential
    steps (its longest lane's tokens, end of sequence included; a cancelled group's the step after the last it read,
    as the split with cancel is counted)."""

    texts: list[str]
    token_ids: list[list[int]]
    steps: int
    cancelled: bool


def run_merges_groups(llm, tasks, num_workers: int, layout: str, seed: int,
                      prefix: str = "merges") -> tuple[list, float]:
    """Merges tasks, all groups at once through the engine, step by step (a merges entry may end at a reference,
    which the interleaved control's step end takes too). In find mode the client cancels a group in the step after
    its texts hold as many starts reaching the goal as the prompt's count
    (:func:`vllm_hogwild.tasks.merges.written_finds`, the texts alone), as the split with cancel's client does; the
    model counts nothing. ``(runs, wall seconds)``: a :class:`GroupRun` per task."""
    from vllm.sampling_params import RequestOutputKind

    from vllm_hogwild.tasks import merges as M

    params = links_params(num_workers, layout, seed, links_budget(tasks), "[;!=]")
    params.output_kind = RequestOutputKind.CUMULATIVE
    engine = llm.llm_engine
    ids = {f"{prefix}-{num_workers}-{layout}-{seed}-{i}": i for i in range(len(tasks))}
    texts = [[""] * num_workers for _ in tasks]
    tokens: list[list[list[int]]] = [[[] for _ in range(num_workers)] for _ in tasks]
    ended: dict[int, bool] = {}  # task -> whether its client cancelled it
    t0 = time.perf_counter()
    for request_id, i in ids.items():
        engine.add_request(request_id, tasks[i].prompt(), params)
    while engine.has_unfinished_requests():
        cancel = []
        for out in engine.step():
            i = ids[out.request_id]
            if i in ended:
                continue
            for completion in out.outputs:
                texts[i][completion.index] = completion.text
                tokens[i][completion.index] = list(completion.token_ids)
            if M.find_done(tasks[i], texts[i]):
                ended[i] = not out.finished
                if not out.finished:
                    cancel.append(out.request_id)
            elif out.finished:
                ended[i] = False
        if cancel:
            engine.abort_request(cancel)
    wall = time.perf_counter() - t0
    runs = [GroupRun(texts[i], tokens[i], max(map(len, tokens[i])) + int(ended.get(i, False)), ended.get(i, False))
            for i in range(len(tasks))]
    return runs, wall
