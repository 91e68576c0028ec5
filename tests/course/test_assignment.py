"""Course assignments: regions are well formed; student copies fail with the task's message and keep earlier
stages working; their hand-outs point at the right lines and every link resolves; each stage has its written
problems, keyed in chapter 98; for every stage an untouched copy scores at most 10 % and the reference 100 %."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pagedlab
from pagedlab.course import assignment, grading, regions, written
from pagedlab.course.scenarios import stage_scenarios
from pagedlab.stages import STAGES

SRC = Path(pagedlab.__file__).parent

# A smoke subset of each stage's own tests: enough to see every kind of stub fail in the student's workspace.
SMOKE = {
    1: "test_regions_are_reserved_whole_and_first_fit or test_a_static_batch_runs_to_completion",
    2: "test_pool_story_allocate_free_reuse or test_blocks_come_one_at_a_time",
    3: "test_fork_shares_then_append_copies or test_n_children_share_the_prompt",
    4: "test_full_blocks_are_cached_kept_after_free or test_salted_requests_do_not_share",
    5: "test_prefill_is_chunked_by_the_budget or test_swap_preemption_keeps_progress",
    6: "test_paged_decode_matches_torch and v1-dtype0-2-2-16",
}


def test_every_region_is_well_formed_and_every_stage_has_tasks_worth_100():
    found = regions.find_regions(SRC)
    assert {r.stage for r in found} == set(STAGES)
    for r in found:
        assert r.task and len(r.task) > 20, f"{r.label}: a task hint should say what to implement"
        assert r.points > 0
    for stage in STAGES:
        assert sum(r.points for r in found if r.stage == stage) == 100
    for path in {r.path for r in found}:  # every student copy still parses, and keeps its markers
        stubbed = regions.stub_source(path.read_text(), [r for r in found if r.path == path])
        ast.parse(stubbed)
        assert [r.task_id for r in regions.file_regions(path, stubbed)] == [r.task_id for r in found if r.path == path]


def test_a_malformed_region_is_reported(tmp_path):
    (tmp_path / "bad.py").write_text('"""Stage 2: x."""\n# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n')
    with pytest.raises(ValueError, match=r"bad.py:3: a region must start with a '# TASK name \(P pts\): ...' line"):
        regions.find_regions(tmp_path)
    (tmp_path / "bad.py").write_text('"""Stage 2: x."""\n# BEGIN SOLUTION\n# TASK t (5 pts): t\nx = 1\n')
    with pytest.raises(ValueError, match="without # END SOLUTION"):
        regions.find_regions(tmp_path)
    (tmp_path / "bad.py").write_text(
        '"""Stage 2: x."""\n# BEGIN SOLUTION\n# TASK t (5 pts, color=red): t\n# END SOLUTION\n'
    )
    with pytest.raises(ValueError, match="unknown option"):
        regions.find_regions(tmp_path)


def test_a_task_line_names_its_points_stage_and_launcher():
    src = '"""Stage 1: x."""\n# BEGIN SOLUTION\n# TASK k (7 pts, stage 2, launcher=go): write\n'
    src += "# the kernel\npass\n# END SOLUTION\n"
    (r,) = regions.file_regions(Path("x.py"), src)
    assert (r.task_id, r.points, r.stage, r.launcher, r.task, r.header) == ("k", 7, 2, "go", "write the kernel", 2)


def test_stubs_keep_signatures_docstrings_and_markers():
    src = (
        '"""Stage 2: x."""\nclass A:\n    # BEGIN SOLUTION\n    # TASK well (5 pts): do it well\n'
        '    def f(self, n: int) -> int:\n        """Doc."""\n        return n + 1\n    # END SOLUTION\n'
    )
    (region,) = regions.file_regions(Path("x.py"), src)
    out = regions.stub_source(src, [region])
    assert "    # BEGIN SOLUTION\n    # TASK well (5 pts): do it well\n" in out and "    # END SOLUTION" in out
    ns: dict = {}
    exec(compile(out, "x.py", "exec"), ns)
    assert ns["A"].f.__doc__ == "Doc."
    with pytest.raises(NotImplementedError, match="TASK well: do it well"):
        ns["A"]().f(1)


def test_make_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(ValueError, match="exists and is not empty"):
        assignment.make(2, tmp_path)


def workspace_pytest(ws: Path, marker: str, keyword: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(ws / "src"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(ws)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker, "-k", keyword, "tests"]
    return subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True)


@pytest.mark.parametrize("stage", list(STAGES))
def test_student_copies_fail_with_the_task_and_earlier_stages_still_pass(stage, tmp_path):
    student = assignment.make(stage, tmp_path / "student")
    spec = json.loads((student / "assignment.json").read_text())
    assert spec["stage"] == stage and sum(t["points"] for t in spec["tasks"]) == 100
    assert all(t["tests"] for t in spec["tasks"]), "every task has tests"
    handout = (student / "HANDOUT.md").read_text()
    assert handout.startswith(f"# pagedlab assignment: stage {stage}")
    for t in spec["tasks"]:  # the hand-out names each task, its points, what it builds on, its tests
        assert f"| `{t['id']}` | {t['points']} |" in handout and t["tests"][0] in handout
    assert_lines_and_links_are_right(student, spec, handout)
    assert "Deliverable:" in handout and "## Written problems" in handout
    run = workspace_pytest(student, f"stage{stage}", SMOKE[stage])
    assert run.returncode != 0 and "NotImplementedError: TASK" in run.stdout, run.stdout[-2000:]
    if stage > 1:  # earlier stages keep their solutions: their smoke tests pass in the student copy
        run = workspace_pytest(student, f"stage{stage - 1}", SMOKE[stage - 1])
        assert run.returncode == 0, run.stdout[-2000:]
    root = regions.repo_root()
    assert reference_bodies_in(student, regions.unshipped_regions(root, stage)) == []
    assert not (student / "tests" / "course").exists()  # the grader's tests: honest solutions, mutants


def test_no_task_is_graded_within_reach_of_another_tasks_reference(tmp_path):
    """A task's tree holds the teacher's code only for the tasks its scenarios build on; every other task of its
    stage and of the later ones is a stub."""
    root = regions.repo_root()
    for stage in STAGES:
        for task, scenarios in stage_scenarios(stage).items():
            region = next(r for r in regions.stage_regions(root, stage) if r.task_id == task)
            stub = regions.stub_body(region.path.read_text().splitlines(), region)
            tree = grading.task_tree(root, tmp_path / f"{stage}-{task}", stage, task, stub)
            mine = {task, *scenarios.builds_on}
            others = [r for r in regions.unshipped_regions(root, stage) if r.task_id not in mine]
            assert reference_bodies_in(tree, others) == [], task


def reference_bodies_in(folder: Path, hearts: list) -> list[tuple[str, str]]:
    """(task, file) for every region of `hearts` whose reference code appears in a file of `folder`: in a .py
    file (or a string in it), a ```python block of a .md file or a notebook's code cell, as a function's body or a
    run of statements (compared as syntax trees: comments, docstrings and layout aside)."""
    wanted = {}
    for r in hearts:
        tree = ast.parse(textwrap.dedent("\n".join(r.body(r.path.read_text().splitlines()))) or "pass")
        for block in [fn.body for fn in tree.body if isinstance(fn, ast.FunctionDef)] or [tree.body]:
            code = _statements(block)
            if sum(not isinstance(n, ast.expr_context) for s in block for n in ast.walk(s)) >= 12:  # (not glue)
                wanted.setdefault(r.task_id, []).append(code)
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.suffix in (".py", ".md", ".ipynb") and p.is_file()):
        for source in _sources(path):
            try:
                tree = ast.parse(source)
            except SyntaxError:
                continue
            runs = [_statements(n.body) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef))]
            for task, codes in wanted.items():
                if any(_contains(run, code) for run in runs for code in codes):
                    found.append((task, str(path.relative_to(folder))))
    return found


def _statements(body: list) -> list[str]:
    docstring = body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    return [ast.dump(s) for s in body[1:] if docstring] if docstring else [ast.dump(s) for s in body]


def _contains(run: list[str], code: list[str]) -> bool:
    return bool(code) and any(run[i : i + len(code)] == code for i in range(len(run) - len(code) + 1))


def _sources(path: Path) -> list[str]:
    text = path.read_text(errors="replace")
    if path.suffix == ".py":  # the module, and any string in it that holds code (a solution kept as text)
        try:
            strings = [n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant)]
        except SyntaxError:
            strings = []
        return [text] + [textwrap.dedent(v) for v in strings if isinstance(v, str) and "\n" in v]
    if path.suffix == ".md":
        return [textwrap.dedent(block) for block in re.findall(r"```python\n(.*?)```", text, re.S)]
    cells = json.loads(text).get("cells", [])
    return ["".join(c["source"]) for c in cells if c.get("cell_type") == "code"]


def assert_lines_and_links_are_right(ws: Path, spec: dict, handout: str) -> None:
    """Each task's line is its `# BEGIN SOLUTION` in the student's (stubbed) file, with its TASK line after it;
    every relative link of the hand-out names a file of the workspace (and a line it has)."""
    for t in spec["tasks"]:
        lines = (ws / t["file"]).read_text().splitlines()
        assert lines[t["line"] - 1].strip() == regions.BEGIN and f"TASK {t['id']} " in lines[t["line"]], t
    links = re.findall(r"\]\(([^)#\s]+)(?:#L(\d+))?\)", handout)
    assert links
    for target, line in links:
        if re.match(r"[a-z]+:", target):
            continue
        assert (ws / target).is_file(), f"HANDOUT.md links {target}, not in the workspace"
        assert not line or int(line) <= len((ws / target).read_text().splitlines()), target


def test_every_stage_has_written_problems_with_points_and_an_answer_key_in_chapter_98():
    key = (Path(pagedlab.__file__).parents[2] / "chapters" / "98-assignments.md").read_text()
    key = key.split("## Written problems: answer key", 1)[1]
    for stage in STAGES:
        problems = written.WRITTEN[stage]
        assert 2 <= len(problems) <= 4 and all(p.points > 0 for p in problems)
        for p in problems:
            answer = key.split(f"**`{p.id}`**", 1)
            assert len(answer) == 2 and len(answer[1].split("**`", 1)[0].strip()) > 80, f"{p.id}: no answer in the key"
        assert "Deliverable:" in "\n".join(written.handout_section(stage))


@pytest.mark.parametrize("stage", [pytest.param(s, marks=[pytest.mark.numerics] if s == 6 else []) for s in STAGES])
def test_an_untouched_copy_scores_at_most_10_percent_and_the_reference_full_marks(stage):
    (row,) = assignment.check_stages([stage])
    assert row["max_score"] == 100 and row["reference"] == 100, row  # every scenario runs on a CPU, kernels too
    assert row["untouched"] <= row["max_score"] / 10, row


def test_grading_refuses_a_folder_that_is_not_a_workspace(tmp_path):
    with pytest.raises(ValueError, match="has no src/pagedlab"):
        grading.grade(tmp_path, 2)
