"""A hypothesis property at the batch level: whatever the batch size, and in whatever order and with whatever
repetition (task retries, reordered mapped tasks) the batches run, a run's Pod goes before its Secrets and
NetworkPolicy, and none of them goes if the Pod's delete failed (docs/design.md §6).

The real ``cut_batches``, ``delete_batch`` and Kubernetes deleter run against the emulator; Pod deletes
of some runs fail, and some tries are cut short by their deadline. Only the ledger is an in-memory
stand-in (the Mongo ledger is tested against the server elsewhere), so many examples stay cheap.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from include.emulators.http import ApiError
from include.emulators.k8s import K8sEmulator
from reaper.config import parse_settings
from reaper.k8s.inventory import list_cluster
from reaper.model import K8sObject, Keyed
from reaper.records import document
from reaper.sweep.deletes import SendTerms, cut_batches, delete_batch
from reaper.sweep.targets import K8sTarget
from tests.helpers import fast_backoff
from tests.helpers.k8s import MANAGED, seed_run

IDS = {"dag_id": "d", "run_id": "r", "execution": 0, "lease": "t"}
RECORD_KEY = ("dag_id", "run_id", "execution", "lease", "target", "scope", "uid", "action")


class MemoryLedger:
    """The ledger's contract for ``delete_batch``: records upserted by their fence."""

    def __init__(self) -> None:
        self.records: dict[tuple, dict[str, object]] = {}

    def write(self, records) -> int:
        for r in map(document, records):  # encoded as the ledger encodes them
            key = tuple(r[f] for f in RECORD_KEY)
            self.records[key] = {**self.records.get(key, {}), **r}
        return len(records)

    def _find(self, action: str, uids) -> list[dict[str, object]]:
        return [r for r in self.records.values() if r["action"] == action and r["uid"] in set(uids)]

    def outcomes(self, ids, uids):
        return {(r["scope"], r["uid"]): r for r in self._find("outcome", uids)}

    def intents(self, ids, uids):
        return {(r["scope"], r["uid"]) for r in self._find("delete_intent", uids) if r.get("sent")}

    @property
    def sweep_lease(self) -> MemoryLedger:
        return self  # the sweep lease's question, answered here too

    def lease_problem(self, target: str, holder: str, token: str) -> None:
        return None


@pytest.fixture(scope="module")
def emulator():
    with K8sEmulator() as running:
        yield running


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    runs=st.integers(1, 5),
    failing=st.sets(st.integers(0, 4)),
    size=st.integers(1, 9),
    schedule=st.lists(st.tuples(st.integers(0, 20), st.booleans()), min_size=1, max_size=12),
)
def test_pod_first_whatever_the_batches_and_their_order(
    emulator, runs: int, failing: set[int], size: int, schedule
) -> None:
    config = parse_settings(
        {"k8s": {"clusters": ["c1"], "delete_rate_per_cluster": 1000.0, "pod_gone_timeout": "2s", "max_retries": 0}},
        "property",
    )
    emulator.cluster.reset()
    from kubernetes import config as kconfig

    cluster, api = emulator.cluster, kconfig.new_client_from_config_dict(emulator.kubeconfig())
    for r in range(runs):
        seed_run(cluster, f"r{r}")
    failing_pods = {f"sandbox-r{r}" for r in failing}

    def fail_pod(args: tuple[str, ...]) -> None:
        if args[1] == "pods" and args[2] in failing_pods:
            raise ApiError(500, "InternalError", "etcd leader changed")

    cluster.on("before", "delete", fail_pod, times=None)
    target = K8sTarget(config)
    target.api_for = lambda cluster: api  # type: ignore[method-assign]  # the test's stub in place of the method
    # Every run's lease absent and its run over, when read again before its delete.
    target.__dict__["_lease_source"] = SimpleNamespace(read=lambda keys: Keyed(complete=True))
    target.__dict__["runs"] = lambda keys: Keyed(known=dict.fromkeys(keys, "failed"), complete=True)
    objects = cast(list[K8sObject], list_cluster(api, "c1", MANAGED, fast_backoff(0), 10).resources)
    batches = cut_batches(objects, size, target.unit)
    ledger = MemoryLedger()
    for pick, expired in schedule:  # any batch, any number of times; some tries already out of time
        fence = SendTerms(IDS, "holder", "token", 0.0 if expired else None)
        delete_batch(ledger, target, fence, batches[pick % len(batches)])

    pods_gone: set[str] = set()
    for _, resource, _, name in cluster.deletes:
        run = name.removeprefix("sandbox-").removesuffix("-files").removesuffix("-egress-ca")
        if resource == "pods" and f"sandbox-{run}" not in failing_pods:
            pods_gone.add(run)
        elif resource != "pods":
            assert run in pods_gone, f"{resource}/{name} deleted before (or without) its run's Pod"
    for r in failing:
        if r < runs:
            assert {n for (_, _, n) in cluster.objects if f"r{r}" in n} == {
                f"sandbox-r{r}",
                f"sandbox-r{r}-egress-ca",
                f"sandbox-r{r}-files",
            }, f"run r{r}: its Pod failed, yet some of its objects were deleted"
