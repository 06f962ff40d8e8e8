"""GCE projects by canonical id in the policy (docs/design.md §4): protection and writer health by id or number.

A project is swept by its id; ``gce.protected_projects`` and writer-health labels may name its
number. ``Evidence.resolved`` says which numbers each project is known by; where a project's number
is unknown, a number known as no project's may be its own (unknown means keep).
"""

from __future__ import annotations

import math

import pytest

from reaper.model import Evidence, Resolved, WriterRecord
from reaper.policy.projects import ProjectNames
from tests.builders import FLEETING, NOW, D, H, by_name, group, healthy, inst, plan, settings

NUMBER = "123456789012"
A = Resolved("ci-a", ("ci-a",), (NUMBER,), "projects.get")  # configured by id, its number known
A_UNNUMBERED = Resolved("ci-a", ("ci-a",), (), "as configured: an id (projects.get failed: 403)")
B = Resolved("ci-b", ("ci-b",), ("222222222222",), "projects.get")


def verdicts(protected: list[str], resolved: list[Resolved]) -> dict[str, tuple[str, ...]]:
    """Each project's holds when every project holds a VM stopped for a day (``terminated``: a delete)."""
    vms = [inst(project=r.scope, status="TERMINATED", stop_age=D) for r in resolved]
    writers = healthy(*(r.scope for r in resolved if not r.problem))
    evidence = Evidence(writer_health=writers, resolved={r.scope: r for r in resolved})
    p = plan(vms, evidence, settings(gce={"protected_projects": protected}))
    kept = {d.resource.project for d in p.decisions if d.action.value == "keep"}
    assert kept == {v.scope for v in p.scopes if "protected_scope" in v.holds}, "a protected VM was not kept"
    return {v.scope: v.holds for v in p.scopes}


def test_a_project_is_protected_by_its_id_and_by_its_number() -> None:
    assert verdicts(["ci-a"], [A, B]) == {"ci-a": ("protected_scope",), "ci-b": ()}
    assert verdicts([NUMBER], [A, B]) == {"ci-a": ("protected_scope",), "ci-b": ()}


def test_configured_by_its_number_a_project_is_protected_by_its_id() -> None:
    by_number = Resolved("ci-a", (NUMBER,), (NUMBER,), "projects.get")
    assert verdicts(["ci-a"], [by_number])["ci-a"] == ("protected_scope",)
    assert verdicts([NUMBER], [by_number])["ci-a"] == ("protected_scope",)


def test_the_verdict_names_the_number_that_protects_it() -> None:
    vm = inst(project="ci-a", status="TERMINATED", stop_age=D)
    evidence = Evidence(writer_health=healthy("ci-a"), resolved={"ci-a": A})
    (verdict,) = plan([vm], evidence, settings(gce={"protected_projects": [NUMBER]})).scopes
    assert verdict.details["protected_by"] == NUMBER


def test_a_number_known_as_another_projects_protects_only_that_one() -> None:
    assert verdicts(["222222222222"], [A_UNNUMBERED, B]) == {"ci-a": (), "ci-b": ("protected_scope",)}


def test_a_number_known_as_no_projects_protects_every_project_whose_number_is_unknown() -> None:
    # projects.get was denied for ci-a: 999... may be its number, so ci-a is kept; ci-b's number is not it.
    assert verdicts(["999999999999"], [A_UNNUMBERED, B]) == {"ci-a": ("protected_scope",), "ci-b": ()}


def test_an_offline_evaluation_knows_no_number_so_a_protected_number_protects_every_project() -> None:
    vms = [inst(project=p, status="TERMINATED", stop_age=D) for p in ("ci-a", "ci-b")]
    p = plan(vms, Evidence(writer_health=healthy("ci-a", "ci-b")), settings(gce={"protected_projects": [NUMBER]}))
    assert {v.scope: v.holds for v in p.scopes} == {"ci-a": ("protected_scope",), "ci-b": ("protected_scope",)}
    only_ids = plan(vms, Evidence(writer_health=healthy("ci-a", "ci-b")), settings(gce={"protected_projects": ["x"]}))
    assert [v.holds for v in only_ids.scopes] == [(), ()]


def test_an_unresolved_name_proves_no_number() -> None:
    # The number could not be resolved (say projects.get failed, and no page proved it): ci-a, whose own
    # number is unknown, may be that project, and stays protected.
    unresolved = Resolved(NUMBER, (NUMBER,), (), problem="projects.get failed; no instance names its id")
    assert verdicts([NUMBER], [A_UNNUMBERED, unresolved])["ci-a"] == ("protected_scope",)


def test_a_residual_group_of_a_project_protected_by_its_number_is_kept() -> None:
    config = settings(gce={"group_selector": FLEETING, "protected_projects": [NUMBER]})
    g = group("m-gone", project="ci-a")
    evidence = Evidence(reporting=frozenset(), swept=frozenset({("gce", "ci-a")}), resolved={"ci-a": A})
    assert by_name(plan([g], evidence, config))[g.name] == ("keep", None, "protected_scope")


def test_a_manager_reporting_under_the_projects_number_keeps_its_group() -> None:
    config = settings(gce={"group_selector": FLEETING})
    g = group("m-live", project="ci-a")
    evidence = Evidence(reporting=frozenset({("m-live", NUMBER)}), resolved={"ci-a": A})
    assert by_name(plan([g], evidence, config))[g.name] == ("keep", None, "manager_reporting")


def stale_vm_decision(records: list[WriterRecord], resolved: list[Resolved]) -> tuple[str, str | None, str]:
    vm = inst(project="ci-a", hb_age=5 * H)  # past the quarantine (4h): heartbeat_stale
    return by_name(plan([vm], Evidence(writer_health=records, resolved={r.scope: r for r in resolved})))[vm.name]


def test_a_writer_labelled_by_the_projects_number_is_the_projects_writer() -> None:
    failing = [WriterRecord("m1", NUMBER, NOW - 60, True)]
    assert stale_vm_decision(failing, [A]) == ("report", "heartbeat_stale", "writer_unhealthy")
    assert stale_vm_decision([WriterRecord("m1", NUMBER, NOW - 60, False)], [A])[0] == "delete"


@pytest.mark.parametrize("resolved", [[A_UNNUMBERED], []], ids=["projects.get denied", "offline"])
def test_a_writer_under_a_number_known_as_no_projects_makes_unknown_numbers_writer_health_unknown(
    resolved: list[Resolved],
) -> None:
    records = [*healthy("ci-a"), WriterRecord("m1", "999999999999", NOW - 60, False)]
    assert stale_vm_decision(records, resolved) == ("report", "heartbeat_stale", "writer_health_unknown")
    # A project whose number is known is not the stray writer's.
    numbered = Resolved("ci-a", ("ci-a",), (NUMBER,), "projects.get")
    assert stale_vm_decision(records, [numbered])[0] == "delete"


def test_project_names_map_numbers_to_ids() -> None:
    names = ProjectNames({"ci-a": A, "ci-b": B})
    assert names.canonical(NUMBER) == "ci-a" and names.canonical("ci-c") == "ci-c"
    grouped = names.writers([WriterRecord("m", NUMBER, NOW, False), WriterRecord("n", "ci-b", NOW, False)], ["ci-a"])
    assert {p: [r.manager for r in rs] for p, rs in grouped.items()} == {"ci-a": ["m"], "ci-b": ["n"]}
    stray = ProjectNames({"ci-a": A_UNNUMBERED}).writers([WriterRecord("m", "999", NOW, False)], ["ci-a"])
    assert math.isnan(stray["ci-a"][0].last_pass) and stray["999"][0].last_pass == NOW
