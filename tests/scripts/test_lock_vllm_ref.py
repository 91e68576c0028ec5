"""The lock of vLLM's environment (scripts/lock_vllm_ref.py): which wheels it pins, and that the committed lock pins
exactly vllm-ref.txt. The script's download from PyPI is not run here (no network)."""

from __future__ import annotations

import pytest

from scripts import lock_vllm_ref as lock


def wheel(filename: str, requires: str | None = ">=3.10", packagetype: str = "bdist_wheel", yanked: bool = False):
    """An entry of a release's files, as PyPI's JSON API gives it; its sha256 is its name's stand-in."""
    return {"filename": filename, "packagetype": packagetype, "requires_python": requires, "yanked": yanked,
            "digests": {"sha256": filename}}  # fmt: skip


def test_every_wheel_a_linux_x86_64_cpython_could_pick_is_pinned_and_no_other():
    files = [
        wheel("pkg-1.0-py3-none-any.whl"),  # every Python
        wheel("pkg-1.0-cp310-cp310-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"),  # 3.10 on glibc >= 2.17
        wheel("pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
        wheel("pkg-1.0-cp312-abi3-manylinux_2_34_x86_64.whl"),  # 3.12 and later, stable ABI
        wheel("pkg-1.0-cp313-cp313t-manylinux_2_28_x86_64.whl"),  # free-threaded: not a supported build
        wheel("pkg-1.0-cp312-cp312-musllinux_1_2_x86_64.whl"),  # musl: torch has no build there
        wheel("pkg-1.0-cp312-cp312-manylinux_2_28_aarch64.whl"),  # another machine
        wheel("pkg-1.0-cp312-cp312-win_amd64.whl"),
        wheel("pkg-1.0-cp39-cp39-manylinux_2_28_x86_64.whl"),  # a Python pagedlab does not run on
        wheel("pkg-1.0-pp310-pypy310_pp73-manylinux_2_28_x86_64.whl"),  # PyPy
        wheel("pkg-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", yanked=True),
        wheel("pkg-1.0.tar.gz", packagetype="sdist"),  # nothing is built
    ]
    hashes, missing, not_admitted = lock.pickable(files)
    assert hashes == sorted(f["filename"] for f in files[:4])
    assert missing == [] and not_admitted == []


def test_a_python_the_release_admits_but_no_wheel_serves_is_reported():
    # cp311 only, and a release that admits 3.11 and later: 3.12-3.14 find nothing (the script then writes no lock)
    hashes, missing, not_admitted = lock.pickable([wheel("p-1-cp311-cp311-manylinux_2_17_x86_64.whl", ">=3.11")])
    assert len(hashes) == 1 and missing == ["3.12", "3.13", "3.14"] and not_admitted == ["3.10"]
    assert lock.pickable([wheel("p-1.tar.gz", packagetype="sdist")])[1] == ["3.10", "3.11", "3.12", "3.13", "3.14"]
    assert lock.pickable([])[1] == ["every Python"]


def test_the_committed_lock_pins_exactly_vllm_ref():
    assert lock.check(lock.REF.read_text(), lock.LOCK.read_text()) == []
    assert lock.main(["--check"]) == 0
    locked = lock.locked_pins(lock.LOCK.read_text())
    assert len(locked) == len(lock.pins(lock.REF.read_text())) and all(hashes for _, _, hashes in locked)


def test_the_lock_is_read_back_and_a_difference_named():
    text = lock.lock_text([("a", "1.0", ["0" * 64, "1" * 64]), ("b", "2.0", ["2" * 64])], {"3.10": ["a"]})
    assert lock.locked_pins(text) == [("a", "1.0", ["0" * 64, "1" * 64]), ("b", "2.0", ["2" * 64])]
    assert "# Python 3.10 is not admitted by (Requires-Python): a" in text
    assert lock.check("a==1.0\nb==2.0\n", text) == []
    assert lock.check("a==1.1\nb==2.0\n", text) == ["not locked: a==1.1", "locked, not pinned: a==1.0"]
    assert lock.check("b==2.0\na==1.0\n", text) == ["the same pins in another order"]
    with pytest.raises(ValueError, match="is not NAME==VERSION --hash=sha256"):
        lock.locked_pins("a==1.0 \\\n    --hash=md5:00\n")
    with pytest.raises(ValueError, match="vllm-ref.txt, line 2: 'b>=2' is not NAME==VERSION"):
        lock.pins("a==1.0\nb>=2\n")
