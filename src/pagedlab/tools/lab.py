"""`pagedlab lab`: the live lab as one folder a browser opens: the real core, in Pyodide, under a page of knobs.

Builds on: lessons/lab.py (the knobs, the run), lessons/lab_browser.py (what the page calls), viz/lab.html (the
page), viz/page.py (the step-through page inside it), tools/fetch_pyodide.py (Python for the browser).
Read with: chapters/05-continuous-batching.md (The live lab).

    OUT/lab.html                  the page: knobs, a prediction panel, and the step-through page in a frame
    OUT/lab/pyodide/...           Pyodide's loader, interpreter and standard library (`pagedlab fetch pyodide`)
    OUT/lab/pagedlab.zip          the pagedlab modules the lab imports, the repository's own files, unchanged
    OUT/lab/step_through.html     the step-through page, colours filled in, waiting for a trace

The modules are found, not listed: a child Python, where torch and every other compiled library refuse to import
(as in a browser tab), imports lessons/lab_browser.py and runs a small lab; the pagedlab files it loaded are the
ones shipped. A module that starts needing torch breaks the build here, not the page. The folder must be served
over HTTP (a browser fetches WebAssembly from a server, not from a file): `pagedlab lab` serves it on 127.0.0.1.
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import fields
from importlib.resources import files
from pathlib import Path

from pagedlab.lessons.lab import EVICTIONS, KNOBS, STAGES, LabOptions
from pagedlab.stages import get_preset
from pagedlab.tools.fetch_pyodide import FILES, PYODIDE, fetched_problem, pyodide_home
from pagedlab.viz.page import fill_markers, page_template

PAGE = "lab.html"  # package data beside viz/page.py
REFUSED = ("torch", "numpy", "triton", "tokenizers", "safetensors", "matplotlib", "jinja2", "tqdm", "rich",
           "transformers", "IPython")  # fmt: skip
_PROBE = """
import sys
REFUSED = set(sys.argv[1].split(","))

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ImportError(f"{name}: not in a browser tab")

sys.meta_path.insert(0, Refuse())
from pagedlab.lessons import lab_browser
lab_browser.run("num_requests=6")
lab_browser.question("num_requests=6", 2)
print("\\n".join(sorted({m.__file__ for n, m in sys.modules.items() if n.partition(".")[0] == "pagedlab"})))
"""


def lab_modules() -> list[Path]:
    """The pagedlab files the lab imports (each package's __init__.py among them), found by a child Python."""
    result = subprocess.run([sys.executable, "-c", _PROBE, ",".join(REFUSED)], capture_output=True, text=True,
                            timeout=300, check=False)  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"the lab does not run without torch: {result.stderr.strip().splitlines()[-1:]}")
    return [Path(line) for line in result.stdout.splitlines() if line]  # a path may hold spaces


def build_lab(out: str | Path) -> Path:
    """Write the lab's folder (the module docstring) into `out`; returns the page's path."""
    problem = fetched_problem()
    if problem is not None:
        raise ValueError(f"pyodide: {problem}; run `pagedlab fetch pyodide` (6.5 MB from npm) first")
    out = Path(out)
    folder = out / "lab"
    (folder / "pyodide").mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copyfile(pyodide_home() / name, folder / "pyodide" / name)
    _write_zip(folder / "pagedlab.zip", lab_modules())
    (folder / "step_through.html").write_text(page_template(), encoding="utf-8")
    page = out / PAGE
    page.write_text(render_lab_page(), encoding="utf-8")
    return page


def _write_zip(path: Path, modules: list[Path]) -> None:
    """The modules under their package paths (pagedlab/kv/paged.py), with fixed times: the same build, the same
    bytes."""
    root = Path(str(files("pagedlab"))).parent
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for module in sorted(modules):
            info = zipfile.ZipInfo(module.relative_to(root).as_posix(), date_time=(2026, 1, 1, 0, 0, 0))
            z.writestr(info, module.read_bytes(), zipfile.ZIP_DEFLATED)


def render_lab_page() -> str:
    """lab.html with what it needs to know filled in: the knobs, their defaults and choices, what each stage reads."""
    template = files("pagedlab.viz").joinpath(PAGE).read_text(encoding="utf-8")
    return fill_markers(template, {"__LAB__": json.dumps(lab_description()).replace("</", "<\\/")})


def lab_description() -> dict:
    """What the page builds its knobs from: each knob's kind, default and choices; for each stage, the knobs of
    those some stages ignore that it reads (the others are greyed out)."""
    defaults = LabOptions()
    choices = {"stage": list(STAGES), "preemption_mode": ["recompute", "swap"],
               "scheduling_policy": ["fcfs", "priority"], "eviction_policy": list(EVICTIONS)}  # fmt: skip
    reads = {s: sorted(k for k in KNOBS if k in get_preset(s).uses) + (["eviction_policy"] if s >= 4 else [])
             for s in STAGES}  # fmt: skip
    return {
        "knobs": [
            {"name": f.name, "kind": f.type, "default": getattr(defaults, f.name), "choices": choices.get(f.name)}
            for f in fields(LabOptions)
        ],  # fmt: skip
        "stage_only": reads,
        "optional": sorted({k for names in reads.values() for k in names}),
        "pyodide": PYODIDE.version,
    }


def serve_lab(folder: Path, port: int) -> None:
    """Serve `folder` on 127.0.0.1:`port` until interrupted (Ctrl-C)."""
    handler = functools.partial(_Handler, directory=str(folder))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"the lab: http://127.0.0.1:{server.server_address[1]}/{PAGE}  (Ctrl-C to stop)", flush=True)
        server.serve_forever()


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm",
                      ".mjs": "text/javascript", ".js": "text/javascript"}  # fmt: skip

    def log_message(self, *args) -> None:  # quiet: the page asks for a dozen files
        pass


def _cmd_lab(args) -> int:
    if args.html:
        page = build_lab(args.html)
        print(f"wrote {page} and {page.parent / 'lab'}/: serve the folder (`python -m http.server -d {page.parent}`"
              f" or `pagedlab lab`) and open {PAGE}")  # fmt: skip
        return 0
    with tempfile.TemporaryDirectory(prefix="pagedlab-lab-") as tmp:
        build_lab(tmp)
        serve_lab(Path(tmp), args.port)
    return 0


def trace_of_lab(args) -> int:
    """`pagedlab trace --lab KNOBS`: the lab's run on the desktop, the same trace the page makes."""
    from pagedlab.lessons.lab import LabOptions, run_lab

    if args.compare:
        raise ValueError("compare: --lab runs the lab's workload alone; compare two runs in the lab's page")
    options = LabOptions.from_fragment(args.lab)
    trace = run_lab(options)
    _write_trace(trace, args, f"pagedlab lab: stage {trace['stage']} ({trace['stage_name']}), "
                              f"{options.num_requests} requests")  # fmt: skip
    return 0


def trace_from_file(args) -> int:
    """`pagedlab trace --from run.json`: a saved trace (the desktop's or the lab's download), drawn again."""
    from pagedlab.viz.trace import load

    if args.compare:
        raise ValueError("compare: --from draws one saved trace")
    _write_trace(load(args.source), args, f"pagedlab: {Path(args.source).name}")
    return 0


def _write_trace(trace: dict, args, title: str) -> None:
    from pagedlab.viz.page import write_html
    from pagedlab.viz.trace import save

    for path in filter(None, (args.json and save(trace, args.json), args.html and write_html(trace, args.html, title))):
        print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB, {len(trace['steps'])} steps)")


def add_command(sub) -> None:
    lab = sub.add_parser(
        "lab",
        help="the live lab: the real scheduler and KV manager in a browser tab, every knob live (serves it locally)",
        description="Builds the lab's page (Pyodide and pagedlab's own core, no torch) and serves it on 127.0.0.1, "
        "or writes it into a folder with --html. Needs `pagedlab fetch pyodide` once. Open "
        "lab.html#stage=4&block_size=16 to start from other knobs.",
    )
    lab.add_argument("--html", default=None, metavar="DIR", help="write the lab's folder into DIR and exit")
    lab.add_argument("--port", type=int, default=8000, help="the port to serve on, on 127.0.0.1 (0: any free one)")
    lab.set_defaults(func=_cmd_lab)
