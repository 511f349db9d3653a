"""Command-line flags: ``vllm serve MODEL --plugin hogwild [--hogwild-max-workers N]``.

vLLM loads general plugins inside ``AsyncEngineArgs.add_cli_args``, before it
adds the engine flags, so the plugin adds its own argument group there (shown
by ``vllm serve --help`` and ``--help=hogwild``). ``from_cli_args`` keeps only
``EngineArgs`` fields, so the flags are folded into
``additional_config["hogwild"]``, which every vLLM process receives; that is
the same switch the offline ``LLM(additional_config={"hogwild": {...}})`` uses.
One flag per :class:`~vllm_hogwild.core.options.EngineOptions` field, so a new
engine option is a new flag without touching this module.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from vllm_hogwild.core.options import ENGINE_KEY, KV_MODES, EngineOptions, HogwildOptionError

PLUGIN_FLAG = "--plugin"
PLUGIN_NAME = "hogwild"
FLAG_PREFIX = "--hogwild-"
GROUP_TITLE = "Hogwild"

_HELP = {
    "max_workers": "Largest number of workers (the request's n) one Hogwild group may have.",
    "client_patterns": "Whether requests may send their own hogwild_step_end / hogwild_answer_pattern / "
                       "hogwild_branch_end (RE2 regular expressions, matched in linear time over a bounded window); "
                       "'off' allows the built-in patterns only.",
    "max_plain_wait": "Seconds a plain request may wait while Hogwild groups that arrived after it are "
                      "admitted ahead of it; a complete group that has waited longer defers newer "
                      "plain requests until it fits.",
    "kv": "How a group takes KV blocks: 'on-demand' (as its workers grow, like every vLLM request; under "
          "pressure a whole group is preempted and later resumed by exact replay) or 'reserve' (every "
          "worker's whole budget at admission; no group is ever preempted).",
}


_CHOICES = {"kv": KV_MODES}


def _on_off(text: str) -> bool:
    value = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected on or off, not {text!r}")
    return value


def _flag_type(default: Any):
    return _on_off if isinstance(default, bool) else type(default)


def _shown(default: Any) -> str:
    return ("on" if default else "off") if isinstance(default, bool) else str(default)


def engine_flags() -> list[tuple[str, str, Any]]:
    """(flag, EngineOptions field, default) for every engine option."""
    return [
        (FLAG_PREFIX + f.name.replace("_", "-"), f.name, f.default)
        for f in dataclasses.fields(EngineOptions)
    ]


def add_cli_args(parser):
    """Add the Hogwild group to a vLLM engine-argument parser (idempotent)."""
    if PLUGIN_FLAG in parser._option_string_actions:
        return parser
    flags = engine_flags()
    group = parser.add_argument_group(
        title=GROUP_TITLE,
        description="Hogwild! Inference (N workers over one shared KV cache): "
        + ", ".join([f"{PLUGIN_FLAG} {PLUGIN_NAME}"] + [flag for flag, _, _ in flags])
        + ".",
    )
    group.add_argument(
        PLUGIN_FLAG,
        action="append",
        default=argparse.SUPPRESS,  # not given: no attribute (and no "(default: None)" in the help)
        choices=[PLUGIN_NAME],
        metavar="NAME",
        help=f"Switch a plugin on. '{PLUGIN_FLAG} {PLUGIN_NAME}' serves requests that carry Hogwild "
        "options (n workers, vllm_xargs hogwild_*) as Hogwild groups; every other request runs as "
        "in stock vLLM. Without it the server is stock vLLM.",
    )
    for flag, name, default in flags:
        group.add_argument(
            flag,
            type=_flag_type(default),
            choices=_CHOICES.get(name),
            default=argparse.SUPPRESS,  # not given: no attribute, and the option's own default applies
            metavar="{on,off}" if isinstance(default, bool) else None,
            help=f"{_HELP.get(name, name)} Needs {PLUGIN_FLAG} {PLUGIN_NAME}. (default: {_shown(default)})",
        )
    return parser


def fold_cli_args(args: argparse.Namespace, engine_args) -> None:
    """Move the parsed Hogwild flags into ``engine_args.additional_config``."""
    plugins = getattr(args, "plugin", None) or []
    given = {
        name: getattr(args, dest)
        for flag, name, _ in engine_flags()
        if (dest := flag[2:].replace("-", "_")) and getattr(args, dest, None) is not None
    }
    if PLUGIN_NAME not in plugins:
        if given:
            flag = FLAG_PREFIX + next(iter(given)).replace("_", "-")
            raise HogwildOptionError(flag, f"needs {PLUGIN_FLAG} {PLUGIN_NAME}")
        return
    config = dict(engine_args.additional_config or {})
    current = config.get(ENGINE_KEY)
    options = dict(current) if isinstance(current, dict) else {}
    options.update(given)
    config[ENGINE_KEY] = options
    try:  # fail here, naming the flag, rather than in the engine
        EngineOptions.from_additional_config(config)
    except HogwildOptionError as err:
        name = err.parameter.rpartition(".")[2]
        if name in given:
            raise err.renamed(FLAG_PREFIX + name.replace("_", "-")) from None
        raise
    engine_args.additional_config = config
