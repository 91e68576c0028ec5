"""Stage 5: the waiting queues' order and each policy's victim rule (sched/queue.py, sched/policies.py)."""

import pytest

from pagedlab import SamplingParams
from pagedlab.request import Request
from pagedlab.sched.policies import POLICIES
from pagedlab.sched.queue import FCFSQueue, PriorityQueue, least_urgent, newest

pytestmark = pytest.mark.stage5


def req(rid, priority=0, arrival=0.0, parent=None):
    r = Request(rid, [2, 3], SamplingParams(max_tokens=1), 1, eos_token_ids=(1,), priority=priority,
                arrival_time=arrival, parent_id=parent, child_index=0 if parent else None)  # fmt: skip
    return r


@pytest.mark.task("victim")
def test_fcfs_preempts_the_request_admitted_last():
    running = [req("a", arrival=2.0), req("b", arrival=0.0), req("c", arrival=1.0)]
    assert newest(running).request_id == "c"  # admission order, not arrival: c was admitted last


@pytest.mark.task("victim")
def test_priority_preempts_the_least_urgent_and_breaks_ties_as_the_queue_orders():
    running = [req("b", 1, 5.0), req("a", 1, 5.0), req("z", 0, 9.0), req("c", 1, 4.0)]
    assert least_urgent(running).request_id == "b"  # (1, 5.0, "b") is the largest: a tie on arrival goes by id
    assert least_urgent(running[1:]).request_id == "a"


def test_each_policy_names_its_queue_its_victim_and_its_words():
    assert set(POLICIES) == {"fcfs", "priority"}
    fcfs, prio = POLICIES["fcfs"], POLICIES["priority"]
    assert (fcfs.queue, fcfs.victim, fcfs.uses_priority) == (FCFSQueue, newest, False)
    assert (prio.queue, prio.victim, prio.uses_priority) == (PriorityQueue, least_urgent, True)
    assert fcfs.victim_words == "the newest arrival" and prio.victim_words == "the lowest priority"
