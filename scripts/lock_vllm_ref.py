"""The maintainer's lock of vLLM's environment: the sha256 of every file pip could install for data/vllm-ref.txt.

Builds on: nothing of the engine (a text tool).
Read with: chapters/09-graduate-to-vllm.md (Run vLLM's own scheduler), tools/fetch_vllm.py (who installs it).

`python scripts/lock_vllm_ref.py` (reads each package's metadata from PyPI's JSON API: 82 MB, 11 s):

    for each pinned requirement of src/pagedlab/data/vllm-ref.txt (NAME==VERSION):
        the release's files, from https://pypi.org/pypi/NAME/json
        keep every wheel pip could pick on Linux x86_64 (glibc) under CPython 3.10 to 3.14:
            a tag of packaging.tags for that interpreter (py3-none-any, cp312-cp312-manylinux_2_17_x86_64,
            cp38-abi3-manylinux..., ...), any manylinux glibc version; no sdist (nothing is built), no
            musllinux (torch has no musl build: pagedlab does not run there), no free-threaded build
        every one of those Pythons that the release admits (its Requires-Python) must find a wheel
    writes src/pagedlab/data/vllm-ref.lock.txt: pip's requirement format, one --hash per kept wheel

`pagedlab fetch vllm` installs from that file, `pip install --require-hashes --no-deps --only-binary=:all:`:
pip refuses any file whose hash is not listed. `--check` (no network; tests/scripts/ runs it) says whether
the lock pins exactly the requirements of vllm-ref.txt.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "src" / "pagedlab" / "data" / "vllm-ref.txt"
LOCK = REF.with_name("vllm-ref.lock.txt")
# every CPython a machine may run the fetch on: pagedlab needs >= 3.10, vLLM 0.33.0 admits < 3.15 (and >= 3.11)
PYTHONS = ((3, 10), (3, 11), (3, 12), (3, 13), (3, 14))
# every glibc a Linux x86_64 machine may have (manylinux_2_5 is manylinux1), and the legacy aliases
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(60, 4, -1)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
PYPI = "https://pypi.org/pypi/{name}/json"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def pins(text: str) -> list[tuple[str, str]]:
    """(name, version) of each requirement line of vllm-ref.txt, in order; comments and blank lines skipped."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _PIN.match(line)
        if match is None:
            raise ValueError(f"vllm-ref.txt, line {n}: {line!r} is not NAME==VERSION")
        out.append((match[1], match[2]))
    return out


def supported_tags(python: tuple[int, int]) -> set[Tag]:
    """The wheel tags pip accepts on Linux x86_64 (glibc) under CPython `python`, whatever the glibc version."""
    interpreter = f"cp{python[0]}{python[1]}"
    tags = set(cpython_tags(python, abis=[interpreter, "abi3", "none"], platforms=PLATFORMS))
    return tags | set(compatible_tags(python, interpreter, PLATFORMS))


def pickable(files: list[dict]) -> tuple[list[str], list[str], list[str]]:
    """(the sha256 of every wheel of `files` some supported Python could pick, sorted; the Pythons that the release
    admits but that find no wheel; the Pythons it does not admit). `files`: the release's entries of PyPI's JSON
    (filename, packagetype, digests, requires_python, yanked)."""
    tags = {python: supported_tags(python) for python in PYTHONS}
    hashes, served = set(), set()
    for f in files:
        if f.get("packagetype") != "bdist_wheel" or f.get("yanked"):
            continue
        _, _, _, file_tags = parse_wheel_filename(f["filename"])
        takers = {python for python, accepted in tags.items() if file_tags & accepted and _admits(f, python)}
        if takers:
            hashes.add(f["digests"]["sha256"])
            served |= takers
    admitted = {python for python in PYTHONS if any(_admits(f, python) for f in files)}
    missing = [_dotted(p) for p in sorted(admitted - served)]
    if not hashes:
        missing = missing or ["every Python"]
    return sorted(hashes), missing, [_dotted(p) for p in PYTHONS if p not in admitted]


def _dotted(python: tuple[int, int]) -> str:
    return f"{python[0]}.{python[1]}"


def _admits(f: dict, python: tuple[int, int]) -> bool:
    return SpecifierSet(f.get("requires_python") or "").contains(f"{python[0]}.{python[1]}", prereleases=True)


def release_files(name: str, version: str) -> list[dict]:
    """The files of one release, from PyPI's JSON API (the project's document: the per-version one is not served
    by every mirror)."""
    with urllib.request.urlopen(PYPI.format(name=canonicalize_name(name)), timeout=120) as response:
        meta = json.load(response)
    files = meta.get("releases", {}).get(version)
    if not files:
        raise ValueError(f"{name}=={version}: PyPI lists no files for this version")
    return files


def lock_text(locked: list[tuple[str, str, list[str]]], refused: dict[str, list[str]]) -> str:
    """The lock file: a header, then each requirement with its hashes, in vllm-ref.txt's order. `refused`: the
    Pythons some pin does not admit -> those pins."""
    lines = [
        "# Generated by scripts/lock_vllm_ref.py from vllm-ref.txt: do not edit; run the script again.",
        "# The sha256 of every wheel pip could pick for each pin on Linux x86_64 (glibc) under CPython",
        f"# {', '.join(map(_dotted, PYTHONS))}, from PyPI's JSON API. `pagedlab fetch vllm` installs this file with",
        "# pip install --require-hashes --no-deps --only-binary=:all:",
    ]
    lines += [f"# Python {p} is not admitted by (Requires-Python): {', '.join(names)}" for p, names in refused.items()]
    for name, version, hashes in locked:
        lines.append(f"{name}=={version} \\")
        lines += [f"    --hash=sha256:{h}" + (" \\" if i < len(hashes) - 1 else "") for i, h in enumerate(hashes)]
    return "\n".join(lines) + "\n"


def locked_pins(text: str) -> list[tuple[str, str, list[str]]]:
    """(name, version, hashes) of each requirement of a lock file, in order (comments skipped)."""
    out: list[tuple[str, str, list[str]]] = []
    for line in text.replace("\\\n", " ").split("\n"):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement, *options = line.split()
        match = _PIN.match(requirement)
        hashes = [o.removeprefix("--hash=sha256:") for o in options if o.startswith("--hash=sha256:")]
        if match is None or len(hashes) != len(options) or not all(_SHA256.match(h) for h in hashes) or not hashes:
            raise ValueError(f"vllm-ref.lock.txt: {line[:80]!r} is not NAME==VERSION --hash=sha256:... ...")
        out.append((match[1], match[2], hashes))
    return out


def check(ref_text: str, lock_text_: str) -> list[str]:
    """How the lock differs from vllm-ref.txt's pins (empty: it pins exactly them, in order)."""
    want = pins(ref_text)
    have = [(name, version) for name, version, _ in locked_pins(lock_text_)]
    if want == have:
        return []
    gone = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    return [f"not locked: {n}=={v}" for n, v in gone] + [f"locked, not pinned: {n}=={v}" for n, v in extra] or [
        "the same pins in another order"
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/lock_vllm_ref.py", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare the lock with vllm-ref.txt (no network)")
    args = parser.parse_args(argv)
    if args.check:
        problems = check(REF.read_text(), LOCK.read_text())
        print("\n".join(problems) or f"{LOCK.name}: pins exactly {REF.name}'s requirements")
        return 1 if problems else 0
    locked, missing, refused = [], [], {}
    for name, version in pins(REF.read_text()):
        hashes, gaps, not_admitted = pickable(release_files(name, version))
        print(f"{name}=={version}: {len(hashes)} wheels" + (f"; no wheel for Python {', '.join(gaps)}" if gaps else ""))
        missing += [f"{name}=={version}: Python {', '.join(gaps)}"] if gaps else []
        for python in not_admitted:
            refused.setdefault(python, []).append(name)
        locked.append((name, version, hashes))
    if missing:
        print("not locked: these pins have no wheel pip could pick:\n  " + "\n  ".join(missing), file=sys.stderr)
        return 1
    LOCK.write_text(lock_text(locked, refused))
    print(f"{LOCK.relative_to(ROOT)}: {len(locked)} requirements, {sum(len(h) for _, _, h in locked)} hashes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
