"""The forging routes a student tried against the grader, as region bodies and workspace edits (for the tests).

Each body route is the reference's body of one stage-2 task with an attack run first in one of its functions,
or an attack alone. On the old grader each gave full marks, leaked the reference, or counted as passed; now each
task scores what an untouched copy scores (0), and the reference's text never comes back.
"""

from __future__ import annotations

import ast
import json
import shutil
import textwrap
from pathlib import Path

import pagedlab
from pagedlab.course import regions

SRC = Path(pagedlab.__file__).parent
ROOT = SRC.parents[1]
BLOCK_POOL = SRC / "kv" / "block_pool.py"
RUNNER = SRC / "worker" / "runner.py"


def region(task_id: str) -> regions.Region:
    return next(r for r in regions.find_regions(SRC) if r.task_id == task_id)


def reference_body(task_id: str) -> list[str]:
    r = region(task_id)
    return r.body(r.path.read_text().splitlines())


def code_lines(task_id: str) -> list[str]:
    """The reference body's lines of code (no docstring, no comment), stripped."""
    lines = reference_body(task_id)
    tree = ast.parse(textwrap.dedent("\n".join(lines)))
    keep = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
        keep |= {i for stmt in body for i in range(stmt.lineno - 1, stmt.end_lineno)}
    return [lines[i].split("#")[0].strip() for i in sorted(keep) if lines[i].strip()]


def stub(task_id: str) -> list[str]:
    """The body the hand-out gives: each function keeps its docstring and raises NotImplementedError."""
    r = region(task_id)
    return regions.stub_body(r.path.read_text().splitlines(), r)


def with_prelude(task_id: str, function: str | None, prelude: str, keep_rest: bool = True) -> list[str]:
    """The reference body of `task_id`, with `prelude` run first in `function` (None: in every function of the
    region), after its docstring; without `keep_rest`, the untouched stub with `prelude` as the whole body of
    `function` (an attack, no solution)."""
    lines = reference_body(task_id) if keep_rest else stub(task_id)
    tree = ast.parse(textwrap.dedent("\n".join(lines)))
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and function in (None, n.name)]
    added = textwrap.indent(textwrap.dedent(prelude).strip("\n"), " " * 8).splitlines()
    for fn in sorted(fns, key=lambda f: f.lineno, reverse=True):
        first = fn.body[0]
        at = first.end_lineno if ast.get_docstring(fn) is not None else first.lineno - 1
        end = at if keep_rest else fn.end_lineno
        lines = lines[:at] + added + lines[end:]
    return lines


def write_body(ws: Path, task_id: str, body: list[str]) -> None:
    """Replace the body of one region in the workspace's copy."""
    r = region(task_id)
    path = ws / r.path.relative_to(ROOT)
    lines = path.read_text().splitlines()
    mine = next(m for m in regions.file_regions(path, "\n".join(lines)) if m.task_id == task_id)
    lines[mine.start + 1 + mine.header : mine.end] = body
    path.write_text("\n".join(lines) + "\n")


# -- the first issue's three full-marks routes, the leak, the interrupts -------------------------------------------

MATCH_CLASS = """
match self.append:  # a class pattern reads any attribute: dunders, frames, globals
    case object(__func__=object(__globals__=g)):
        pass
builtins = g["__builtins__"]
load = builtins["__import__"] if isinstance(builtins, dict) else builtins.__import__
for o in load("gc").get_objects():  # every result the process holds, rewritten to "passed"
    if isinstance(o, dict) and o.get("outcome") in ("failed", "unknown"):
        o["outcome"] = "passed"
main = load("sys").modules["__main__"]
main.json.dumps = lambda obj, **kw: '{"case": "%s", "passed": true}' % obj.get("case", obj.get("start"))
return None
"""

PICKLE_PAYLOAD = """
import io
import pickle

class Payload:
    def __reduce__(self):
        code = "import gc\\nfor o in gc.get_objects():\\n"
        code += "    if isinstance(o, dict) and 'outcome' in o: o['outcome'] = 'passed'"
        return (exec, (code,))
"""

NP_LOAD = (
    PICKLE_PAYLOAD
    + """
import numpy as np
np.load(io.BytesIO(pickle.dumps(Payload())), allow_pickle=True)
return []
"""
)

TORCH_LOAD = (
    PICKLE_PAYLOAD
    + """
import torch
torch.load(io.BytesIO(pickle.dumps(Payload())), weights_only=False)
return None
"""
)

FORMAT_SAVETXT = """
import numpy as np
try:
    raise ValueError
except ValueError as e:
    tb = e.__traceback__
fd = None
for hops in range(16):  # str.format walks the traceback's frames to the runner's globals, as text
    frame = "0.tb_frame" + ".f_back" * hops
    try:
        if ("{" + frame + ".f_globals[__name__]}").format(tb) == "__main__":
            fd = ("{" + frame + ".f_globals[sys].argv[1]}").format(tb)
            break
    except (AttributeError, KeyError):
        break
cases = ["blocks_come_one_at_a_time", "none_when_the_pool_is_short", "a_static_batch_on_paged_blocks"]
cases += [f"seeded-{i}" for i in range(1, 5)]
for case in cases:  # forged results straight down the child's pipe
    np.savetxt(f"/dev/fd/{fd}", [[0]], fmt='{"case": "' + case + '", "obs": [%d]}')
return []
"""

FROM_FILE = f"""
import torch
data = torch.from_file({str(RUNNER)!r}, size={RUNNER.stat().st_size}, dtype=torch.uint8)
raise ValueError(bytes(data.tolist()).decode())  # the teacher's solution, as the error message
"""

KEYBOARD_INTERRUPT = "raise KeyboardInterrupt"
PYTEST_EXIT = "import pytest\npytest.exit('all passed', returncode=0)"
OS_EXIT = "import os\nos._exit(0)"
HANG = "import time\ntime.sleep(3600)"
EAT_THE_ALARM = """
import time
while True:
    try:
        time.sleep(0.05)
    except BaseException:
        pass
"""
SUBPROCESS = f"""
import subprocess
subprocess.run(["cat", {str(RUNNER)!r}], check=True, capture_output=True)
"""


def open_file(path: Path) -> str:
    return f"open({str(path)!r}).read()"


def connect(port: int) -> str:
    return f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).close()"


# -- the previous grader issue's seven routes, outside the regions -------------------------------------------------


def forge_outside_the_regions(ws: Path) -> None:
    """Replace the tests with passing ones and a conftest that turns failures into passes; src/sitecustomize.py
    (an atexit os._exit) and src/conftest.py; assignment.json says stage 1; pyproject unmarks every test; the
    package's __init__ puts the installed reference first on sys.path; block_pool.py ends by exec'ing the
    reference's own file."""
    shutil.rmtree(ws / "tests")
    (ws / "tests").mkdir()
    passing = "def test_queue_pops_from_the_head_and_appends_at_the_tail():\n    pass\n"
    (ws / "tests" / "test_block_pool.py").write_text(passing)
    (ws / "tests" / "conftest.py").write_text(
        "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
    )
    (ws / "src" / "sitecustomize.py").write_text("import atexit, os\natexit.register(lambda: os._exit(0))\n")
    (ws / "src" / "conftest.py").write_text("raise SystemExit(0)\n")
    spec = json.loads((ws / "assignment.json").read_text())
    (ws / "assignment.json").write_text(json.dumps(dict(spec, stage=1)))
    (ws / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-m nothing'\n")
    init = ws / "src" / "pagedlab" / "__init__.py"
    init.write_text(init.read_text() + f"\nimport sys\nsys.path.insert(0, {str(SRC.parent)!r})\n")
    pool = ws / "src" / "pagedlab" / "kv" / "block_pool.py"
    pool.write_text(pool.read_text() + f"\nexec(open({str(BLOCK_POOL)!r}).read())\n")


# -- issue 39's routes: the environment, the folder the grader runs in, the pipe, the other task's reference --------

FIND_FD = """
try:
    raise ValueError
except ValueError as e:
    tb = e.__traceback__
fd = None
frame = tb.tb_frame
while frame is not None:  # the child's main module keeps its result fd in sys.argv[1]
    if frame.f_globals.get("__name__") == "__main__":
        fd = int(frame.f_globals["sys"].argv[1])
        break
    frame = frame.f_back
"""


def forge_lines(cases: list[str], line: str) -> str:
    """A prelude that writes `line` (with {case} filled in) for every case straight to the child's result fd, then
    ends the child: each case's only report is the forged one."""
    return (
        FIND_FD
        + f"""
import os
for case in {cases!r}:
    os.write(fd, ({line!r}.replace("{{case}}", case) + "\\n").encode())
os._exit(0)
"""
    )


def huge_line_number(cases: list[str], text: str) -> str:
    """An error report whose line number is `text` as one big integer (the old grader printed it whole)."""
    number = int.from_bytes(text.encode(), "big")
    return forge_lines(cases, '{"case": "{case}", "error": "ValueError", "at": ["pagedlab/kv/block_pool.py", '
                       + str(number) + "]}")  # fmt: skip


def deep_nesting(cases: list[str], depth: int) -> str:
    """An observation nested `depth` deep (the old grader's json.loads raised RecursionError, and grading stopped)."""
    return forge_lines(cases, '{"case": "{case}", "obs": ' + "[" * depth + "]" * depth + "}")


SECRET_NAME = "PAGEDLAB_TEST_SECRET"
READ_ENVIRONMENTS = f"""
import glob
found = False
for path in glob.glob("/proc/*/environ"):  # the grader's environment, through a process it shares /proc with
    try:
        found |= {SECRET_NAME!r}.encode() in open(path, "rb").read()
    except OSError:
        pass
if not found:
    raise LookupError("the grader's environment is out of reach")
"""

CALL_THE_GATHER = """
import torch
from types import SimpleNamespace
from pagedlab.attention.paged import PagedAttention  # paged-gather's region: the same slot, through the table
meta = SimpleNamespace(block_size=self.config.block_size, block_table=torch.from_numpy(block_table))
rows, at = torch.from_numpy(req_idx).long(), torch.from_numpy(positions).long()
return PagedAttention.context_slots(None, meta, rows, at).numpy()
"""


def read_if_there(path: Path) -> str:
    """Behave as the reference only if `path` can be read (the task scores its points only if it can)."""
    return f"open({str(path)!r}).read()"
