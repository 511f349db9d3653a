"""What the trained collaborators' server modules share: a served folder, one raw group through the stock `openai`
client, and the two checks every shipped collaborator passes (the training forward gives the server's logprobs;
the folder is what the training command writes). ``collaborator`` is the model's module
(``vllm_hogwild.models.links_collaborator``, ``...merges_collaborator``): its ``model_dir()``, ``TEMPERATURE`` and
``MIN_P``."""

from __future__ import annotations

from pathlib import Path

from tests.hogwild_checks import check_trained_folder, training_forward_gaps
from tests.server.conftest import Server


def serve(collaborator, tmp: Path, name: str):
    """A module fixture's body: ``vllm serve <the shipped folder> --plugin hogwild`` (at most 8 workers a group),
    yielded ready, stopped after."""
    server = Server(collaborator.model_dir(), ["--plugin", "hogwild", "--hogwild-max-workers", "8"],
                    tmp / "server.log", name=name)
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def _request(server: Server, collaborator, prompt: str, n: int, layout: str, seed: int, max_tokens: int,
             stream: bool):
    import openai

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    return client.completions.create(
        model=server.name, prompt=prompt, n=n, temperature=collaborator.TEMPERATURE, max_tokens=max_tokens,
        logprobs=0, stream=stream,
        extra_body={"min_p": collaborator.MIN_P, "seed": seed, "return_tokens_as_token_ids": True,
                    "vllm_xargs": {"hogwild_layout": layout, "hogwild_protocol": "raw"}})


def _ids(tokens) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in tokens]


def raw_group(server: Server, collaborator, prompt: str, n: int, layout: str, seed: int, max_tokens: int):
    """One group through ``/v1/completions`` in the raw protocol, sampled as the collaborator is benchmarked: its
    texts and each worker's token ids and logprobs (end included)."""
    resp = _request(server, collaborator, prompt, n, layout, seed, max_tokens, stream=False)
    choices = sorted(resp.choices, key=lambda c: c.index)
    return [c.text for c in choices], [_ids(c.logprobs.tokens) for c in choices], [
        list(c.logprobs.token_logprobs) for c in choices]


def streamed_group(server: Server, collaborator, prompt: str, n: int, layout: str, seed: int, max_tokens: int,
                   until) -> tuple[list[str], list[list[int]], bool]:
    """One group streamed as :func:`raw_group` asks for it, by a client that closes the stream (cancels the group)
    once ``until(texts)`` holds: the texts and token ids it read, and whether it cancelled."""
    texts, ids = [""] * n, [[] for _ in range(n)]
    stream = _request(server, collaborator, prompt, n, layout, seed, max_tokens, stream=True)
    try:
        for chunk in stream:
            for c in chunk.choices:
                texts[c.index] += c.text
                ids[c.index] += _ids(c.logprobs.tokens) if c.logprobs else []
            if until(texts):
                return texts, ids, True
    finally:
        stream.close()
    return texts, ids, False


GROUPS = ((1, "contiguous"), (4, "contiguous"), (4, "isolated"))  # one worker, a group of 4, its control


def three_ways(server: Server, collaborator, tasks, max_tokens: int, until=None) -> tuple[dict, dict]:
    """Each task (the i-th seeded ``i``) as one worker, a group of 4 that reads each other and the isolated control
    of 4: ``(runs, steps)``, each keyed by ``(workers, layout)``, a run being ``(texts, token ids, ...)`` and its
    steps its longest lane's tokens. ``until(task)``: the client's cancel for the task's groups
    (:func:`streamed_group`; a cancelled group counts the step after the last it read, as the split with cancel
    does); None: :func:`raw_group`, every group to its end."""
    def one(task, n, layout, seed):
        if until is None:
            return raw_group(server, collaborator, task.prompt(), n, layout, seed, max_tokens)
        return streamed_group(server, collaborator, task.prompt(), n, layout, seed, max_tokens, until(task))

    runs = {(n, layout): [one(task, n, layout, i) for i, task in enumerate(tasks)] for n, layout in GROUPS}
    steps = {key: [max(map(len, run[1])) + (until is not None and run[2]) for run in value]
             for key, value in runs.items()}
    return runs, steps


def check_forward_matches_server(server: Server, collaborator, vocab, task, max_tokens: int) -> None:
    """The lock-step training forward gives the logprobs the server returns for the model's own sampled group of 4
    (within 1e-4); the flat pass over each reader's view does not (the check can fail)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(collaborator.model_dir(), dtype=torch.float32).eval()
    _, ids, got = raw_group(server, collaborator, task.prompt(), 4, "contiguous", seed=3, max_tokens=max_tokens)
    err, miss = training_forward_gaps(model, vocab.prompt(task), ids, got)
    print(f"\n{server.name} collaborator, 4 workers: training forward {err:.2e} from the server, flat pass {miss:.2e}")
    assert err <= 1e-4 and miss > 1e-3


def check_shipped_folder(collaborator, vocab) -> None:
    """The shipped folder holds what the training command writes, in float32, its weights at most 10 MB."""
    folder, config = check_trained_folder(collaborator, vocab)
    assert config["dtype"] == "float32"
    assert (folder / "model.safetensors").stat().st_size <= 10_000_000
