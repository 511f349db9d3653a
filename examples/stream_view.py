"""Live view of a streaming Hogwild group: one terminal column per worker.

    vllm serve <model> --plugin hogwild --hogwild-max-workers 4
    .venv/bin/python examples/stream_view.py [--workers 3] [--layout contiguous|isolated]

Sends one /v1/chat/completions request with n=N (choice i is worker i) and redraws the
columns in place, with plain ANSI escape codes, as the interleaved deltas arrive. When
stdout is not a terminal (or with --plain) it prints each worker's lines as they complete
instead. Ends with each worker's token count and tokens/s, measured on the client.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
import unicodedata
from dataclasses import dataclass
from typing import Any

from openai import OpenAI

CLEAR_BELOW = "\x1b[J"
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
BOLD, DIM, RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"
SEPARATOR = " │ "


@dataclass
class Worker:
    """One worker's stream as seen by the client."""
    text: str = ""
    tokens: int = 0                     # token ids received (EOS included), see on_chunk
    first_s: float | None = None        # seconds from the request to its first content
    last_s: float = 0.0                 # seconds from the request to its last token
    finish_reason: str | None = None
    printed: int = 0                    # plain mode: characters of `text` already printed


def printable(text: str) -> str:
    """Model text made safe to draw: tabs to spaces, other control characters dropped."""
    text = text.replace("\t", "    ")
    return "".join(ch for ch in text if ch == "\n" or ch.isprintable())


def cells(text: str) -> int:
    """Terminal cells `text` takes: 2 for wide characters (CJK, most emoji), 0 for combining
    marks and format characters (ZWJ, variation selectors), else 1; close to wcwidth."""
    return sum(0 if unicodedata.category(ch) in ("Mn", "Me", "Cf")
               else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def pad(text: str, width: int) -> str:
    return text + " " * (width - cells(text))


def wrap(text: str, width: int) -> list[str]:
    """Wrap `text` into lines of at most `width` cells: at spaces where possible, inside
    a word when the word alone is wider than the column; newlines start new lines."""
    lines: list[str] = []
    for paragraph in printable(text).split("\n"):
        line = ""
        for piece in re.findall(r"\S+|\s+", paragraph):
            if cells(line + piece) <= width:
                line += piece
                continue
            if line.strip():
                lines.append(line.rstrip())
            line = "" if piece.isspace() else piece
            while cells(line) > width:  # a word wider than the column: cut it
                cut = 1
                while cells(line[:cut + 1]) <= width:
                    cut += 1
                lines.append(line[:cut])
                line = line[cut:]
        lines.append(line.rstrip())
    return lines


class ColumnView:
    """Redraws all workers side by side, in place, below the cursor.

    Each frame moves the cursor back up over the previous frame and clears to the end of
    the screen. The frame is kept shorter than the terminal (a column too long shows its
    last lines), since the cursor cannot move back above the top of the screen.
    """

    def __init__(self, n_workers: int, min_interval_s: float = 0.05) -> None:
        size = shutil.get_terminal_size()
        self.width = max(8, (size.columns - len(SEPARATOR) * (n_workers - 1)) // n_workers)
        self.max_rows = max(3, size.lines - 3)  # header + rule + text rows, room for the prompt
        self.height = 0  # rows drawn by the previous frame
        self.min_interval_s = min_interval_s
        self.drawn_at = 0.0

    def draw(self, workers: dict[int, Worker], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.drawn_at < self.min_interval_s:
            return  # at most ~20 frames/s: redrawing on every token would flicker
        self.drawn_at = now
        order = sorted(workers)
        headers = []
        for i in order:
            w = workers[i]
            state = w.finish_reason or ("streaming" if w.first_s is not None else "waiting")
            headers.append(f"worker {i} · {w.tokens} tok · {state}"[: self.width].ljust(self.width))
        body_rows = self.max_rows - 2
        columns = [wrap(workers[i].text, self.width)[-body_rows:] for i in order]
        rows = max((len(c) for c in columns), default=0)
        frame = [BOLD + SEPARATOR.join(headers) + RESET,
                 DIM + SEPARATOR.join("─" * self.width for _ in order) + RESET]
        for r in range(rows):
            row = [pad(c[r] if r < len(c) else "", self.width) for c in columns]
            frame.append(SEPARATOR.join(row).rstrip())
        up = f"\x1b[{self.height}F" if self.height else "\r"  # to column 0, `height` rows up
        sys.stdout.write(up + CLEAR_BELOW + "\n".join(frame) + "\n")
        sys.stdout.flush()
        self.height = len(frame)


def print_plain(workers: dict[int, Worker], final: bool = False) -> None:
    """Non-TTY output: print each worker's completed lines, prefixed by the worker."""
    for i in sorted(workers):
        w = workers[i]
        pending = w.text[w.printed:]
        lines = pending.split("\n")
        done, rest = lines[:-1], lines[-1]
        if final and rest:
            done, rest = done + [rest], ""
        for line in done:
            print(f"[w{i}] {printable(line)}")
        w.printed = len(w.text) - len(rest)
    sys.stdout.flush()


def on_chunk(workers: dict[int, Worker], chunk: Any, now: float) -> None:
    """Fold one stream chunk into the workers' state.

    Tokens are counted from the `token_ids` each choice chunk carries (we ask vLLM for
    `return_token_ids`); without them, from the chunks that carry content.
    """
    for choice in chunk.choices:
        w = workers.setdefault(choice.index, Worker())
        content = choice.delta.content or ""
        token_ids = getattr(choice, "token_ids", None)
        n_tokens = len(token_ids) if token_ids is not None else int(bool(content))
        w.tokens += n_tokens
        if n_tokens:
            w.last_s = now
        if content:
            w.first_s = now if w.first_s is None else w.first_s
            w.text += content
        if choice.finish_reason is not None:
            w.finish_reason = choice.finish_reason


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "EMPTY"))
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--workers", type=int, default=2, help="n: the number of Hogwild workers")
    parser.add_argument("--layout", default="contiguous", choices=["contiguous", "isolated"])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7, help="must be > 0 for n > 1")
    parser.add_argument("--prompt", default="List some fruits and some vegetables.")
    parser.add_argument("--plain", action="store_true", help="line-by-line output, no redrawing")
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    plain = args.plain or not sys.stdout.isatty()
    workers = {i: Worker() for i in range(args.workers)}
    view = None if plain else ColumnView(args.workers)
    print(f"{model} · {args.workers} workers · layout={args.layout} · {args.prompt!r}\n")

    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": args.prompt}], n=args.workers,
        max_tokens=args.max_tokens, temperature=args.temperature, stream=True,
        stream_options={"include_usage": True},
        extra_body={"vllm_xargs": {"hogwild_layout": args.layout, "hogwild_protocol": "raw"},
                    "return_token_ids": True})
    usage = None
    interrupted = False
    if view is not None:
        sys.stdout.write(HIDE_CURSOR)
    try:
        for chunk in stream:
            on_chunk(workers, chunk, time.perf_counter() - start)
            usage = chunk.usage or usage  # the group's usage comes in the last chunk
            if view is not None:
                view.draw(workers)
            else:
                print_plain(workers)
    except KeyboardInterrupt:  # Ctrl-C: closing the connection aborts the whole group
        stream.close()
        interrupted = True
    finally:
        if view is not None:
            view.draw(workers, force=True)
            sys.stdout.write(SHOW_CURSOR)
        else:
            print_plain(workers, final=True)

    # tok/s: a worker's tokens over the time from the request to its last token.
    print()
    for i, w in sorted(workers.items()):
        ttft = f"{w.first_s * 1000:.0f} ms" if w.first_s is not None else "-"
        rate = f"{w.tokens / w.last_s:.1f} tok/s" if w.last_s > 0 else "-"
        print(f"worker {i}: {w.tokens:>4} tokens  {rate:>11}  first token {ttft:>8}  ({w.finish_reason})")
    if usage is not None:
        print(f"group usage: prompt={usage.prompt_tokens} completion={usage.completion_tokens}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    raise SystemExit(main())
