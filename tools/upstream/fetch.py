"""Another release's sources (its x86_64 wheel from PyPI, cached), and the upstream patches applied to a copy."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

DEFAULT_INDEX = "https://pypi.org/simple"
DEFAULT_JSON = "https://pypi.org/pypi"
USER_AGENT = "vllm-hogwild-upstream"


def default_cache() -> Path:
    """``$VLLM_HOGWILD_UPSTREAM_CACHE``, else ``~/.cache/vllm_hogwild/upstream``."""
    env = os.environ.get("VLLM_HOGWILD_UPSTREAM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "vllm_hogwild" / "upstream"


def pick_wheel(files: Iterable[dict[str, Any]], version: str) -> dict[str, Any] | None:
    """The x86_64 Linux wheel of ``vllm==version`` among an index's files (``filename``, ``url``, ``sha256``)."""
    pattern = re.compile(rf"^vllm-{re.escape(version)}-(cp\d+)-(abi3|cp\d+)-manylinux[\w.]*_x86_64\.whl$")
    matches = [file for file in files if pattern.match(file["filename"])]
    matches.sort(key=lambda file: ("abi3" not in file["filename"], file["filename"]))
    return matches[0] if matches else None


def _http_json(url: str, accept: str = "application/json") -> tuple[Any, str]:
    """The JSON at ``url`` and the address it came from (after redirects)."""
    request = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": USER_AGENT})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response), response.geturl()


def find_wheel(version: str, index: str = DEFAULT_INDEX, json_api: str = DEFAULT_JSON) -> dict[str, Any]:
    """Where ``vllm==version``'s x86_64 wheel is: the simple API (PEP 691 JSON), else the JSON API."""
    errors = []
    try:
        data, base = _http_json(f"{index.rstrip('/')}/vllm/", "application/vnd.pypi.simple.v1+json")
        files = [{"filename": file["filename"], "url": urllib.parse.urljoin(base, file["url"]),
                  "sha256": (file.get("hashes") or {}).get("sha256")} for file in data.get("files", [])]
        found = pick_wheel(files, version)
        if found:
            return found
        errors.append(f"{index}: no x86_64 wheel for {version}")
    except Exception as error:  # noqa: BLE001 - try the other API
        errors.append(f"{index}: {error}")
    for url in (f"{json_api}/vllm/{version}/json", f"{json_api}/vllm/json"):
        try:
            data, base = _http_json(url)
            entries = data.get("urls") if url.endswith(f"{version}/json") else data.get("releases", {}).get(version)
            files = [{"filename": file["filename"], "url": urllib.parse.urljoin(base, file["url"]),
                      "sha256": (file.get("digests") or {}).get("sha256")} for file in entries or ()]
            found = pick_wheel(files, version)
            if found:
                return found
            errors.append(f"{url}: no x86_64 wheel for {version}")
        except Exception as error:  # noqa: BLE001
            errors.append(f"{url}: {error}")
    raise RuntimeError("no wheel found: " + "; ".join(errors))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _download(url: str, destination: Path, sha256: str | None, log: Callable[[str], Any]) -> None:
    """Download ``url`` to ``destination`` (kept if already there with this hash), checking the hash."""
    if destination.exists() and (sha256 is None or _sha256(destination) == sha256):
        return
    partial = destination.with_name(destination.name + ".part")
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    digest = hashlib.sha256()
    started, done = time.monotonic(), 0
    with urllib.request.urlopen(request, timeout=120) as response, open(partial, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0)
        while chunk := response.read(1 << 20):
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
    if sha256 and digest.hexdigest() != sha256:
        partial.unlink()
        raise RuntimeError(f"{url}: sha256 {digest.hexdigest()} != {sha256}")
    partial.rename(destination)
    log(f"downloaded {destination.name} ({done / 1e6:.0f} MB of {total / 1e6:.0f} MB) "
        f"in {time.monotonic() - started:.1f}s")


def _pip_download(version: str, directory: Path) -> Path:
    """``pip download`` the x86_64 wheel (pip knows the configured mirrors and proxies)."""
    subprocess.run([sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "--only-binary=:all:",
                    "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp",
                    "-d", str(directory)], check=True)
    wheels = sorted(directory.glob(f"vllm-{version}-*x86_64.whl"))
    if not wheels:
        raise RuntimeError(f"pip download found no x86_64 wheel for vllm=={version}")
    return wheels[0]


def extract_sources(wheel: Path, destination: Path) -> int:
    """Extract only ``vllm/**/*.py`` of ``wheel`` into ``destination``; return how many files."""
    staging = destination.with_name(destination.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            name = info.filename
            if not (name.startswith("vllm/") and name.endswith(".py")) or ".." in Path(name).parts:
                continue
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
            count += 1
    shutil.rmtree(destination, ignore_errors=True)
    staging.rename(destination)
    return count


def fetch_sources(version: str, cache: Path | None = None, keep_wheel: bool = False,
                  log: Callable[[str], Any] = print) -> Path:
    """``vllm==version``'s Python sources (from its x86_64 wheel), cached: the directory containing ``vllm/``."""
    cache = Path(cache) if cache else default_cache()
    destination = cache / f"vllm-{version}"
    if (destination / ".complete").is_file():
        return destination
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    try:
        info = find_wheel(version)
        wheel = wheels / info["filename"]
        log(f"fetching {info['url']}")
        _download(info["url"], wheel, info.get("sha256"), log)
        origin = {"url": info["url"], "sha256": info.get("sha256")}
    except Exception as error:  # noqa: BLE001 - pip knows mirrors and proxies
        log(f"index lookup failed ({error}); trying pip download")
        wheel = _pip_download(version, wheels)
        origin = {"url": f"pip download vllm=={version}", "sha256": _sha256(wheel)}
    count = extract_sources(wheel, destination)
    (destination / ".complete").write_text(json.dumps({**origin, "wheel": wheel.name, "files": count}) + "\n")
    log(f"extracted {count} files of vllm/ into {destination}")
    if not keep_wheel:
        wheel.unlink(missing_ok=True)
    return destination


def check_patches(root: Path | str, patches: Sequence[Path]) -> list[tuple[str, bool, str]]:
    """Apply ``patches`` in order (``git apply -p1``) to a copy of the files they touch; (name, applies, message).

    Each patch is first checked (``--check``) against the copy as the earlier patches left it.
    """
    root = Path(root)
    results = []
    with tempfile.TemporaryDirectory() as copy_directory:
        copy = Path(copy_directory)
        touched = set()
        for patch in patches:
            touched |= {line.split()[1][2:] for line in Path(patch).read_text().splitlines()
                        if line.startswith("+++ ")}
        for relative in sorted(touched):
            if (root / relative).is_file():
                (copy / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(root / relative, copy / relative)
        for patch in patches:
            patch_path = str(Path(patch).resolve())
            check = subprocess.run(["git", "apply", "--check", "-p1", patch_path], cwd=copy, capture_output=True,
                                   text=True)
            if check.returncode == 0:
                subprocess.run(["git", "apply", "-p1", patch_path], cwd=copy, check=True)
                results.append((Path(patch).name, True, ""))
            else:
                results.append((Path(patch).name, False, (check.stdout + check.stderr).strip()))
    return results
