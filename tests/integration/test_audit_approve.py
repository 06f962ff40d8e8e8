"""The sweep page's held deletes and its Approve button: a POST by the logged-in user, from this site only."""

from __future__ import annotations

import json
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest
from airflow.api_fastapi.core_api.security import get_user

from reaper.audit import TRIGGER_RUNS, app
from tests.integration.test_audit_view import GCE, GCE_DAG, RUN, SWEEP, _decision, http, led  # noqa: F401

ORIGIN = {"Origin": "http://testserver"}


@pytest.fixture
def held(led, http):  # type: ignore[no-untyped-def]  # noqa: F811
    """Two more held deletes of p2, recorded with their labelFingerprint, and a logged-in user who may trigger."""
    facts = {"rule": "heartbeat_stale", "reason": "budget_exceeded", "resource_kind": "instance"}
    led.write(
        _decision({**GCE, "scope": "p2"}, uid, "report", name=f"runner-{uid}", fingerprint=f"fp-{uid}", **facts)
        for uid in ("7", "8")
    )
    app.dependency_overrides.update(
        {TRIGGER_RUNS: lambda: None, get_user: lambda: SimpleNamespace(get_name=lambda: "carol")}
    )
    return http


def test_the_sweep_page_lists_the_held_deletes_with_their_state(held) -> None:  # type: ignore[no-untyped-def]
    page = held.get(SWEEP).text
    assert 'id="approve"' in page and "fp-7" in page and "fp-8" in page
    assert 'name="item" value="7"' in page
    assert 'name="item" value="2"' not in page  # recorded without its state: shown, not selectable


def test_approve_records_who_what_and_opens_the_trigger_form(held, led) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    form = {"item": ["7"], "reason": "INC-9 managers crash-looped", "expires": "4h"}
    response = held.post(f"{SWEEP}/approve", data=form, headers=ORIGIN, follow_redirects=False)
    assert response.status_code == 303
    where = urlsplit(response.headers["location"])
    assert where.path == f"/dags/{GCE_DAG}/trigger/single"
    approval_id = json.loads(parse_qs(where.query)["conf"][0])["approval"]
    made = led.approval(approval_id)
    assert made["user"] == "carol" and made["reason"] == "INC-9 managers crash-looped"
    assert (made["dag_id"], made["run_id"], made["target"]) == (GCE_DAG, RUN, "gce")
    assert [(i["uid"], i["fingerprint"]) for i in made["items"]] == [("7", "fp-7")]
    assert made["expires_at"] - made["created_at"] == 4 * 3600
    assert led.approvals_of({GCE_DAG})[0]["id"] == approval_id


@pytest.mark.parametrize(
    ("form", "headers", "status"),
    [
        ({"item": ["7"], "reason": "x"}, {"Origin": "https://evil.example"}, 403),  # another site's form
        ({"item": ["7"], "reason": "x"}, {}, 403),  # no origin at all
        ({"reason": "x"}, ORIGIN, 422),  # nothing selected
        ({"item": ["7"], "reason": " "}, ORIGIN, 422),  # no reason
        ({"item": ["7"], "reason": "x", "expires": "30d"}, ORIGIN, 422),  # past the 7 d bound
        ({"item": ["2"], "reason": "x"}, ORIGIN, 422),  # recorded without its state
    ],
)
def test_approve_refuses_what_it_cannot_record_safely(held, led, form, headers, status) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    assert held.post(f"{SWEEP}/approve", data=form, headers=headers, follow_redirects=False).status_code == status
    assert led.approvals_of({GCE_DAG}) == []


def test_approve_needs_the_right_to_trigger_the_dag(led) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from fastapi.testclient import TestClient

    app.dependency_overrides.clear()
    response = TestClient(app).post(f"{SWEEP}/approve", data={"item": ["7"], "reason": "x"}, headers=ORIGIN)
    assert response.status_code in (401, 403)
    assert led.approvals_of({GCE_DAG}) == []
