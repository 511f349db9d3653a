"""vLLM's own test files, taken at test time from the pinned vLLM sdist on PyPI.

vLLM's wheels do not ship ``tests/``; its sdist does. Nothing of vLLM is kept
in this repository: :func:`sdist` downloads ``vllm-<version>.tar.gz`` from
PyPI once (checking the sha256 pinned here) into the cache directory
(``$VLLM_HOGWILD_CACHE`` or ``~/.cache/vllm-hogwild``, as for the default
model), and :func:`extract` copies the named files out of it, unmodified,
into a folder the caller owns (a pytest ``tmp_path``).

Bumping vLLM: take the sdist's URL and sha256 from
``https://pypi.org/simple/vllm/`` (header ``Accept: application/vnd.pypi.simple.v1+json``).
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from vllm_hogwild.models.default import cache_dir

VLLM_VERSION = "0.32.0"
SDIST_NAME = f"vllm-{VLLM_VERSION}.tar.gz"
SDIST_URL = ("https://files.pythonhosted.org/packages/d5/df/"
             "5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/" + SDIST_NAME)
SDIST_SHA256 = "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad"
SDIST_SIZE = 44_549_956

# vLLM's scheduler unit tests and everything of vLLM's test tree they import
# (checked by unresolved_test_imports), plus vLLM's pytest configuration.
SCHEDULER_SUITE = (
    "pyproject.toml",  # [tool.pytest.ini_options]: vLLM's markers
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/core/__init__.py",
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",  # vLLM's AsyncScheduler, driven as its engine core drives it
    "tests/v1/core/utils.py",  # create_scheduler, create_requests
    "tests/v1/core/test_prefix_caching.py",  # imported by one test (make_hisparse_kv_cache_manager)
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/utils.py",  # MockKVConfig, create_model_runner_output, ...
)


def sdist_path() -> Path:
    return cache_dir() / "vllm-sources" / SDIST_NAME


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sdist(verbose: bool = True) -> Path:
    """The pinned sdist in the cache, downloaded (and verified) if missing or corrupt."""
    path = sdist_path()
    if path.is_file() and _sha256(path) == SDIST_SHA256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if verbose:
        print(f"[vllm-hogwild] downloading {SDIST_NAME} ({SDIST_SIZE / 1e6:.1f} MB) from PyPI into {path.parent} ...",
              file=sys.stderr, flush=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{SDIST_NAME}-", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(SDIST_URL, timeout=60) as response:
            while chunk := response.read(1 << 20):
                out.write(chunk)
        got = _sha256(tmp)
        if got != SDIST_SHA256:
            raise RuntimeError(f"{SDIST_URL}: sha256 {got}, expected {SDIST_SHA256}")
        tmp.replace(path)  # atomic: a partial download is never used
    except OSError as err:
        raise RuntimeError(
            f"could not download {SDIST_URL} ({err}); with no access to PyPI, put the file at {path} "
            f"(sha256 {SDIST_SHA256})"
        ) from err
    finally:
        tmp.unlink(missing_ok=True)
    return path


def extract(dest: Path, members: tuple[str, ...] = SCHEDULER_SUITE, archive: Path | None = None) -> Path:
    """Copy ``members`` (paths relative to the sdist's top folder) out of the sdist into ``dest``; returns ``dest``."""
    archive = sdist() if archive is None else archive
    prefix = f"vllm-{VLLM_VERSION}/"
    wanted = set(members)
    with tarfile.open(archive, "r:gz") as tar:
        for info in tar:  # one pass over the stream
            name = info.name[len(prefix):] if info.name.startswith(prefix) else None
            if name not in wanted or not info.isfile():
                continue
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(info)
            assert source is not None
            target.write_bytes(source.read())
            wanted.discard(name)
            if not wanted:
                break
    if wanted:
        raise RuntimeError(f"{archive.name} has no {sorted(wanted)}")
    return dest


def unresolved_test_imports(root: Path) -> list[str]:
    """Modules of vLLM's ``tests`` package that the extracted files import but that were not extracted.

    Looks at every import statement (top level or inside a function), relative
    ones included; ``from tests.a import b`` needs ``tests/a`` (``b`` may be a
    name in it).
    """
    missing = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        package = list(rel.parent.parts)  # the module's package, as a list of names
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                modules = [".".join([*base, *(node.module or "").split(".")]).strip(".")]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[0] != "tests":
                    continue
                file = root.joinpath(*parts)
                if not (file.with_suffix(".py").is_file() or (file / "__init__.py").is_file()):
                    missing.append(f"{rel}:{node.lineno}: {module}")
    return missing
