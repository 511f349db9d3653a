"""Each worker's text, detokenized incrementally in the engine core, exactly as vLLM's front end does it.

The scheduler needs the text of every sampled token of a group that cuts
steps or looks for answers. Decoding each token alone would be wrong for a
character whose UTF-8 bytes span two tokens (each half decodes to U+FFFD) and
for tokenizers whose spacing depends on the previous token. vLLM's own
incremental detokenizer (the one its output processor uses, primed with the
prompt) is used instead: a token adds the text it completes, possibly nothing.
O(1) amortized per token.
"""

from __future__ import annotations

from types import SimpleNamespace

from vllm.v1.engine.detokenizer import IncrementalDetokenizer


class TextStream:
    """One worker's text, token by token."""

    def __init__(self, tokenizer, request) -> None:
        # vLLM's detokenizer reads these fields of an EngineCoreRequest; the scheduler's Request has them.
        like = SimpleNamespace(request_id=request.request_id, sampling_params=request.sampling_params,
                               prompt_token_ids=request.prompt_token_ids, prompt_embeds=None)
        self._detok = IncrementalDetokenizer.from_new_request(tokenizer, like)

    def next(self, token_id: int) -> str:
        """The text ``token_id`` completes (``""`` when it ends inside a character)."""
        return self._detok.decode_next(token_id)
