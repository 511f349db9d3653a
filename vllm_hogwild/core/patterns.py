"""Regular expressions a client sends (``step_end``, ``answer_pattern``), compiled and matched in linear time.

Pure, no vLLM import. A client's pattern runs inside the engine core on every
sampled token and inside the API server's event loop, so one slow pattern would
stall every other request. Hence:

- **RE2, not Python's ``re``.** RE2 (``google-re2``) matches in time linear in
  the text, whatever the pattern; it has no backreferences and no look-around,
  and refuses them at compile time. Its syntax is Python's for everything else
  (``\\d`` and ``\\w`` are ASCII classes).
- **Bounded compile.** A pattern longer than :data:`MAX_PATTERN_CHARS`, or one
  whose program would need more than :data:`MAX_PROGRAM_BYTES`, or one RE2
  cannot parse, is refused with a :class:`HogwildOptionError` naming the field, which
  the server answers with HTTP 400. Any exception while compiling counts.
- **Bounded matching.** :class:`WindowMatcher` keeps the last
  :data:`LOOKBACK_CHARS` characters of a worker's text and searches them plus
  the new text, once per sampled token: the work per token is bounded by the
  new text plus that window, never by the whole text. A match longer than the
  window is not seen by the engine (documented in ``docs/deploying.md``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from vllm_hogwild.core.errors import HogwildOptionError

MAX_PATTERN_CHARS = 512
MAX_PROGRAM_BYTES = 1 << 20  # RE2's memory budget for one compiled pattern (its DFA cache included)
LOOKBACK_CHARS = 2048  # text before the new text that a match may start in


def compile_pattern(parameter: str, pattern: Any, *, dot_all: bool = False, min_groups: int = 0):
    """``pattern`` compiled by RE2, or :class:`HogwildOptionError` naming ``parameter``.

    ``dot_all``: ``.`` matches a newline too (answers span lines).
    ``min_groups``: capturing groups the pattern must have (an answer pattern
    captures its answer).
    """
    if not isinstance(pattern, str) or not pattern:
        raise HogwildOptionError(parameter, "a non-empty regular expression (a string)")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise HogwildOptionError(parameter, f"{len(pattern)} characters; patterns are limited to {MAX_PATTERN_CHARS}")
    compiled = _compile(pattern, dot_all)
    if isinstance(compiled, str):
        raise HogwildOptionError(parameter, f"not a regular expression RE2 can match in linear time "
                                            f"(no backreferences or look-around): {compiled}")
    if compiled.groups < min_groups:
        raise HogwildOptionError(parameter, f"a regular expression with {min_groups} group(s) around the answer")
    return compiled


@functools.lru_cache(maxsize=256)
def _compile(pattern: str, dot_all: bool):
    """The compiled pattern, or the reason RE2 refused it (a string). Cached: a server sees the same few."""
    import re2

    options = re2.Options()
    options.log_errors = False
    options.max_mem = MAX_PROGRAM_BYTES
    options.dot_nl = dot_all
    try:
        return re2.compile(pattern, options)
    except Exception as err:  # RE2's own errors, and anything else: never a 500
        return _reason(err)


def _reason(err: Exception) -> str:
    text = err.args[0] if err.args else str(err)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = str(text)
    return text if len(text) <= 120 else text[:120] + "..."


@dataclass
class WindowMatcher:
    """Whether a growing text has matched a pattern, fed piece by piece in bounded work.

    :meth:`feed` appends a piece and returns True when a match lies in the last
    ``LOOKBACK_CHARS`` characters before the piece plus the piece. Once True,
    every later call is True without searching (the text has matched).
    """

    pattern: Any  # a compiled RE2 pattern
    lookback: int = LOOKBACK_CHARS
    matched: bool = False
    _tail: str = field(default="", repr=False)  # the window, after one character of context once cut
    _cut: bool = field(default=False, repr=False)

    def feed(self, piece: str) -> bool:
        if self.matched:
            return True
        if not piece:
            return False
        text = self._tail + piece
        # Once the text is cut, its first character is context only: ``^`` and ``\b``
        # then see the text as it is, not a start of text at the window's edge.
        self.matched = self.pattern.search(text, 1 if self._cut else 0) is not None
        if len(text) > self.lookback + 1:
            self._tail, self._cut = text[-(self.lookback + 1):], True
        else:
            self._tail = text
        return self.matched
