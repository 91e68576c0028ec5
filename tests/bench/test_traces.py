"""`pagedlab bench traces`: the sweep's plan, its rows, the tables and figure drawn from them, the command line."""

import json

import pytest

from pagedlab.bench import get_bench, run_bench, save_bench_figure
from pagedlab.bench.traces import POLICIES, POOL_SIZES, Job, measure_traces, plan, run_job, start_line
from pagedlab.bench.traces_report import TABLES
from pagedlab.tools.cli import main

pytestmark = pytest.mark.stage4
FIELDS = ("trace", "policy", "index", "pool_blocks", "tier_blocks", "hit_ratio", "dead_blocks_mean", "refused")
SMALL = {"traces": ["synthetic"], "policies": ["lru", "fifo", "min"], "pool_sizes": [1024, 2048], "jobs": 1}


@pytest.fixture(scope="module")
def rows():
    return measure_traces(None, **SMALL)


def test_the_default_sweep_is_both_traces_every_policy_eight_pool_sizes():
    jobs = plan()
    assert len(POOL_SIZES) == 8 and set(POLICIES) == {"lru", "fifo", "lfu", "slru", "min"}
    assert len(jobs) == 2 * (1 + 8 * (5 + 2 + 1))  # per trace: the ceiling, then per pool size 5 + radix 2 + tier 1
    assert Job("conversation", "infinite") in jobs and Job("synthetic", "lru", "hash-chain", 512, 512) in jobs
    assert "130 replays" in start_line({}) and "2-core CPU" in start_line({})


def test_rows_have_every_field_and_the_small_sweeps_numbers(rows):
    assert [(r["policy"], r["index"], r["pool_blocks"], r["tier_blocks"]) for r in rows[:6]] == [
        ("infinite", "hash-chain", None, 0),
        ("lru", "hash-chain", 1024, 0),
        ("fifo", "hash-chain", 1024, 0),
        ("min", "hash-chain", 1024, 0),
        ("lru", "radix", 1024, 0),
        ("fifo", "radix", 1024, 0),
    ]
    for r in rows:
        assert all(field in r for field in FIELDS) and set(r) == set(rows[0]), r
        assert r["trace"] == "synthetic" and 0 <= r["hit_ratio"] <= rows[0]["hit_ratio"] and r["refused"] == 0
    by = {(r["policy"], r["index"], r["pool_blocks"], r["tier_blocks"]): r for r in rows}
    assert rows[0]["hit_ratio"] == pytest.approx(0.639604, abs=1e-6)  # the README's 64.0 %
    for pool in (1024, 2048):
        assert by["min", "hash-chain", pool, 0]["hit_ratio"] > 2 * by["lru", "hash-chain", pool, 0]["hit_ratio"]
        assert by["lru", "radix", pool, 0]["hit_ratio"] == by["lru", "hash-chain", pool, 0]["hit_ratio"]
        assert (
            by["fifo", "hash-chain", pool, 0]["dead_blocks_mean"]
            > 0
            == by["fifo", "radix", pool, 0]["dead_blocks_mean"]
        )
        tiered = by["lru", "hash-chain", pool, pool]
        assert tiered["hit_ratio"] > by["lru", "hash-chain", pool, 0]["hit_ratio"] and tiered["tier_hit_ratio"] > 0
    # an exclusive LRU tier of P behind a pool of P holds about what a pool of 2P holds (not exactly: the pool's
    # free queue also orders its blocks without a hash, the tier holds cached blocks only)
    assert by["lru", "hash-chain", 1024, 1024]["hit_ratio"] == pytest.approx(
        by["lru", "hash-chain", 2048, 0]["hit_ratio"], abs=0.005
    )


def test_the_tables_and_the_figure_draw_from_the_rows(rows, tmp_path):
    synthetic = TABLES["synthetic"].body(rows)
    assert [line[0] for line in synthetic] == ["1,024", "2,048"] and synthetic[0][-1] == "64.0 %"
    assert TABLES["conversation"].body(rows) == []  # not in this sweep
    tier = TABLES["tier"].body(rows)  # pool, then conversation's four columns (not run here), synthetic's four
    assert [line[:5] for line in tier] == [["1,024", "–", "–", "–", "–"], ["2,048", "–", "–", "–", "–"]]
    assert tier[0][-1] == synthetic[1][2] and tier[1][-1] == "–", "2P alone: the LRU row of 2P, where it ran"
    assert TABLES["dead"].body(rows)[0][4:] == ["0.0", synthetic_dead(rows), "0.0"]
    assert save_bench_figure(get_bench("traces"), rows, tmp_path).stat().st_size > 10_000


def synthetic_dead(rows):
    (fifo,) = [r for r in rows if (r["policy"], r["index"], r["pool_blocks"]) == ("fifo", "hash-chain", 1024)]
    return f"{fifo['dead_blocks_mean']:.1f}"


@pytest.mark.slow
def test_a_worker_process_gives_the_same_row():
    job = Job("synthetic", "slru", "hash-chain", 4096)
    assert measure_traces(None, ["synthetic"], ["slru"], [4096], jobs=2)[1] == run_job(job)


def test_cli_json_is_one_object(capsys, tmp_path):
    result = run_bench("traces", as_json=True, figures_dir=tmp_path, **SMALL | {"policies": ["lru"]})
    out = json.loads(capsys.readouterr().out)
    assert out == {"bench": "traces", "rows": result["rows"]}
    assert (tmp_path / "04_traces.png").exists() and (tmp_path / "04_traces.json").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "scheduler", "--trace", "synthetic"], "--trace: only traces takes it, not scheduler"),
        (["bench", "traces", "--trace", "chat"], "--trace: 'chat' is not one of conversation, synthetic"),
        (["bench", "traces", "--policies", "lru,random"], "--policies: 'random' is not one of"),
        (["bench", "traces", "--pool-sizes", "1024,lots"], "--pool-sizes: 'lots' is not a whole number"),
        (["bench", "traces", "--pool-sizes", "0"], "--pool-sizes: each must be a positive integer"),
        (["bench", "traces", "--jobs", "0"], "--jobs must be a positive integer"),
        (["bench", "traces", "--concurrency", "0"], "--concurrency must be a positive integer"),
    ],
)
def test_a_bad_option_is_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err
