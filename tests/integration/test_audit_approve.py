"""The sweep page's held deletes and its Approve button: a POST by the logged-in user, from this site only."""

from __future__ import annotations

import html
import json
from types import SimpleNamespace
from urllib.parse import quote, unquote, urlsplit

import pytest
from airflow.api_fastapi.core_api.security import get_user

from reaper.audit import TRIGGER_RUNS, app
from tests.integration.test_audit_view import (  # noqa: F401
    GCE,
    GCE_DAG,
    K8S_DAG,
    RUN,
    SWEEP,
    _as_reader_of,
    _decision,
    http,
    led,
)

ORIGIN = {"Origin": "http://testserver"}


@pytest.fixture
def held(led, http):  # noqa: F811
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


def test_the_sweep_page_lists_the_held_deletes_with_their_state(held) -> None:
    page = held.get(SWEEP).text
    assert 'id="approve"' in page and "fp-7" in page and "fp-8" in page
    assert 'name="item" value="p2/7@fp-7"' in page  # the one resource shown, in the state shown
    assert 'name="item" value="2"' not in page  # recorded without its state: shown, not selectable


def test_approve_records_who_what_and_comes_back_to_its_row_saying_how_to_trigger_it(held, led) -> None:  # noqa: F811
    form = {"item": ["7"], "reason": "INC-9 managers crash-looped", "expires": "4h"}
    response = held.post(f"{SWEEP}/approve", data=form, headers=ORIGIN, follow_redirects=False)
    assert response.status_code == 303
    where = urlsplit(response.headers["location"])
    (made,) = led.approvals_of({GCE_DAG}, items=True)
    assert (unquote(where.path), where.query, where.fragment) == (SWEEP, "", f"approval-{made['id']}")
    assert made["user"] == "carol" and made["reason"] == "INC-9 managers crash-looped"
    assert (made["dag_id"], made["run_id"], made["target"]) == (GCE_DAG, RUN, "gce")
    assert [(i["uid"], i["fingerprint"]) for i in made["items"]] == [("7", "fp-7")]
    assert made["expires_at"] - made["created_at"] == 4 * 3600
    # The row it comes back to: the id, and how to trigger with it (Airflow 3.3 cannot prefill its form from a
    # URL, docs/audit-view.md): the DAG's page in Airflow, the conf to paste, the CLI command.
    page = held.get(where.path).text
    row = page[page.index(f'id="approval-{made["id"]}"') :]
    row = row[: row.index("every approval of")]  # the one approval's row, up to the link after the table
    conf = json.dumps({"approval": made["id"]})
    assert f'href="/dags/{GCE_DAG}"' in row and html.escape(conf) in row
    assert html.escape(f"airflow dags trigger {GCE_DAG} --conf '{conf}'") in row and "unused" in row
    assert "carol" in row and "INC-9 managers crash-looped" in row and "fp-7" in row


def test_the_airflow_links_are_routes_of_airflow_3_ui() -> None:
    """router.tsx's ``dags/:dagId`` and ``dags/:dagId/runs/:runId``; Airflow 3.3 has no trigger route (the guessed
    ``/dags/{id}/trigger/single`` would be its error page), so nothing links there."""
    from reaper.report.views import Urls

    assert Urls.dag("reaper_gce_enforcement") == "/dags/reaper_gce_enforcement"
    assert Urls.dag("a b/c") == "/dags/a%20b%2Fc"
    assert not hasattr(Urls, "trigger")


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
def test_approve_refuses_what_it_cannot_record_safely(held, led, form, headers, status) -> None:  # noqa: F811
    assert held.post(f"{SWEEP}/approve", data=form, headers=headers, follow_redirects=False).status_code == status
    assert led.approvals_of({GCE_DAG}) == []


def test_approve_needs_the_right_to_trigger_the_dag(led) -> None:  # noqa: F811
    from fastapi.testclient import TestClient

    app.dependency_overrides.clear()
    response = TestClient(app).post(f"{SWEEP}/approve", data={"item": ["7"], "reason": "x"}, headers=ORIGIN)
    assert response.status_code in (401, 403)
    assert led.approvals_of({GCE_DAG}) == []


USED_RUN = "manual__2026-11-29T13:00:00+00:00"


def _approval(led, approval_id: str, created: float, used: bool) -> None:  # noqa: F811
    item = {"scope": "p2", "uid": "7", "fingerprint": "fp-7", "name": "runner-7", "kind": "instance", "group": ""}
    used_by = {"dag_id": GCE_DAG, "run_id": USED_RUN, "execution": 0, "lease": "t2", "at": created + 60}
    led.record_approval(
        {"id": approval_id, "target": "gce", "dag_id": GCE_DAG, "run_id": RUN, "user": "carol", "reason": "INC-9",
         "created_at": created, "expires_at": created + 3600, "items": [item], "used_by": used_by if used else None}
    )  # fmt: skip


def test_the_approvals_page_lists_each_approval_its_items_its_sweep_and_the_run_that_used_it(http, led) -> None:  # noqa: F811
    _approval(led, "apr-used", 1_764_417_600.0, used=True)  # 2025-11-29 12:00:00 UTC
    _approval(led, "apr-old", 1_764_410_400.0, used=False)  # expired unused
    page = http.get(f"/approvals/{GCE_DAG}").text
    assert page.index("apr-used") < page.index("apr-old")  # newest first
    used = page[page.index('id="approval-apr-used"') : page.index('id="approval-apr-old"')]
    assert "2025-11-29 12:00:00 UTC" in used and "2025-11-29 13:00:00 UTC" in used  # created, expires: UTC
    assert "carol" in used and "INC-9" in used and "runner-7" in used and "fp-7" in used
    assert f'href="/sweeps/{GCE_DAG}/{quote(RUN, safe="")}"' in used  # the sweep it came from
    assert f'href="/sweeps/{GCE_DAG}/{quote(USED_RUN, safe="")}"' in used and "used by" in used  # who used it
    assert "expired unused" in page[page.index('id="approval-apr-old"') :] and "airflow dags trigger" not in page
    # Linked from the overview and from the sweep it came from.
    assert f'href="/approvals/{GCE_DAG}"' in http.get("/").text
    sweep = http.get(SWEEP).text
    assert 'id="approval-apr-used"' in sweep and f'href="/approvals/{GCE_DAG}"' in sweep
    _as_reader_of(K8S_DAG)
    assert http.get(f"/approvals/{GCE_DAG}").status_code == 403


def test_a_revoked_approval_says_who_revoked_it_and_offers_no_trigger(http, led) -> None:  # noqa: F811
    import time

    from reaper.approvals import revoke

    _approval(led, "apr-live", time.time(), used=False)
    assert "airflow dags trigger" in http.get(f"/approvals/{GCE_DAG}").text  # usable: how to use it
    revoke(led, "apr-live", "dave", "INC-9 was a false alarm", time.time())
    page = http.get(f"/approvals/{GCE_DAG}").text
    row = page[page.index('id="approval-apr-live"') :]
    assert "revoked</b> by dave: INC-9 was a false alarm" in row and "airflow dags trigger" not in page


def test_the_sweep_that_used_an_approval_shows_per_item_what_came_of_it(http, led) -> None:  # noqa: F811
    results = [
        {"scope": "p2", "uid": "7", "fingerprint": "fp-7", "name": "runner-7", "kind": "instance", "state": "deleted"},
        {"scope": "p2", "uid": "8", "fingerprint": "fp-8", "name": "runner-8", "kind": "instance",
         "state": "approval_changed"},
        {"scope": "p2", "uid": "9", "fingerprint": "fp-9", "name": "runner-9", "kind": "instance",
         "state": "not_listed"},
    ]  # fmt: skip
    record = {"id": "apr-x", "user": "carol", "reason": "INC-9", "expires_at": 1_764_421_200.0, "from_run": RUN,
              "items": 3, "max_deletions": 3, "above_cap": False, "claimed": True, "results": results}  # fmt: skip
    led.summary({**GCE, "run_id": USED_RUN, "lease": "t2", "branch": "delete", "why": "", "approval": record})
    page = http.get(f"/sweeps/{GCE_DAG}/{USED_RUN}").text
    facts = page[page.index("<dt>approval</dt>") :]
    facts = facts[: facts.index("</dd>")]
    assert f'href="/approvals/{GCE_DAG}#approval-apr-x"' in facts and "carol" in facts and "INC-9" in facts
    assert f'href="/sweeps/{GCE_DAG}/{quote(RUN, safe="")}"' in facts and "2025-11-29 13:00:00 UTC" in facts
    assert "1 deleted, 1 approval_changed, 1 not_listed" in facts
    assert "changed since the review" in facts and "not listed by this sweep" in facts and "fp-8" in facts
    assert "{" not in facts  # no raw dict: every field in words
