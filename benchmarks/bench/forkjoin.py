"""``forkjoin``: fork/join requests against the same tokens one after another and a re-prefilled join."""

from __future__ import annotations

import json
import statistics

from . import common as c


# -- fork/join ------------------------------------------------------------------

FORKJOIN_SIDES = ("fork/join", "sequential", "re-prefill join")


def goal_prompt(parts: int, salt: int, context: int = 0) -> str:
    """A prompt that ends in a Multiverse goal of ``parts`` outlines (the fork starts at once), after
    ``context`` numbered facts (the problem and the reasoning before the goal)."""
    facts = "".join(f"Fact {i}: item {i} weighs {(salt + 7 * i) % 90 + 10} grams.\n" for i in range(context))
    outlines = "".join(f"<Outline>\n{i}: case {i} of {parts}</Outline>\n" for i in range(1, parts + 1))
    return (f"Request {salt}.\n{facts}Check every case of the claim, each on its own, then conclude.\n"
            f"<Parallel>\n<Goal>\n{outlines}</Goal>")


def _count_prefill(llm) -> list[int]:
    """Prompt tokens the engine computed, counted from now (prefix-cache hits are not computed)."""
    scheduler, counter = c.scheduler_of(llm), [0]
    original = scheduler.schedule

    def schedule(*args, **kwargs):
        output = original(*args, **kwargs)
        for request_id, n in output.num_scheduled_tokens.items():
            request = scheduler.requests.get(request_id)
            if request is not None:
                before = request.num_computed_tokens - n
                counter[0] += max(0, min(n, request.num_prompt_tokens - before))
        return output

    scheduler.schedule = schedule
    return counter


NEVER = "QQQQ"  # a branch end no branch writes: every branch runs to its budget, whatever it samples


def _header_steps(llm, steps: list[int], parts: int, args) -> dict:
    """One fork/join request alone, of fixed lengths (every branch runs to its budget), with its forced headers
    fed in one step each and, the control, one token a step: its engine steps are its sequential steps."""
    from vllm import SamplingParams

    table = c.scheduler_of(llm).table
    sp = SamplingParams(n=1, temperature=args.temperature, seed=parts, max_tokens=args.max_tokens,
                        extra_args={"hogwild_protocol": "multiverse", "hogwild_branch_end": NEVER,
                                    "hogwild_max_branches": parts})
    out = {"parts": parts, "forks": 1}
    for side, ahead in (("fed_ahead", True), ("one_a_step", False)):
        table.feeding_ahead = ahead
        try:
            s0 = steps[0]
            tree = llm.generate([goal_prompt(parts, 9000 + parts, args.context)], [sp], use_tqdm=False)[0].outputs[0].hogwild
            out[side] = steps[0] - s0
        finally:
            table.feeding_ahead = True
        if not tree["forked"]:
            raise RuntimeError("the headers' request did not fork")
    out["saved_per_fork"] = out["one_a_step"] - out["fed_ahead"]
    print(json.dumps({"headers": out}), flush=True)
    return out


def forkjoin(llm, args) -> dict:
    """Fork/join in the plugin against the same token streams decoded one after another, and against a join
    that re-prefills the branches (an engine with a prefix cache only). One engine; the other sides' token
    counts are the fork/join run's (``ignore_eos``), their prompts salted apart (no prefix-cache reuse)."""
    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    steps, prefill = c.count_steps(llm), _count_prefill(llm)
    results = []

    def measure(prompts, params) -> tuple[float, int, int, list]:
        s0, p0 = steps[0], prefill[0]
        wall, outs = c.timed(llm, prompts, params)
        return wall, steps[0] - s0, prefill[0] - p0, outs

    fork = {"hogwild_protocol": "multiverse", "hogwild_branch_end": args.branch_end}
    for parts in args.parts:
        for rnd in range(args.rounds):
            salt = 1000 * parts + 10 * rnd
            prompts = [goal_prompt(parts, salt + i, args.context) for i in range(args.requests)]
            fj = SamplingParams(n=1, temperature=args.temperature, seed=salt, max_tokens=args.max_tokens,
                                extra_args={**fork, "hogwild_max_branches": parts})
            wall, n_steps, n_prefill, outs = measure(prompts, [fj] * len(prompts))
            trees = [o.outputs[0].hogwild for o in outs]
            if not all(t["forked"] for t in trees):
                raise RuntimeError("a fork/join request of the workload did not fork")
            rows = {"fork/join": (wall, n_steps, n_prefill, statistics.mean(t["sequential_steps"] for t in trees))}
            # The same token streams, one after another: one plain request per request, as long as the document.
            seq = [goal_prompt(parts, salt + 500 + i, args.context) for i in range(len(prompts))]
            sp = [SamplingParams(temperature=args.temperature, seed=salt, max_tokens=t["num_tokens"], ignore_eos=True)
                  for t in trees]
            wall, n_steps, n_prefill, _ = measure(seq, sp)
            rows["sequential"] = (wall, n_steps, n_prefill, statistics.mean(t["num_tokens"] for t in trees))
            # Branches as plain requests side by side, then the join re-prefills them.
            stage1, sp1 = [], []
            for i, tree in enumerate(trees):
                base = goal_prompt(parts, salt + 700 + i, args.context)
                for b in tree["branches"]:
                    header = "\n<Path>\n" + b["branch"] + ":"
                    n_header = len(tokenizer.encode(header, add_special_tokens=False))
                    stage1.append(base + header)
                    sp1.append(SamplingParams(temperature=args.temperature, seed=salt, ignore_eos=True,
                                              max_tokens=max(1, b["num_tokens"] - n_header)))
            w1, s1, f1, _ = measure(stage1, sp1)
            stage2 = [goal_prompt(parts, salt + 700 + i, args.context) + "".join(b["text"] for b in t["branches"]) + "<Conclusion>\n"
                      for i, t in enumerate(trees)]
            n_join = len(tokenizer.encode("<Conclusion>\n", add_special_tokens=False))
            sp2 = [SamplingParams(temperature=args.temperature, seed=salt, ignore_eos=True,
                                  max_tokens=max(1, t["trunk_tokens"] - n_join)) for t in trees]
            w2, s2, f2, _ = measure(stage2, sp2)
            longest = statistics.mean(max(b["num_tokens"] for b in t["branches"]) + t["trunk_tokens"] for t in trees)
            rows["re-prefill join"] = (w1 + w2, s1 + s2, f1 + f2, longest)
            for side, (wall, n_steps, n_prefill, seq_steps) in rows.items():
                row = {"parts": parts, "round": rnd, "side": side, "requests": len(prompts), "wall_s": wall,
                       "engine_steps": n_steps, "prefilled_tokens": n_prefill, "sequential_steps": seq_steps,
                       "tokens": statistics.mean(t["num_tokens"] for t in trees)}
                results.append(row)
                print(json.dumps(row), flush=True)
    headers = [_header_steps(llm, steps, parts, args) for parts in args.parts]
    summary = []
    for parts in args.parts:
        base = {}
        for side in FORKJOIN_SIDES:
            rows = [r for r in results if r["parts"] == parts and r["side"] == side]
            base[side] = {k: statistics.median(r[k] for r in rows)
                          for k in ("wall_s", "engine_steps", "prefilled_tokens", "sequential_steps", "tokens")}
        for side in FORKJOIN_SIDES:
            row = {"parts": parts, "side": side, **base[side],
                   "wall_vs_forkjoin": base[side]["wall_s"] / base["fork/join"]["wall_s"]}
            summary.append(row)
    return {"benchmark": "forkjoin", "machine": c.machine(), "results": results, "summary": summary,
            "headers": headers,
            "model": args.model or "SmolLM2-135M-Instruct", "attention": c.attention_of(llm)}

