"""`pagedlab trace`: a run as a page to step through (--html) or as its trace (--json); the demo's scenario, the live
lab's workload (--lab) or a trace saved before (--from); beside another run or vLLM's scheduler (--compare).

Builds on: lessons/demo.py (the scenario), viz/page.py (the page), viz/trace.py (the format), tools/lab.py (--lab,
--from), lessons/vllm_peer.py (--compare vllm), tools/demo_settings.py (the scenario's flags).
Read with: chapters/05-continuous-batching.md, chapters/09-graduate-to-vllm.md.
"""

from __future__ import annotations

import argparse

from pagedlab.tools.demo_settings import DEMO_SETTINGS, add_demo_settings


def _cmd_trace(args: argparse.Namespace) -> int:
    from pagedlab.tools.lab import trace_from_file, trace_of_lab

    if not (args.html or args.json):
        raise ValueError("html: give --html PATH (the page), --json PATH (the trace) or both")
    if args.lab is not None or args.source is not None:
        return trace_of_lab(args) if args.lab is not None else trace_from_file(args)
    return _trace_demo(args)


def _trace_demo(args: argparse.Namespace) -> int:
    from pagedlab.lessons.demo import DemoOptions, demo_trace
    from pagedlab.viz.page import write_html
    from pagedlab.viz.trace import save

    given = {name: getattr(args, name) for name in DEMO_SETTINGS if getattr(args, name, None) is not None}
    trace = demo_trace(DemoOptions(**given, mode="log"), max_steps=args.max_steps)
    if args.json:
        print(f"wrote {save(trace, args.json)} ({len(trace['steps'])} steps)")
    if not args.html:
        return 0
    if args.compare == "vllm":
        return _trace_vllm(trace, args.html)
    if args.compare:
        from pagedlab.viz.page import _run_label, write_compare_html

        name, value = _compare_setting(args.compare)
        other = demo_trace(DemoOptions(**(given | {name: value}), mode="log"), max_steps=args.max_steps)
        runs = [(_run_label(trace), trace), (f"{_run_label(other)}: {args.compare}", other)]
        path = write_compare_html(runs, args.html, title=f"pagedlab: the demo's scenario, and with {args.compare}")
        steps = f"{len(trace['steps'])} and {len(other['steps'])} steps"
    else:
        title = f"pagedlab: stage {trace['stage']} ({trace['stage_name']}), {len(trace['requests'])} requests"
        path = write_html(trace, args.html, title=title)
        steps = f"{len(trace['steps'])} steps"
    print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB, {steps})")
    return 0


def _trace_vllm(trace: dict, path) -> int:
    """--compare vllm: the same run through vLLM 0.33.0's own scheduler, beside it (`pagedlab fetch vllm` first)."""
    from pagedlab.lessons.vllm_peer import vllm_trace
    from pagedlab.viz.compare import divergences, summary
    from pagedlab.viz.page import _run_label, _write, render_compare_html

    theirs = vllm_trace(trace)
    found = divergences(trace, theirs)
    runs = [(f"pagedlab: {_run_label(trace)}", trace), (theirs["stage_name"], theirs)]
    page = render_compare_html(runs, "pagedlab and vLLM's scheduler on the demo's scenario", found=found)
    out = _write(page, path)
    s, first = summary(found), found[0] if found else None
    verdict = "the same decisions at every step" if not found else (
        f"{len(found)} divergences, the first at step {first['step']} ({first['field']}: "
        f"{first['ledger'] or 'unexplained'}); same schedule: {'yes' if s['same_schedule'] else 'no'}")  # fmt: skip
    print(f"wrote {out} ({out.stat().st_size / 1024:.1f} KiB, {len(trace['steps'])} and {len(theirs['steps'])} "
          f"steps): {verdict}")  # fmt: skip
    return 0


def _compare_setting(text: str) -> tuple[str, object]:
    """--compare NAME=VALUE: one demo setting (DEMO_SETTINGS) changed for the second run."""
    name, sep, value = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or name not in DEMO_SETTINGS or name == "delay":
        known = ", ".join(n.replace("_", "-") for n in DEMO_SETTINGS if n != "delay")
        raise ValueError(f"compare: expected NAME=VALUE with NAME one of {known}, got {text!r}")
    kind = DEMO_SETTINGS[name][0]
    try:
        return name, kind(value)
    except ValueError:
        raise ValueError(f"compare: {name} wants {kind.__name__}, got {value!r}") from None


def add_command(sub) -> None:
    trace = sub.add_parser(
        "trace",
        help="run the demo's scenario and write a page to step through it in a browser (--html run.html)",
        description="Runs the scenario of `pagedlab demo` to the end (no live view) and writes one self-contained "
        "HTML file: queues, block tables, the KV pool, token budget and a Gantt of the run, step by step. "
        "Open run.html#step=N to start at step N. --lab runs the live lab's workload instead (`pagedlab lab`); "
        "--json writes the trace itself, which the lab's page opens, and --from draws one (the lab's download too).",
    )
    trace.add_argument("--html", default=None, metavar="PATH", help="the page to write, e.g. run.html")
    trace.add_argument("--json", default=None, metavar="PATH", help="the trace itself, as JSON (viz/trace.py)")
    trace.add_argument(
        "--lab",
        default=None,
        metavar="KNOBS",
        help="run the live lab's workload instead, on knobs written as its address says (e.g. 'stage=4&seed=3'; "
        "'' for the defaults): the page's run, step for step",
    )
    trace.add_argument(
        "--from", dest="source", default=None, metavar="JSON", help="draw a trace saved before (--json, or the lab's)"
    )
    trace.add_argument("--max-steps", type=int, default=10_000, help="give up after this many engine steps")
    trace.add_argument(
        "--compare",
        default=None,
        metavar="NAME=VALUE|vllm",
        help="also run with one setting changed (e.g. stage=prefix, preemption-mode=swap) and show both side by "
        "side; or `vllm`: the same run through vLLM 0.33.0's own scheduler (after `pagedlab fetch vllm`)",
    )
    add_demo_settings(trace, skip=("delay",))  # no live view here
    trace.set_defaults(func=_cmd_trace)
