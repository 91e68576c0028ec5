"""Stage 4: the prefix-cache side channel (lessons/side_channel.py) against the real server on 127.0.0.1, and what
per-user salts cost a trace (lessons/salting.py). Every check reads the server's counters, never a clock: a right
guess hits and a wrong one does not; with salts no attacker probe hits the victim's blocks; two salts never share
a block hash; salting never raises an infinite cache's hit ratio. The timed attack is the notebook's, printed."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedlab import SamplingParams
from pagedlab.kv.hashing import make_none_hash, update_block_hashes
from pagedlab.lessons import side_channel as sc
from pagedlab.lessons.salting import EACH, common_prefix, deal_users, salted, salting_cost
from pagedlab.lessons.traces import TRACE_BLOCK_SIZE, TraceRequest, infinite_ceiling
from pagedlab.request import Request

pytestmark = pytest.mark.stage4
BS = sc.BLOCK_SIZE


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with sc.LessonServer(sc.write_model(tmp_path_factory.mktemp("side") / "model")) as s:
        yield s


def test_a_right_guess_hits_and_a_wrong_one_does_not(server):
    form, secret = sc.Form(900), (2, 0, 3)
    victim, attacker = sc.Tenant(server), sc.Tenant(server)
    assert victim.probe(form.prompt(secret)).hit_tokens == 0  # a cold cache: the victim computes everything
    wrong, right = form.candidates(0)[1], form.candidates(0)[2]
    assert attacker.probe(form.system + wrong + [sc.NEWLINE]).hit_tokens == BS  # the system block only
    assert attacker.probe(form.system + right + [sc.NEWLINE]).hit_tokens == 2 * BS  # and the victim's name
    # one block further along the chain: the right diagnosis hits only after the right name
    diagnosis = form.candidates(1)[0]
    assert attacker.probe(form.system + wrong + diagnosis + [sc.NEWLINE]).hit_tokens == 2 * BS  # its own probe's
    assert attacker.probe(form.system + right + diagnosis + [sc.NEWLINE]).hit_tokens == 3 * BS


def test_the_counters_recover_the_whole_form_without_salts(server):
    trial = sc.run_trial(server, 901, salted=False, by_clock=False)
    assert trial.guess == list(trial.secret) and trial.correct == len(sc.FIELDS)
    assert trial.candidate_hits == trial.right_probe  # every right guess hit, and nothing else did
    assert trial.requests == sum(s + 1 for s in trial.secret)  # it stops at the hit: value + 1 probes a field


def test_with_salts_no_attacker_probe_hits_the_victims_blocks(server):
    trial = sc.run_trial(server, 902, salted=True, by_clock=False)
    assert any(trial.right_probe) and not any(trial.candidate_hits)
    assert trial.requests == len(sc.FIELDS) * len(sc.FIELDS[0][1])  # nothing hits: every candidate is probed
    # the victim still reuses its own blocks: its 4 full blocks (system and three fields) hit under its salt
    form, secret = sc.Form(902), trial.secret
    assert sc.Tenant(server, "victim-salt").probe(form.prompt(secret)).hit_tokens == 4 * BS
    assert sc.Tenant(server, "a third tenant").probe(form.prompt(secret)).hit_tokens == 0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=0, max_size=24), st.text(max_size=3), st.text(max_size=3))
def test_two_salts_never_share_a_block_hash(tokens, a, b):
    def hashes(salt):
        r = Request("r", list(tokens), SamplingParams(max_tokens=1), 1, cache_salt=salt)
        update_block_hashes(r, 4, make_none_hash(0))
        return r.block_hashes

    if a != b:
        assert not set(hashes(a)) & set(hashes(b)) and not set(hashes(a)) & set(hashes(None))
    assert hashes(a) == hashes(a)  # a tenant still shares with itself


# -- the cost on traces -------------------------------------------------------------------------------------------


def req(*ids):
    return TraceRequest(0, TRACE_BLOCK_SIZE * len(ids), 1, tuple(ids))


# Every request begins with block 0 (a system prompt); conversations are named by their block after it:
#   r0 [0 1 2]     conversation 1, first turn
#   r1 [0 1 2 3]   conversation 1, second turn: 0 1 2 hit without salts, and under its conversation's salt
#   r2 [0 4]       conversation 4: 0 hits without salts only (another user's system block)
#   r3 [0 4 5]     conversation 4, again: 0 4 hit either way
TRACE = [req(0, 1, 2), req(0, 1, 2, 3), req(0, 4), req(0, 4, 5)]


def test_salts_on_a_small_trace_worked_by_hand():
    assert common_prefix(TRACE) == 1 and common_prefix([req(1), req(2)]) == 0
    assert deal_users(TRACE, "conversation", EACH) == [1, 1, 4, 4]
    assert infinite_ceiling(TRACE) == (6, 12)  # 0 + 3 + 1 + 2
    assert infinite_ceiling(salted(TRACE, [1, 1, 4, 4])) == (5, 12)  # r2 loses the system block: 0 + 3 + 0 + 2
    assert infinite_ceiling(salted(TRACE, [0, 1, 2, 3])) == (0, 12)  # one salt per request: nothing is shared
    assert infinite_ceiling(salted(TRACE, [7, 7, 7, 7])) == (6, 12)  # one salt for all: as no salts
    rows = salting_cost(TRACE, [("conversation", 1), ("conversation", EACH), ("request", EACH)])
    assert [r.infinite_hit_ratio for r in rows] == [6 / 12, 5 / 12, 0.0]
    assert [r.lru_hit_ratio for r in rows] == [6 / 12, 5 / 12, 0.0]  # 8,192 blocks: nothing is evicted


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=12), st.integers(1, 4),
       st.sampled_from(["conversation", "request"]), st.integers(0, 3))  # fmt: skip
def test_per_user_salts_never_raise_the_hit_ratio(paths, users, by, seed):
    # a random tree of prompts: a request's ids are the path of digits it takes, each prefix its own id
    ids: dict[tuple, int] = {}
    trace = [req(*(ids.setdefault(tuple(p[: i + 1]), len(ids)) for i in range(len(p)))) for p in paths]
    plain, _ = infinite_ceiling(trace)
    hits, blocks = infinite_ceiling(salted(trace, deal_users(trace, by, users, seed)))
    assert hits <= plain and blocks == sum(len(r.hash_ids) for r in trace)
    if users == 1:
        assert hits == plain
