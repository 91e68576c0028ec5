"""Course assignments: `pagedlab assignment make N --out DIR` and `pagedlab assignment grade DIR`.

Builds on: the `# BEGIN SOLUTION` / `# END SOLUTION` regions marked in src/ (chapters/97-architecture.md, Assignments).
Read with: chapters/98-assignments.md.

A region belongs to the stage named by its module's docstring ("Stage N: ...").
In a student copy for stage N, every stage-N region is stubbed; earlier stages
keep their solutions, so the student builds on working code:

    # BEGIN SOLUTION  (marker)               def allocate(self, n):
    # TASK: allocate blocks ...        ->         \"\"\"docstring kept\"\"\"
    def allocate(self, n): ...                    raise NotImplementedError("TASK: allocate blocks ...")
    # END SOLUTION  (marker)

A region of whole functions keeps each signature and docstring; a region of
statements becomes one `raise`. Inside a `@triton.jit` body a stub cannot raise,
so the region becomes `pass` and the launcher named in `# TASK(launcher=NAME)`
raises instead (the student removes that line once the kernel is written).
Grading runs the stage's own tests (`pytest -m stageN`) against the workspace's
package, checking that the imported pagedlab really is the student's.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from pagedlab.config import STAGE_NAMES, parse_stage

BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
_TASK = re.compile(r"#\s*TASK(?:\(launcher=(\w+)\))?:\s*(.*)")
_STAGE = re.compile(r'"""Stage (\d):')
NOTEBOOKS = {
    1: "01_contiguous_static",
    2: "02_paged_blocks",
    3: "03_copy_on_write",
    4: "04_prefix_caching",
    5: "05_continuous_batching",
    6: "06_triton_kernel",
}
CHAPTERS = {
    1: "01-contiguous-static",
    2: "02-paged-blocks",
    3: "03-copy-on-write",
    4: "04-prefix-caching",
    5: "05-continuous-batching",
    6: "06-triton-kernel",
}


@dataclass
class Region:
    """One marked solution region."""

    path: Path  # the source file
    stage: int  # from the module docstring
    start: int  # line index of BEGIN (0-based)
    end: int  # line index of END
    task: str  # the hint
    launcher: str | None  # for a region inside a @triton.jit body: the launcher that raises instead

    @property
    def label(self) -> str:
        return f"{self.path.name}:{self.start + 1}"


def find_regions(src: Path) -> list[Region]:
    """Every region under `src`; malformed markers are a ValueError naming the file and line."""
    regions = []
    for path in sorted(src.rglob("*.py")):
        lines = path.read_text().splitlines()
        stage = _module_stage(path, lines)
        begin = None
        for i, line in enumerate(lines):
            if line.strip() == BEGIN:
                if begin is not None:
                    raise ValueError(f"{path}:{i + 1}: nested {BEGIN}")
                begin = i
            elif line.strip() == END:
                if begin is None:
                    raise ValueError(f"{path}:{i + 1}: {END} without {BEGIN}")
                regions.append(_region(path, stage, lines, begin, i))
                begin = None
        if begin is not None:
            raise ValueError(f"{path}:{begin + 1}: {BEGIN} without {END}")
    return regions


def _module_stage(path: Path, lines: list[str]) -> int | None:
    match = _STAGE.match(lines[0]) if lines else None
    return int(match.group(1)) if match else None


def _region(path: Path, stage: int | None, lines: list[str], begin: int, end: int) -> Region:
    match = _TASK.match(lines[begin + 1].strip()) if begin + 1 < end else None
    if match is None:
        raise ValueError(f"{path}:{begin + 2}: a region must start with a '# TASK: ...' line")
    if stage is None:
        raise ValueError(f"{path}:1: a file with solution regions needs a 'Stage N:' module docstring")
    task = match.group(2)
    for line in lines[begin + 2 : end]:  # a hint may continue on further comment lines
        if not line.strip().startswith("#"):
            break
        task += " " + line.strip().lstrip("#").strip()
    return Region(path, stage, begin, end, task, match.group(1))


def stub_source(text: str, regions: list[Region]) -> str:
    """The file's text with the given regions (all from this file) replaced by stubs."""
    lines = text.splitlines()
    launchers = {r.launcher for r in regions if r.launcher}
    for region in sorted(regions, key=lambda r: r.start, reverse=True):
        lines[region.start : region.end + 1] = _stub_lines(lines[region.start : region.end + 1], region)
    out = "\n".join(lines) + "\n"
    for name in launchers:
        task = next(r.task for r in regions if r.launcher == name)
        out = _raise_in_function(out, name, f"TASK: {task} (kernel stubbed: write it, then delete this line)")
    return out


def _stub_lines(block: list[str], region: Region) -> list[str]:
    indent = block[0][: len(block[0]) - len(block[0].lstrip())]
    hint = f"TASK: {region.task}"
    body = textwrap.dedent("\n".join(block[1:-1]))
    if region.launcher:
        return [f"{indent}# {hint}", f"{indent}pass"]
    tree = ast.parse(body)
    if all(isinstance(node, ast.FunctionDef) for node in tree.body):
        return [f"{indent}# {hint}", *_stub_functions(body, tree, indent, hint)]
    return [f"{indent}# {hint}", f"{indent}raise NotImplementedError({hint!r})"]


def _stub_functions(body: str, tree: ast.Module, indent: str, hint: str) -> list[str]:
    """Keep each function's decorators, signature and docstring; its body raises."""
    src = body.splitlines()
    out = []
    for fn in tree.body:
        first_stmt = fn.body[0]
        doc = ast.get_docstring(fn, clean=False)
        keep_to = first_stmt.end_lineno if doc is not None else first_stmt.lineno - 1
        start = min([d.lineno for d in fn.decorator_list] + [fn.lineno]) - 1
        inner = src[first_stmt.lineno - 1][: first_stmt.col_offset]
        out += [indent + line if line else line for line in src[start:keep_to]]
        out += [f"{indent}{inner}raise NotImplementedError({hint!r})", ""]
    return out[:-1]


def _raise_in_function(text: str, name: str, message: str) -> str:
    """Insert `raise NotImplementedError(message)` as the first statement of top-level function `name`."""
    tree = ast.parse(text)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = text.splitlines()
    first = fn.body[0]
    at = first.end_lineno if ast.get_docstring(fn) is not None else first.lineno - 1
    pad = " " * first.col_offset
    lines.insert(at, f"{pad}raise NotImplementedError({message!r})")
    return "\n".join(lines) + "\n"


def repo_root() -> Path:
    """The source checkout holding src/, tests/, notebooks/ and chapters/ (assignments need all four)."""
    root = Path(__file__).resolve().parents[3]
    for part in ("src", "tests", "chapters"):
        if not (root / part).is_dir():
            raise ValueError(f"assignment: needs a source checkout of pagedlab; {root / part} is missing")
    return root


def make(stage: int | str, out: str | Path, with_solutions: bool = False) -> Path:
    """Write a student workspace for `stage` into `out` (which must not exist or be empty).

    `with_solutions` keeps the regions (a teacher's copy, for checking that grading gives full marks).
    """
    number, out, root = parse_stage(stage), Path(out), repo_root()
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out: {out} exists and is not empty")
    regions = [r for r in find_regions(root / "src" / "pagedlab") if r.stage == number]
    if not regions:
        raise ValueError(f"stage: stage {number} has no solution regions")
    shutil.copytree(root / "src", out / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(root / "tests", out / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, out / name)
    for path in set() if with_solutions else {r.path for r in regions}:
        target = out / path.relative_to(root)
        target.write_text(stub_source(path.read_text(), [r for r in regions if r.path == path]))
    _copy_reading(root, out, number)
    tasks = [{"file": str(r.path.relative_to(root)), "line": r.start + 1, "task": r.task} for r in regions]
    (out / "assignment.json").write_text(
        json.dumps({"stage": number, "name": STAGE_NAMES[number], "tasks": tasks}, indent=2) + "\n"
    )
    (out / "HANDOUT.md").write_text(handout(number, tasks, root))
    return out


def _copy_reading(root: Path, out: Path, number: int) -> None:
    notebook = root / "notebooks" / f"{NOTEBOOKS[number]}.ipynb"
    if notebook.exists():
        (out / "notebooks").mkdir(exist_ok=True)
        shutil.copy(notebook, out / "notebooks" / notebook.name)
    chapter = root / "chapters" / f"{CHAPTERS[number]}.md"
    if chapter.exists():
        (out / "chapters").mkdir(exist_ok=True)
        shutil.copy(chapter, out / "chapters" / chapter.name)


def handout(number: int, tasks: list[dict], root: Path) -> str:
    """The student's README: what to implement, where, how to test, and the chapter's exercises."""
    lines = [
        f"# pagedlab assignment: stage {number} ({STAGE_NAMES[number]})",
        "",
        f"Read `chapters/{CHAPTERS[number]}.md` first. Implement every stub below: each raises",
        "`NotImplementedError` with its task until you replace it. Earlier stages are complete.",
        "",
        "| file | line | task |",
        "|---|---|---|",
    ]
    lines += [f"| `{t['file']}` | {t['line']} | {t['task']} |" for t in tasks]
    lines += [
        "",
        "Run the grading tests yourself:",
        "",
        "```bash",
        f"PYTHONPATH=src python -m pytest -q -m stage{number} tests",
        "```",
        "",
        "and, from the same environment, `pagedlab assignment grade .` for the score.",
    ]
    chapter = root / "chapters" / f"{CHAPTERS[number]}.md"
    if chapter.exists() and "## Exercises" in chapter.read_text():
        lines += ["", "## Exercises (from the chapter)", "", chapter.read_text().split("## Exercises", 1)[1].strip()]
    return "\n".join(lines) + "\n"


# Points per passing test, by test file (a test group); files not listed give 1 point per test.
POINTS_PER_TEST = {"test_equivalence.py": 3, "test_stage3.py": 2, "test_stage4.py": 2, "test_stage6.py": 3}


def grade(workspace: str | Path, extra_tests: str | Path | None = None, pytest_args: list[str] = ()) -> dict:
    """Run the stage's tests against the workspace's own package; Gradescope-shaped results."""
    ws = Path(workspace).resolve()
    try:
        number = int(json.loads((ws / "assignment.json").read_text())["stage"])
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{ws / 'assignment.json'}: not an assignment workspace ({e})") from None
    env = _grading_env(ws)
    _check_student_package(ws, env)
    cases = _run_pytest(ws, env, ["-m", f"stage{number}", str(ws / "tests"), *pytest_args])
    if extra_tests is not None:
        cases += _run_pytest(ws, env, [str(Path(extra_tests).resolve()), *pytest_args])
    tests = _score_groups(cases)
    score, max_score = sum(t["score"] for t in tests), sum(t["max_score"] for t in tests)
    return {"score": score, "max_score": max_score, "stage": number, "tests": tests}


def _grading_env(ws: Path) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join([str(ws / "src"), str(ws)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _check_student_package(ws: Path, env: dict) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import pagedlab; print(pagedlab.__file__)"],
        env=env,
        cwd=ws,
        capture_output=True,
        text=True,
    )
    found = Path(probe.stdout.strip() or "?").resolve()
    if probe.returncode != 0 or (ws / "src") not in found.parents:
        raise ValueError(
            f"grade: the imported pagedlab is {found}, not the workspace's {ws / 'src'} ({probe.stderr.strip()[-200:]})"
        )


def _run_pytest(ws: Path, env: dict, args: list[str]) -> list[dict]:
    """Run pytest; return one dict per test case: group (file), name, passed, output."""
    report = ws / ".grading-junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *args]
    subprocess.run(cmd, env=env, cwd=ws, capture_output=True, text=True)
    if not report.exists():
        return []
    cases = []
    for case in ET.parse(report).getroot().iter("testcase"):
        problems = [c for c in case if c.tag in ("failure", "error", "skipped")]
        text = "\n".join((c.get("message") or "")[:600] + "\n" + (c.text or "")[-1200:] for c in problems)
        group = (case.get("file") or case.get("classname", "").replace(".", "/") + ".py").split("/")[-1]
        cases.append({"group": group, "name": case.get("name"), "passed": not problems, "output": text})
    report.unlink()
    return cases


def _score_groups(cases: list[dict]) -> list[dict]:
    groups: dict[str, list[dict]] = {}
    for case in cases:
        groups.setdefault(case["group"], []).append(case)
    tests = []
    for group, members in sorted(groups.items()):
        points = POINTS_PER_TEST.get(group, 1)
        failed = [m for m in members if not m["passed"]]
        output = "\n".join(f"FAILED {m['name']}: {m['output'].strip()[:400]}" for m in failed[:5])
        tests.append(
            {
                "name": group,
                "score": points * (len(members) - len(failed)),
                "max_score": points * len(members),
                "output": output or f"{len(members)} passed",
            }
        )
    return tests


def print_grades(result: dict, out=sys.stderr) -> None:
    """A table of groups, their weight (points per test) and scores."""
    print(
        f"stage {result['stage']} ({STAGE_NAMES[result['stage']]}): {result['score']} / {result['max_score']}", file=out
    )
    print(f"{'test group':32} {'pts/test':>8} {'score':>12}", file=out)
    for t in result["tests"]:
        per = POINTS_PER_TEST.get(t["name"], 1)
        print(f"{t['name']:32} {per:>8} {t['score']:>5} / {t['max_score']:<5}", file=out)
        if t["score"] < t["max_score"]:
            print(textwrap.indent(t["output"][:800], "    "), file=out)
