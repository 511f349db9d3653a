"""The scheduler's text of each sampled token: vLLM's incremental detokenizer, not each token decoded alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.vllm


def _tokenizer():
    from vllm.tokenizers import get_tokenizer

    from vllm_hogwild.models.default import prepare

    return get_tokenizer(str(prepare(verbose=False)))


def _stream(tok, prompt: str):
    from vllm import SamplingParams

    from vllm_hogwild.scheduler.detok import TextStream

    request = SimpleNamespace(request_id="0_r", sampling_params=SamplingParams(),
                              prompt_token_ids=tok.encode(prompt, add_special_tokens=False))
    return TextStream(tok, request)


def test_a_character_split_across_tokens_arrives_whole_and_ends_a_step() -> None:
    from vllm_hogwild.core.protocol.paragraphs import ParagraphTracker

    tok = _tokenizer()
    ids = tok.encode("One 漢 two.", add_special_tokens=False)
    alone = [tok.decode([i]) for i in ids]
    assert "\ufffd" in alone  # decoded alone, each byte of the character is U+FFFD
    stream = _stream(tok, "Write:")
    pieces = [stream.next(i) for i in ids]
    assert "".join(pieces) == "One 漢 two." and "\ufffd" not in "".join(pieces)
    split = [k for k, piece in enumerate(alone) if piece == "\ufffd"]
    assert [pieces[k] for k in split[:-1]] == [""] * (len(split) - 1)  # nothing until the character is complete
    # A step end on that character: seen at the token that completes it (never with tokens decoded alone).
    whole, alone_tracker = ParagraphTracker(1, 3, paragraph_end="漢"), ParagraphTracker(1, 3, paragraph_end="漢")
    ends = [k for k, piece in enumerate(pieces) if whole.on_sampled(0, 3 + k, piece)]
    assert ends == [split[-1]]
    assert not any(alone_tracker.on_sampled(0, 3 + k, piece) for k, piece in enumerate(alone))


def test_special_tokens_add_no_text_as_in_vllms_output() -> None:
    tok = _tokenizer()
    stream = _stream(tok, "Hi")
    assert stream.next(tok.eos_token_id) == ""
