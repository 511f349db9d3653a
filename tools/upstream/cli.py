"""Every place the plugin touches vLLM, in one table, checked against the installed vLLM or another release's sources.

    python -m tools.upstream --runtime          # the installed vLLM, imported
    python -m tools.upstream --src DIR          # DIR holds a vllm/ package's sources (not imported)
    python -m tools.upstream --wheel 0.33.0     # that release's x86_64 wheel from PyPI, sources only
    (each: [--patches [DIR]] also applies the upstream patches, DIR or the checkout's patches/, in order to a copy;
    [-q] prints only what broke)

Each touch point gets one line, OK / CHANGED: what / MISSING (with the file and
line where it was found, or where something of that name lives now), and the
exit status is non-zero when anything broke.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence, TextIO

from .check import CHANGED, MISSING, OK, Result
from .fetch import check_patches, default_cache, fetch_sources
from .runtime import check_runtime
from .source import release_version
from .static import check_static

# The upstream diffs live in the checkout's top-level patches/ (with their index, README.md), not in the package:
# an installed wheel has none, so --patches without DIR needs a checkout (this tool runs from one).
PATCHES = Path(__file__).resolve().parents[2] / "patches"


def report(results: Sequence[Result], label: str, quiet: bool = False, out: TextIO | None = None) -> bool:
    """Print a line per touch point (only what broke when ``quiet``) and the counts; True when all are OK."""
    out = out or sys.stdout
    for result in results:
        if not quiet or not result.ok:
            print(result.line(), file=out)
    counts = {status: sum(result.status == status for result in results) for status in (OK, CHANGED, MISSING)}
    print(f"{label}: {len(results)} touch points: {counts[OK]} OK, {counts[CHANGED]} CHANGED, "
          f"{counts[MISSING]} MISSING", file=out)
    return counts[OK] == len(results)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.upstream", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--src", type=Path, help="a directory containing the vllm/ package's sources (not imported)")
    what.add_argument("--wheel", metavar="VERSION", help="download vllm==VERSION's x86_64 wheel and check its sources")
    what.add_argument("--runtime", action="store_true", help="import the installed vLLM and check it")
    parser.add_argument("--cache", type=Path, default=None, help=f"where --wheel keeps sources ({default_cache()})")
    parser.add_argument("--keep-wheel", action="store_true", help="keep the downloaded wheel in the cache")
    parser.add_argument("--patches", type=Path, nargs="?", const=PATCHES, default=None, metavar="DIR",
                        help=f"also apply DIR/[0-9]*.patch in order to a copy of the sources (DIR: {PATCHES})")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only what broke, and the summary")
    return parser


def _print_patches(root: Path, directory: Path) -> bool:
    """Apply ``directory/[0-9]*.patch`` in order to a copy of ``root``; print one line each; True when all apply.

    No diff in ``directory`` is a failure, said as such (not an empty success): the diffs are in a checkout's
    top-level ``patches/``, and an installed wheel carries none."""
    diffs = sorted(Path(directory).glob("[0-9]*.patch"))
    if not diffs:
        print(f"PATCH FAILS   no upstream diffs ([0-9]*.patch) in {directory}: they are in the checkout's "
              f"top-level patches/ (an installed wheel carries none)")
        return False
    all_apply = True
    for name, applies, message in check_patches(root, diffs):
        first_line = f": {message.splitlines()[0]}" if message else ""
        print(f"PATCH {'applies' if applies else 'FAILS  '} {name}{first_line}")
        for extra in message.splitlines()[1:6]:
            print(f"      {extra}")
        all_apply = all_apply and applies
    return all_apply


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    started = time.perf_counter()
    if args.runtime:
        import vllm

        root, label = Path(vllm.__file__).parent.parent, f"vllm {vllm.__version__} (installed, imported)"
        results = check_runtime()
    else:
        root = args.src if args.src else fetch_sources(args.wheel, args.cache, args.keep_wheel,
                                                       log=lambda message: print(message, file=sys.stderr))
        if not (Path(root) / "vllm").is_dir():
            parser.error(f"{root} has no vllm/ directory")
        label = f"vllm {release_version(Path(root))} ({root}, static)"
        results = check_static(root)
    good = report(results, label, args.quiet)
    print(f"checked in {time.perf_counter() - started:.1f}s")
    if args.patches is not None:
        good = _print_patches(root, Path(args.patches)) and good
    return 0 if good else 1
