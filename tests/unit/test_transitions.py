"""Each resource's transitions (``reaper.transitions``): recorded where its state changed, never per sweep."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reaper.model import Evidence
from reaper.transitions import GONE, PART_SIZE, Seen, described, joined, since, split
from tests.builders import H, healthy, inst, leases, plan, runs, sandbox


def _evidence(*scopes: tuple[str, str], incomplete: frozenset[tuple[str, str]] = frozenset()) -> Evidence:
    return Evidence(
        writer_health=healthy("p1", "p2"), leases=leases(), runs=runs(), swept=frozenset(scopes), incomplete=incomplete
    )


def test_an_opted_out_vm_is_first_seen_kept_and_why_then_nothing_until_it_changes() -> None:
    vm = inst(hb_age=10 * H, labels={"reaper_keep": "true"})
    ev = _evidence(("gce", "p1"))
    found, states = since({}, plan([vm], ev), ev, "run")
    ((change,),) = [found]
    record = change.record()
    assert (record["name"], record["before"], record["state"]) == (vm.name, "", f"keep:{record['reason']}")
    assert record["action"] == "keep" and record["reason"]
    assert since(states, plan([vm], ev), ev, "run") == ([], {})  # the same keep again: nothing to write


def test_a_vm_that_leaves_a_complete_listing_is_gone_but_not_from_a_partial_one() -> None:
    a, b = inst(hb_age=60, project="p1"), inst(hb_age=60, project="p2")
    ev = _evidence(("gce", "p1"), ("gce", "p2"))
    _, states = since({}, plan([a, b], ev), ev, "run")
    partial = _evidence(("gce", "p1"), ("gce", "p2"), incomplete=frozenset({("gce", "p2")}))
    found, after = since(states, plan([], partial), partial, "run")
    assert [(c.uid, c.before, c.now) for c in found] == [(a.uid, "keep:fresh", GONE)]
    assert ("gce", "p2") not in after  # its last state stands
    unlisted = _evidence(("gce", "p1"))
    assert since(states, plan([a], unlisted), unlisted, "run") == ([], {})  # p2 not swept: left as it was


def test_a_kubernetes_object_carries_its_run_so_a_search_by_run_finds_it() -> None:
    objs = sandbox("run-7")
    ev = Evidence(leases=leases(held=["run-7"]), runs=runs({"run-7": "running"}), swept=frozenset({("k8s", "c1")}))
    found, _ = since({}, plan(objs, ev), ev, "iterion.io/run-id")
    assert {c.seen.group for c in found} == {"run-7"} and len(found) == len(objs)


def test_a_large_scope_is_split_into_parts_and_read_back_whole() -> None:
    states = {str(i): Seen("keep:fresh", f"vm-{i}", "instance", "z", "") for i in range(2 * PART_SIZE + 5)}
    docs = split("dag", ("gce", "p1"), states)
    assert len(docs) == 3 and all(len(d.states) <= PART_SIZE * 1.1 for d in docs)
    assert joined(d._asdict() for d in docs) == {("gce", "p1"): states}


def test_a_transition_reads_in_words() -> None:
    assert described({"before": "report:heartbeat_stale", "state": "keep:fresh"}) == (
        "kept (fresh), was reported (heartbeat_stale)"
    )
    assert described({"before": "", "state": GONE}) == "gone from its scope's listing, first seen"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["p1", "p2"]), st.sampled_from([60, 10 * H, None])), max_size=8),
    st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_replaying_the_states_a_sweep_leaves_finds_no_change_and_each_resource_ends_in_its_state(
    fleet: list[tuple[str, float | None]], kept: list[bool]
) -> None:
    first = [inst(project=p, hb_age=age) for p, age in fleet]
    second = [r for r, k in zip(first, kept, strict=False) if k]
    ev = _evidence(("gce", "p1"), ("gce", "p2"))
    _, states = since({}, plan(first, ev), ev, "run")
    found, after = since(states, plan(second, ev), ev, "run")
    merged = {**states, **after}
    assert since(merged, plan(second, ev), ev, "run") == ([], {})
    assert {uid for scope in merged.values() for uid in scope} == {r.uid for r in second}
    assert {c.uid for c in found if c.now == GONE} == {r.uid for r in first} - {r.uid for r in second}
