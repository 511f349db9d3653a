"""Hogwild options: the engine switch and the per-request options. Pure, no vLLM import.

Engine (offline ``LLM(..., additional_config={"hogwild": {...}})``)::

    {"max_workers": 8}

Request (offline ``SamplingParams(n=N, extra_args={"hogwild": {...}})``; the
OpenAI server's flat ``vllm_xargs`` spell the same option ``hogwild_<name>``)::

    {"layout": "contiguous", "protocol": "raw"}

``layout`` is ``contiguous``, ``isolated``, ``combined`` or ``interleaved``;
the last two cut each worker's text into paragraphs (``step_end``, a regular
expression, default :data:`vllm_hogwild.core.protocol.paragraphs.PARAGRAPH_END`). ``protocol`` is
``raw`` (nothing injected), ``named`` (paragraph layouts only: the engine starts
every paragraph of a worker with its name and paragraph number, ``**Alice [2]:** ``) or
``collab``, the whole collaboration protocol: ``named`` plus a preamble that
tells the workers they are a team (``task``: ``math``, ``code`` or
``general``; ``person``: ``second`` or ``first``), section headers between
the parts of every view, the task's answer pattern, redundancy checks and the
finisher; its layout defaults to ``combined``.
``redundancy_every`` (``named``, ``collab``) makes a worker's next paragraph prefix
ask whether it repeats someone's work once the group has generated that many
more tokens. ``answer_pattern`` (a regular expression with one group) ends the
whole group once any worker's text matches it: every live worker then samples
its end of sequence next. ``finisher`` (``collab``): when the budget runs out
without an answer, the last that many tokens of one worker's budget go to a
forced "final answer now" suffix and greedy tokens that read the whole shared
cache.

Every error is a :class:`HogwildOptionError` (a ``ValueError``) that names the
offending field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

from vllm_hogwild.core.errors import HogwildOptionError
from vllm_hogwild.core.patterns import compile_pattern
from vllm_hogwild.core.protocol_text import DEFAULT_ANSWER_PATTERN, PERSONS, TASKS

ENGINE_KEY = "hogwild"  # in additional_config
REFUSED_KEY = "hogwild_refused"  # in additional_config: switched on for a model Hogwild cannot serve
RUNTIME_KEY = "hogwild_runtime"  # in additional_config: decisions the switch made for every process
REQUEST_KEY = "hogwild"  # in SamplingParams.extra_args
FLAT_PREFIX = "hogwild_"  # OpenAI vllm_xargs: hogwild_layout, ...

REQUEST_LAYOUTS = ("contiguous", "isolated", "combined", "interleaved")
HISTORY_LAYOUTS = ("combined", "interleaved")  # layouts with a shared history of finished paragraphs
FORKJOIN_PROTOCOLS = ("multiverse", "npr")  # parallel-reasoning models: one request forks into branches and joins
PROTOCOLS = ("raw", "named", "collab", *FORKJOIN_PROTOCOLS)
FORKJOIN_LAYOUT = "forkjoin"  # the layout of a fork/join request's lanes (core/views/forks.fork_view); not a client's
BRANCH_MODES = ("isolated", "hogwild")
NAMED_PROTOCOLS = ("named", "collab")  # protocols that start every paragraph with the writer's name
COLLAB_DEFAULTS = {"layout": "combined", "redundancy_every": 512, "finisher": 16}  # answer_pattern: the task's
PATTERN_OPTIONS = ("step_end", "answer_pattern", "branch_end")  # regular expressions a client may send
KV_MODES = ("on-demand", "reserve")  # how a group takes KV blocks (EngineOptions.kv)
MAX_REDUNDANCY_EVERY = 1 << 20
MAX_FINISHER = 1024

__all__ = ["HogwildOptionError"]  # re-exported: the error of every option


@dataclass(frozen=True)
class EngineOptions:
    """The switch's options (``additional_config["hogwild"]``; ``vllm serve --hogwild-*``)."""

    max_workers: int = 8
    # Whether requests may send their own step_end / answer_pattern (RE2, bounded); off: the
    # built-in patterns only.
    client_patterns: bool = True
    # Fairness: a group goes ahead of an older plain request only while that request has
    # waited less than this many seconds (and, the other way, a complete group that has
    # waited longer defers younger plain requests until it fits).
    max_plain_wait: float = 0.5
    # How a group takes KV blocks: "on-demand" (as it grows, like every vLLM request; under pressure a
    # whole group is preempted and later resumed by exact replay) or "reserve" (its whole budget at
    # admission; never preempted).
    kv: str = "on-demand"

    @classmethod
    def from_additional_config(cls, additional_config: Mapping[str, Any] | None) -> "EngineOptions | None":
        """``None`` when Hogwild is not switched on."""
        raw = (additional_config or {}).get(ENGINE_KEY)
        if raw is None or raw is False:
            return None
        if raw is True:
            raw = {}
        if not isinstance(raw, Mapping):
            raise HogwildOptionError("additional_config.hogwild", "expected a dict of engine options")
        known = {f.name for f in fields(cls)}
        for key in raw:
            if key not in known:
                raise HogwildOptionError(
                    f"additional_config.hogwild.{key}", f"unknown engine option; known: {sorted(known)}"
                )
        opts = cls(**raw)
        if not _is_int(opts.max_workers) or not 1 <= opts.max_workers <= 64:
            raise HogwildOptionError("additional_config.hogwild.max_workers", "an integer in [1, 64]")
        if not isinstance(opts.client_patterns, bool):
            raise HogwildOptionError("additional_config.hogwild.client_patterns", "true or false")
        if (isinstance(opts.max_plain_wait, bool) or not isinstance(opts.max_plain_wait, (int, float))
                or not 0 <= opts.max_plain_wait <= 3600):
            raise HogwildOptionError("additional_config.hogwild.max_plain_wait", "seconds in [0, 3600]")
        if opts.kv not in KV_MODES:
            raise HogwildOptionError("additional_config.hogwild.kv", f"one of {list(KV_MODES)}")
        return opts


@dataclass(frozen=True)
class RequestOptions:
    layout: str = "contiguous"
    protocol: str = "raw"
    step_end: str | None = None  # regex ending a paragraph (combined, interleaved); None: paragraphs.PARAGRAPH_END
    answer_pattern: str | None = None  # regex (one group): the group stops once a worker writes a match
    redundancy_every: int = 0  # named, collab: a paragraph prefix asks "am I repeating?" every K group tokens
    task: str = "math"  # collab: the preamble's template and the default answer pattern
    person: str = "second"  # collab: the preamble speaks to the workers ("You are ...") or as them ("We are ...")
    finisher: int = 0  # collab: greedy tokens of the finisher (0: none)
    accept_steps: bool = False  # the server adds each choice's accept steps (speculative decoding)
    branches: str = "isolated"  # fork/join: siblings never read each other ("isolated") or do ("hogwild")
    branch_end: str | None = None  # fork/join: a regex that ends a branch in place of the family's closing tag
    max_branches: int = 0  # fork/join: lanes for branches (0: the family's limit, or 4; capped by max_workers - 1)

    @property
    def forks(self) -> bool:
        return self.protocol in FORKJOIN_PROTOCOLS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PromptTail:
    """Where the collab protocol's section headers sit in a group's stored prompt: ``[start, end)`` each."""

    prompt_end: int  # the prompt part of every view ends here (the headers follow)
    history: tuple[int, int]
    others: tuple[int, int]
    pivot: tuple[int, int]
    own: tuple[int, int]

    def separators(self) -> tuple[tuple[int, int], ...]:
        """The header ranges in the order views name them: history, others, pivot, own."""
        return self.history, self.others, self.pivot, self.own


@dataclass(frozen=True)
class RequestSpec:
    """A Hogwild request as the engine core needs it; parsed once, in the front end.

    It crosses to the engine core by value, as the plain dict of :meth:`to_wire`
    under ``SamplingParams.extra_args[SPEC_KEY]`` (vLLM serializes extra_args
    with msgpack), and is read back there with :meth:`from_wire`.
    """

    options: RequestOptions
    num_workers: int
    prompt_tail: PromptTail | None = None  # collab: the section headers at the prompt's tail
    fork_now: tuple[str, ...] | None = None  # fork/join: the prompt ends in a complete goal of these parts
    open_goal: str = ""  # fork/join: the prompt's unclosed goal (its entries count at the trunk's goal end)
    unforked: str | None = None  # fork/join: why the complete goal the prompt ends in does not fork (None: it does)

    def to_wire(self) -> dict[str, Any]:
        return {"options": self.options.to_dict(), "num_workers": self.num_workers,
                "prompt_tail": None if self.prompt_tail is None else {
                    k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.prompt_tail).items()},
                "fork_now": None if self.fork_now is None else list(self.fork_now), "open_goal": self.open_goal,
                "unforked": self.unforked}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> "RequestSpec":
        tail = wire.get("prompt_tail")
        fork_now = wire.get("fork_now")
        return cls(RequestOptions(**wire["options"]), int(wire["num_workers"]),
                   None if tail is None else PromptTail(**{k: tuple(v) if isinstance(v, list) else v
                                                          for k, v in tail.items()}),
                   None if fork_now is None else tuple(fork_now), wire.get("open_goal", ""), wire.get("unforked"))


SPEC_KEY = "_hogwild_spec"  # in SamplingParams.extra_args, set by the front end only (RequestSpec.to_wire)


def runtime_of(additional_config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """What the switch decided for every process of the engine (``{}``: Hogwild is off)."""
    return (additional_config or {}).get(RUNTIME_KEY) or {}


def runner_of(additional_config: Mapping[str, Any] | None) -> str | None:
    """The model runner vLLM chose for the engine, as the switch saw it: ``"v1"`` or ``"v2"`` (``None``: Hogwild
    is off)."""
    return runtime_of(additional_config).get("runner")


def spec_of(extra_args: Mapping[str, Any] | None) -> RequestSpec | None:
    """The spec the front end stamped on a request's extra_args, or ``None`` (a plain request)."""
    wire = (extra_args or {}).get(SPEC_KEY)
    return None if wire is None else RequestSpec.from_wire(wire)


def requested(extra_args: Mapping[str, Any] | None) -> bool:
    """Whether a request asks for Hogwild: a ``hogwild`` entry or any ``hogwild_*`` key."""
    if not extra_args:
        return False
    return REQUEST_KEY in extra_args or any(isinstance(k, str) and k.startswith(FLAT_PREFIX) for k in extra_args)


def request_field(extra_args: Mapping[str, Any]) -> str:
    """The field that made a request a Hogwild request: ``hogwild`` or its first ``hogwild_*`` key."""
    if REQUEST_KEY in extra_args:
        return REQUEST_KEY
    return next(k for k in extra_args if isinstance(k, str) and k.startswith(FLAT_PREFIX))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_of(choices: tuple[str, ...], what: str):
    def check(field: str, value: Any) -> None:
        if not isinstance(value, str) or value not in choices:
            shown = repr(value) if isinstance(value, str) and len(value) <= 40 else f"a {type(value).__name__}"
            raise HogwildOptionError(field, f"unknown {what} {shown}; expected one of {list(choices)}")
    return check


def _int_in(low: int, high: int, what: str):
    def check(field: str, value: Any) -> None:
        if not _is_int(value) or not low <= value <= high:
            raise HogwildOptionError(field, f"an integer in [{low}, {high}] ({what})")
    return check


def _bool(field: str, value: Any) -> None:
    # vLLM's server parses vllm_xargs values as str | int | float: a JSON true arrives as 1
    if not (isinstance(value, bool) or (_is_int(value) and value in (0, 1))):
        raise HogwildOptionError(field, "true or false")


def _pattern(dot_all: bool, min_groups: int):
    def check(field: str, value: Any) -> None:
        compile_pattern(field, value, dot_all=dot_all, min_groups=min_groups)
    return check


# Every request option and the check of its value's type and range; a value that passes is safe to use.
_CHECKS = {
    "layout": _one_of(REQUEST_LAYOUTS, "layout"),
    "protocol": _one_of(PROTOCOLS, "protocol"),
    "step_end": _pattern(dot_all=False, min_groups=0),
    "answer_pattern": _pattern(dot_all=True, min_groups=1),
    "redundancy_every": _int_in(0, MAX_REDUNDANCY_EVERY, "0: off"),
    "task": _one_of(TASKS, "task"),
    "person": _one_of(PERSONS, "person"),
    "finisher": _int_in(0, MAX_FINISHER, "greedy tokens; 0: none"),
    "accept_steps": _bool,
    "branches": _one_of(BRANCH_MODES, "branch mode"),
    "branch_end": _pattern(dot_all=False, min_groups=0),
    "max_branches": _int_in(1, 63, "lanes for branches"),
}
FORKJOIN_OPTIONS = ("branches", "branch_end", "max_branches")


def parse_request(extra_args: Mapping[str, Any], client_patterns: bool = True) -> RequestOptions:
    """Read the options from ``extra_args`` (nested dict or flat ``hogwild_*`` keys).

    Any value of any type either parses or raises :class:`HogwildOptionError`
    naming its field, in bounded time (patterns are compiled by RE2).
    ``client_patterns=False`` (the server's ``--hogwild-client-patterns off``)
    refuses a request's own ``step_end`` or ``answer_pattern``.
    """
    nested = extra_args.get(REQUEST_KEY)
    if nested is True or nested is None:
        nested = {}
    if not isinstance(nested, Mapping):
        raise HogwildOptionError("hogwild", "expected a dict of Hogwild options")
    values: dict[str, tuple[str, Any]] = {str(k): (f"hogwild.{k}", v) for k, v in nested.items()}
    for key, value in extra_args.items():
        if isinstance(key, str) and key.startswith(FLAT_PREFIX):
            values[key[len(FLAT_PREFIX):]] = (key, value)
    for name, (field, value) in values.items():
        if name not in _CHECKS:
            raise HogwildOptionError(field, f"unknown Hogwild option; known: {sorted(_CHECKS)}")
        if name in PATTERN_OPTIONS and not client_patterns:
            raise HogwildOptionError(field, "this server takes only the built-in patterns "
                                            "(--hogwild-client-patterns off); leave it out")
        _CHECKS[name](field, value)
    opts = RequestOptions(**{k: bool(v) if k == "accept_steps" else v for k, (_, v) in values.items()})
    if opts.protocol == "collab":
        opts = _collab_defaults(opts, values)
    if "step_end" in values and opts.layout not in HISTORY_LAYOUTS:
        raise HogwildOptionError(values["step_end"][0], f"steps exist only in the layouts {list(HISTORY_LAYOUTS)}")
    if "redundancy_every" in values and opts.redundancy_every and opts.protocol not in NAMED_PROTOCOLS:
        raise HogwildOptionError(values["redundancy_every"][0],
                                 f"redundancy checks ride on step prefixes: protocol one of {list(NAMED_PROTOCOLS)}")
    if opts.forks:
        return _forkjoin_options(opts, values)
    for name in FORKJOIN_OPTIONS:
        if name in values:
            raise HogwildOptionError(values[name][0], f"an option of the fork/join protocols: protocol one of "
                                                      f"{list(FORKJOIN_PROTOCOLS)}")
    for name in ("task", "person", "finisher"):
        if name in values and opts.protocol != "collab":
            raise HogwildOptionError(values[name][0], "an option of the collaboration protocol: protocol 'collab'")
    if opts.protocol in NAMED_PROTOCOLS and opts.layout not in HISTORY_LAYOUTS:
        field = values["layout"][0] if "layout" in values else values["protocol"][0]
        raise HogwildOptionError(field, f"protocol {opts.protocol!r} needs steps: layout one of {list(HISTORY_LAYOUTS)}")
    return opts


def _forkjoin_options(opts: RequestOptions, values: Mapping[str, tuple[str, Any]]) -> RequestOptions:
    """A fork/join request: its views are the protocol's (no layout), and no option of the Hogwild protocols."""
    for name in ("layout", "step_end", "answer_pattern", "redundancy_every", "task", "person", "finisher"):
        if name in values:
            raise HogwildOptionError(values[name][0], f"not an option of the fork/join protocol {opts.protocol!r} "
                                                      f"(its options: {list(FORKJOIN_OPTIONS)}, and accept_steps)")
    return replace(opts, layout=FORKJOIN_LAYOUT)


def _collab_defaults(opts: RequestOptions, values: Mapping[str, tuple[str, Any]]) -> RequestOptions:
    """The ``collab`` protocol's defaults for the options the request left out."""
    fill = {k: v for k, v in COLLAB_DEFAULTS.items() if k not in values}
    if "answer_pattern" not in values:
        fill["answer_pattern"] = DEFAULT_ANSWER_PATTERN[opts.task]
    return replace(opts, **fill)


def spec_slack(vllm_config) -> int:
    """Slots a lane may need past its budget with speculative decoding: drafts verified after its last
    token may be, and the drafter's look-ahead (0 without speculation)."""
    return (getattr(vllm_config, "num_speculative_tokens", 0) or 0) + (getattr(vllm_config, "num_lookahead_tokens", 0) or 0)


def blocks_for_group(prompt_len: int, max_tokens: int, num_workers: int, block_size: int, slack: int = 0) -> int:
    """KV blocks a group can ever hold: the prompt's full blocks once, each lane's rest privately
    (``slack``: slots past the budget, :func:`spec_slack`)."""
    shared = prompt_len // block_size
    per_lane = -(-(prompt_len + max_tokens + slack) // block_size) - shared
    return shared + num_workers * per_lane


def check_request(
    opts: EngineOptions,
    num_workers: int,
    prompt_len: int,
    max_tokens: int | None,
    max_model_len: int,
    block_size: int,
    num_kv_blocks: int | None,
    slack: int = 0,
    view_lanes: int | None = None,
) -> int:
    """Validate a Hogwild request against the engine; return its per-worker ``max_tokens``.

    Without ``max_tokens``, or with one that asks for the whole room the
    context window leaves after the prompt (what vLLM's server fills in when a
    client sends none), each worker gets an equal share of that room.
    ``view_lanes``: how many lanes' budgets one view may span (default: every
    lane; a fork/join request's isolated branches: 2, the trunk and its longest
    branch).
    """
    view_lanes = num_workers if view_lanes is None else view_lanes
    if not 1 <= num_workers <= opts.max_workers:
        raise HogwildOptionError("n", f"{num_workers} workers; this engine allows 1 to {opts.max_workers}")
    room = max_model_len - prompt_len
    if max_tokens is None or max_tokens >= room:
        max_tokens = room // view_lanes
        if max_tokens < 1:
            raise HogwildOptionError("max_tokens", f"the prompt ({prompt_len} tokens) leaves no room in the context")
    # A worker's view holds the prompt and every lane's tokens.
    if prompt_len + view_lanes * max_tokens > max_model_len:
        what = "n" if view_lanes == num_workers else "lanes one view spans"
        raise HogwildOptionError(
            "max_tokens",
            f"prompt {prompt_len} + {what} {view_lanes} x max_tokens {max_tokens} = "
            f"{prompt_len + view_lanes * max_tokens} tokens exceeds the context window ({max_model_len})",
        )
    if num_kv_blocks:
        need = blocks_for_group(prompt_len, max_tokens, num_workers, block_size, slack)
        if need > num_kv_blocks:
            raise HogwildOptionError(
                "max_tokens",
                f"the group needs {need} KV blocks (prompt {prompt_len}, n {num_workers}, "
                f"max_tokens {max_tokens}) but the KV cache has {num_kv_blocks}",
            )
    return max_tokens
