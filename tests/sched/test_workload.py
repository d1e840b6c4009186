"""The concurrency analysis shared by recipes, mentions and batches (squad.sched.workload)."""

import math

import pytest

from squad.sched.workload import (
    Call,
    Delegate,
    Map,
    Parallel,
    Sequence,
    Stage,
    calls,
    peak_concurrency,
    peak_context,
    stages,
)

lead, sec, style, tests_ = (Call(n, 4096) for n in ("lead", "security", "style", "tests"))
big = Call("big", 8000)
small = Call("small", 500)


def names(stage: Stage) -> list[str]:
    return sorted(stage.agents)


@pytest.mark.parametrize(
    "node, count, budget",
    [
        (lead, 1, 4096),
        (Sequence((lead, sec)), 1, 4096),
        (Parallel((lead, sec, style, tests_)), 4, 16384),
        (Sequence((lead, Parallel((lead, sec, style, tests_)))), 4, 16384),
        (Map(small, count=10, limit=3), 3, 1500),
        (Map(small, count=2, limit=3), 2, 1000),
        (Map(small, count=None, limit=4), 4, 2000),
        (Map(small, count=5), 5, 2500),
        (Delegate(lead, sec), 2, 8192),
        (Delegate(lead, Parallel((sec, style))), 3, 12288),
        (Delegate(lead, Sequence((sec, style))), 2, 8192),
        # nesting: parallel inside map inside delegate
        (Delegate(lead, Map(Parallel((sec, small)), count=3)), 7, 4096 + 3 * 4596),
        # parallel of sequences: the peaks of the branches can coincide
        (Parallel((Sequence((small, big)), Sequence((sec, small)))), 2, 8000 + 4096),
        # map of a sequence: every copy may sit at the heaviest step at once
        (Map(Sequence((small, big)), limit=2), 2, 16000),
        # delegate inside delegate: both waiting mains hold their conversations
        (Delegate(lead, Delegate(sec, Parallel((style, tests_)))), 4, 16384),
    ],
)
def test_peaks(node, count, budget):
    assert peak_concurrency(node).size == count
    assert peak_context(node).budget == budget


def test_parallel_combines_count_peak_and_context_peak_separately():
    # branch A: 3 small at once, or 1 big; branch B: one small
    a = Sequence((Parallel((small, small, small)), big))
    node = Parallel((a, small))
    assert peak_concurrency(node).size == 4
    assert peak_context(node).budget == 8500


def test_sequence_timeline_labels():
    node = Sequence((lead, Parallel((lead, sec, style, tests_), label="review"), Map(small, count=5, limit=3)))
    timeline = stages(node)
    assert [s.label for s in timeline] == ["step 1", "step 2 (review)", "step 3 › ×3"]
    assert timeline[1].describe() == "step 2 (review): lead, security, style, tests"
    assert peak_concurrency(node) is timeline[1] or peak_concurrency(node) == timeline[1]


def test_delegate_main_alone_before_and_after():
    timeline = stages(Delegate(lead, Parallel((sec, style))))
    assert [s.agents for s in timeline] == [("lead",), ("lead", "security", "style"), ("lead",)]
    assert timeline[1].label == "lead waiting"


def test_unbounded_map_is_flagged_not_expanded():
    node = Map(Parallel((small, big)))
    (stage,) = stages(node)
    assert stage.calls == () and set(stage.unbounded) == {small, big}
    assert stage.size == math.inf
    assert stage.largest(3) == (big, big, big)
    assert peak_concurrency(node) == stage and peak_context(node) == stage


def test_unbounded_inside_parallel_and_finite_map():
    node = Parallel((Map(Map(small), count=3), lead))
    (stage,) = stages(node)
    assert stage.calls == (lead,) and stage.unbounded == (small,)
    assert stage.largest(3) == (lead, small, small)


@pytest.mark.parametrize("node", [Sequence(()), Parallel(()), Map(small, count=0), Map(lead, limit=0)])
def test_empty_workloads_have_no_stages(node):
    assert stages(node) == ()
    assert peak_concurrency(node) is None and peak_context(node) is None


def test_delegate_with_empty_subs_is_main_alone():
    assert [s.agents for s in stages(Delegate(lead, Parallel(())))] == [("lead",)]


def test_root_label_is_not_repeated_in_every_stage():
    timeline = stages(Sequence((lead, Parallel((sec, style), label="review")), label="pr"))
    assert [s.label for s in timeline] == ["step 1", "step 2 (review)"]


def test_calls_distinct_in_order():
    assert calls(Delegate(lead, Map(Parallel((sec, small)), count=3))) == (lead, sec, small)


def test_not_a_node():
    with pytest.raises(TypeError):
        stages("lead")  # type: ignore[arg-type]
