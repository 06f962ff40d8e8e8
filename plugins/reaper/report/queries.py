"""The audit view's reads of the ledger: a run's rows paged, filtered and sorted, a resource's history, the
overview's summaries (docs/design.md §7).

Each read is one or two round trips on an index the ledger defines (:meth:`reaper.ledger.Ledger.ensure_indexes`);
they sit here, beside the views that show them, so that the ledger keeps only what a sweep writes and reads. The
summaries are handed over typed (:class:`reaper.records.SweepSummary`), a sweep's with the plain fields no type
names (a worker's hostname, a later version's field), which its page lists too; the API returns the overview's
as stored.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple

from reaper.ledger import ONE_BATCH, ROW_ORDER
from reaper.records import SweepSummary, summary_of

if TYPE_CHECKING:
    from reaper.ledger import Ledger

HISTORY_SHOWN = 2000  # records of one resource's history that a reader gets at most
RESOURCES_FOUND = 50  # resources one search of the history shows at most (a name prefix may find thousands)
# The audit view's sort orders: a column as it names it -> the decision record's field.
ORDERS = {
    "scope": "scope",
    "kind": "resource_kind",
    "location": "location",
    "name": "name",
    "uid": "uid",
    "action": "action",
    "rule": "rule",
    "reason": "reason",
    "execution": "execution",
    "run": "group",  # a Kubernetes object's run: the rows of one run together
}
# The parts of a sweep summary no chart of the overview reads.
SUMMARY_UNCHARTED = ("kept", "hygiene", "warnings", "incomplete", "plan")


# The audit view's filters that test one field of a decision record for equality: filter -> field.
FILTERED_FIELDS = {"scope": "scope", "kind": "resource_kind", "rule": "rule", "reason": "reason", "action": "action"}


class RowFilter(NamedTuple):
    """The audit view's filters of a run's rows; each given narrows them (``name``: a name holding it, or a uid)."""

    scope: str = ""
    kind: str = ""
    rule: str = ""
    reason: str = ""
    action: str = ""
    outcome: str = ""
    name: str = ""

    def equalities(self) -> dict[str, str]:
        """The filters that are a decision record's field equal to a value, as record field -> value."""
        return {field: getattr(self, name) for name, field in FILTERED_FIELDS.items() if getattr(self, name)}

    def matches(self, record: dict[str, object]) -> bool:
        """Whether a decision record passes the filters but the outcome: the query's test, for records at hand."""
        named = not self.name or self.name in str(record.get("name", "")) or record.get("uid") == self.name
        return named and all(record.get(field) == value for field, value in self.equalities().items())


class History(NamedTuple):
    """What a search of the resource history found, newest first: decision, intent and outcome records;
    transitions; the sweeps of an Airflow run named so; whether more resources matched than are shown."""

    records: list[dict[str, object]]
    transitions: list[dict[str, object]]
    sweeps: list[dict[str, object]]
    more: bool


class Recorded(NamedTuple):
    """A summary as stored: typed, and the plain values of the fields this version has no name for."""

    summary: SweepSummary
    unknown: dict[str, str | int | float | bool]

    @classmethod
    def of(cls, doc: Mapping[str, object]) -> Recorded:
        known = SweepSummary.__struct_fields__
        plain = {k: v for k, v in doc.items() if k not in known and isinstance(v, str | int | float | bool)}
        return cls(summary_of(doc), plain)


class AuditQueries:
    """The audit view's reads, over the ledger's collections; reads only."""

    def __init__(self, ledger: Ledger) -> None:
        self.records, self.sweeps, self.transitions = ledger.records, ledger.sweeps, ledger.transitions

    def executions(self, dag_id: str, run_id: str) -> list[Recorded]:
        """Every execution's summary of one DAG run, the census included, oldest first."""
        found = self.sweeps.find({"dag_id": dag_id, "run_id": run_id}, {"_id": 0}).sort("at", 1)
        return [Recorded.of(doc) for doc in found]

    def timeline(self, dag_ids: Collection[str], since: datetime) -> list[dict[str, object]]:
        """The summaries of these DAGs since ``since``, oldest first: what the overview charts.

        One round trip on the ``timeline`` index; without the parts no chart reads.
        """
        query = {"dag_id": {"$in": sorted(dag_ids)}, "at": {"$gte": since}}
        cursor = self.sweeps.find(query, {"_id": 0, **dict.fromkeys(SUMMARY_UNCHARTED, 0)}, batch_size=ONE_BATCH)
        return list(cursor.sort("at", 1))

    def decision_page(
        self, dag_id: str, run_id: str, filters: RowFilter, order: str = "scope", skip: int = 0, limit: int = 50
    ) -> tuple[list[dict[str, object]], int]:
        """One page of a DAG run's decision records (all its executions) and how many match in all.

        ``order`` is a key of :data:`ORDERS` (``-`` first for descending). Two round trips on the
        ``sweep_rows`` index (the page and the count). With an outcome filter the outcomes are few
        (at most the sweep's deletes): their decisions are looked up by uid and paged here.
        """
        field = ORDERS[order.lstrip("-")]
        descending = order.startswith("-")
        if filters.outcome:
            found = self._with_outcome(dag_id, run_id, filters)
            found.sort(key=lambda r: tuple(str(r.get(f, "")) for f in ROW_ORDER if f != field))
            found.sort(key=lambda r: str(r.get(field, "")), reverse=descending)
            return found[skip : skip + limit], len(found)
        query = self._decision_query(dag_id, run_id, filters)
        sort = [(field, -1 if descending else 1), *((f, 1) for f in ROW_ORDER if f != field)]
        page = self.records.find(query, {"_id": 0}).sort(sort).skip(skip).limit(limit)
        return list(page), self.records.count_documents(query)

    def decisions(self, dag_id: str, run_id: str, filters: RowFilter) -> Iterable[dict[str, object]]:
        """Every decision record of a DAG run that matches ``filters``, in the default order (an export)."""
        if filters.outcome:
            return sorted(self._with_outcome(dag_id, run_id, filters), key=lambda r: [str(r.get(f)) for f in ROW_ORDER])
        sort = [(f, 1) for f in ROW_ORDER]
        return self.records.find(self._decision_query(dag_id, run_id, filters), {"_id": 0}, batch_size=ONE_BATCH).sort(
            sort
        )

    @staticmethod
    def _decision_query(dag_id: str, run_id: str, filters: RowFilter) -> dict[str, object]:
        query: dict[str, object] = {"dag_id": dag_id, "run_id": run_id, "kind": "decision", **filters.equalities()}
        if filters.name:  # literally, not as a pattern; a uid too
            query["$or"] = [{"name": {"$regex": re.escape(filters.name)}}, {"uid": filters.name}]
        return query

    def _with_outcome(self, dag_id: str, run_id: str, filters: RowFilter) -> list[dict[str, object]]:
        """The decision records of the run's resources with this outcome that match the other filters.

        Two round trips: the outcomes (on ``sweep_rows``), then their resources' records by uid alone
        (``by_uid`` answers it whole), narrowed here by :meth:`RowFilter.matches`.
        """
        outcome = {"dag_id": dag_id, "run_id": run_id, "kind": "outcome", "result": filters.outcome}
        keys = {(r.get("execution"), r.get("lease"), r["uid"]) for r in self.records.find(outcome, {"_id": 0})}
        if not keys:
            return []
        found = self.records.find({"uid": {"$in": sorted({str(uid) for _, _, uid in keys})}}, {"_id": 0})
        return [
            r
            for r in found
            if (r.get("execution"), r.get("lease"), r.get("uid")) in keys
            and (r.get("dag_id"), r.get("run_id"), r.get("kind")) == (dag_id, run_id, "decision")
            and filters.matches(r)
        ]

    def companions(self, dag_id: str, run_id: str, uids: Collection[str] | None = None) -> list[dict[str, object]]:
        """The intents and outcomes of a DAG run, of these resources only when ``uids`` is given (one page).

        A page's are looked up by uid alone (the ``by_uid`` index answers it whole; a uid is the
        same resource in every sweep, so a page's uids have few records) and narrowed here.
        """
        wanted = ("intent", "outcome")
        if uids is None:
            query: dict[str, object] = {"dag_id": dag_id, "run_id": run_id, "kind": {"$in": list(wanted)}}
            return list(self.records.find(query, {"_id": 0, "evidence": 0}, batch_size=ONE_BATCH))
        found = self.records.find({"uid": {"$in": sorted(uids)}}, {"_id": 0, "evidence": 0}, batch_size=ONE_BATCH)
        return [r for r in found if r.get("dag_id") == dag_id and r.get("run_id") == run_id and r.get("kind") in wanted]

    def history(self, term: str, dag_ids: Collection[str], limit: int = HISTORY_SHOWN) -> History:
        """What the ledger knows of the resources ``term`` finds, of these DAGs: a name or its prefix, a uid,
        a Kubernetes run's id (every object of the run), and the sweeps of an Airflow run of that id.

        At most :data:`RESOURCES_FOUND` resources: a prefix that finds more says so (``more``). Five round
        trips, each on an index (``by_name``, the transitions' ``by_name``/``by_uid``/``by_group``,
        ``by_uid`` twice, ``by_run``); the DAGs are narrowed here.
        """
        prefix = {"$regex": "^" + re.escape(term)}
        named = self.records.find({"name": prefix, "kind": "decision"}, {"_id": 0, "uid": 1}).limit(limit)
        told = self.transitions.find({"$or": [{"name": prefix}, {"uid": term}, {"group": term}]}, {"_id": 0, "uid": 1})
        found = dict.fromkeys(str(r["uid"]) for r in [*named, *told.limit(limit)])
        uids = sorted({term, *list(found)[:RESOURCES_FOUND]})
        records = self.records.find({"uid": {"$in": uids}}, {"_id": 0}, batch_size=ONE_BATCH)
        stories = self.transitions.find({"uid": {"$in": uids}}, {"_id": 0}, batch_size=ONE_BATCH)
        runs = self.sweeps.find({"run_id": term}, {"_id": 0, **dict.fromkeys(SUMMARY_UNCHARTED, 0), "census": 0})

        def newest(docs: Iterable[dict[str, object]]) -> list[dict[str, object]]:
            mine = [r for r in docs if r.get("dag_id") in dag_ids]
            return sorted(mine, key=lambda r: str(r.get("at")), reverse=True)[:limit]

        return History(newest(records), newest(stories), newest(runs.limit(limit)), len(found) > RESOURCES_FOUND)
