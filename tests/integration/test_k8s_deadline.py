"""Kubernetes deletes near the deadline, against a slow or throttling API server (docs/design.md §6).

The real ``kubernetes`` client against the emulator: every call between the plan and the send, and
every wait after it, stops when the run must stop; a run stopped there is left for the next sweep
(``not_attempted``), never ``failed`` or ``changed_since_plan``; a 429's ``Retry-After`` is waited
for when it fits before the deadline and refused at once when it does not; and the whole delete
call ends by its deadline plus one request timeout.
"""

from __future__ import annotations

import json
import random
import time
from typing import cast

import pytest
from kubernetes.client.exceptions import ApiException
from urllib3 import exceptions as u3exc

from reaper.config import parse_settings
from reaper.fence import SendGuard
from reaper.k8s.client import api_client_from_connection, call, retryable
from reaper.k8s.deleter import K8sDeleter, Revalidate
from reaper.k8s.inventory import list_cluster
from reaper.model import K8sObject
from reaper.retry import Backoff
from tests.helpers import fast_backoff
from tests.helpers.k8s import MANAGED, seed_run

TIMEOUT = 3.0  # k8s.request_timeout here
SLACK = 0.5  # the client's own work and the emulator's, on a shared machine
CONFIG = parse_settings({"k8s": {"delete_rate_per_cluster": 1000.0, "request_timeout": f"{TIMEOUT:g}s"}}, "test")
DEADLINE = "deadline reached: left for the next sweep"


def planned(api) -> list[K8sObject]:
    return cast(list[K8sObject], list_cluster(api, "c1", MANAGED, fast_backoff(), 10).resources)


def deleter(api, backoff: Backoff | None = None, revalidate: Revalidate | None = None) -> K8sDeleter:
    return K8sDeleter(lambda _: api, CONFIG, backoff or fast_backoff(), revalidate)


def recording_backoff(slept: list[float]) -> Backoff:
    """The tests' fast backoff, noting every wait the reaper itself makes."""

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    return Backoff(4, base=0.01, cap=0.05, sleep=sleep)


def results(outcomes) -> dict[str, str]:
    return {f"{o.kind}/{o.name}": o.result for o in outcomes}


def test_a_slow_re_read_near_the_deadline_leaves_the_run_not_attempted_and_sends_nothing(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    plan = planned(api)
    cluster.faults.slow["list_named"] = 2.0  # each object read again takes 2 s
    deadline = time.time() + 1.0
    outcomes = deleter(api).delete(plan, SendGuard(deadline=deadline))
    ended = time.time()
    assert set(results(outcomes).values()) == {"not_attempted"} and all(o.detail == DEADLINE for o in outcomes)
    assert cluster.counters["delete"] == 0 and len(cluster.objects) == 4
    # The first re-read began before the deadline and ended after it; no other one was started.
    assert cluster.counters["list_named"] == 1
    assert ended <= deadline + TIMEOUT + SLACK


def test_retries_of_a_failing_re_read_stop_at_the_deadline(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    plan = planned(api)
    cluster.faults.slow["list_named"] = 0.3
    cluster.faults.fail_next["list_named"] = ["503"] * 50
    deadline = time.time() + 2.0
    backoff = Backoff(10, base=0.2, cap=0.2, rng=random.Random(7))  # 11 tries would take about 4 s
    outcomes = deleter(api, backoff).delete(plan, SendGuard(deadline=deadline))
    ended = time.time()
    # Left for the next sweep, not "unreadable" (changed_since_plan) after the retries ran out.
    assert set(results(outcomes).values()) == {"not_attempted"}
    assert all(o.detail.startswith(DEADLINE) and "HTTP 503" in o.detail for o in outcomes)
    assert cluster.counters["delete"] == 0 and cluster.counters["list_named"] < 11
    assert ended <= deadline + TIMEOUT + SLACK


@pytest.mark.parametrize("kind", ["list_named", "delete"])
def test_a_429_is_retried_after_its_retry_after(kube, kind: str) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    plan = planned(api)
    cluster.faults.retry_after = "2"
    cluster.faults.fail_next[kind] = ["429"]
    slept: list[float] = []
    started = time.monotonic()
    outcomes = deleter(api, recording_backoff(slept)).delete(plan, SendGuard(deadline=time.time() + 30))
    took = time.monotonic() - started
    assert set(results(outcomes).values()) == {"deleted"} and cluster.names() == set()
    # The server's 2 s, not the backoff's few milliseconds, and waited by the reaper's own retry (the
    # client's hidden one would wait with no regard for the deadline).
    assert slept == [2.0] and 2.0 <= took < 2.0 + 3.0
    assert cluster.counters["delete"] == 4 + (kind == "delete")  # a delete's 429, then each once


@pytest.mark.parametrize("kind", ["list_named", "delete"])
def test_a_429_whose_retry_after_ends_past_the_deadline_stops_at_once(kube, kind: str) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    plan = planned(api)
    cluster.faults.retry_after = "20"
    cluster.faults.fail_next[kind] = ["429"]
    slept: list[float] = []
    started = time.monotonic()
    outcomes = deleter(api, recording_backoff(slept)).delete(plan, SendGuard(deadline=time.time() + 10))
    assert slept == [] and time.monotonic() - started < 2.0  # nothing slept (the server asked for 20 s)
    assert len(cluster.objects) == 4
    if kind == "list_named":  # a re-read: the run is left whole, nothing was sent
        assert set(results(outcomes).values()) == {"not_attempted"} and cluster.counters["delete"] == 0
    else:  # the Pod's delete was sent once and refused: it may not be retried, the rest waits
        pod, *rest = outcomes
        assert pod.kind == "Pod" and pod.result == "unconfirmed" and "HTTP 429" in pod.detail
        assert {o.result for o in rest} == {"not_attempted"} and cluster.counters["delete"] == 1


def test_the_evidence_is_read_again_only_when_its_readers_can_answer_in_time(kube) -> None:
    # The lease and run-store readers' own timeouts (NATS: twice 5 s; the run store: 5 s) bound the re-read
    # at 15 s: it may end at most one request timeout (3 s) after the deadline, so it starts 12 s before.
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    plan = planned(api)
    read: list[str] = []

    def revalidate(_cluster: str, run: str) -> str | None:
        read.append(run)
        return None

    outcomes = deleter(api, revalidate=revalidate).delete(plan, SendGuard(deadline=time.time() + 8))
    assert set(results(outcomes).values()) == {"not_attempted"} and read == [] and cluster.counters["delete"] == 0
    outcomes = deleter(api, revalidate=revalidate).delete(plan, SendGuard(deadline=time.time() + 30))
    assert set(results(outcomes).values()) == {"deleted"} and read == ["r1", "r1"]  # before the Pod, before the rest


def test_the_wait_for_a_terminating_pod_ends_before_the_deadline(kube) -> None:
    cluster, api, _ = kube
    seed_run(cluster, "r1")
    plan = planned(api)
    cluster.faults.pod_shutdown = 10.0  # the Pod stays terminating long after its delete
    deadline = time.time() + 1.5
    outcomes = deleter(api).delete(plan, SendGuard(deadline=deadline))
    # The polls pause before the next read only when the pause ends before the deadline.
    assert time.time() < deadline
    pod, *rest = outcomes
    assert pod.result == "terminating" and {o.result for o in rest} == {"not_attempted"}


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_one_call_is_one_request_bounded_by_its_timeout(kube, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    # urllib3 retries a read timeout of an idempotent method (GET, DELETE) three times by default: one call
    # took four timeouts and sent a DELETE four times. The clients the reaper makes send each call once.
    cluster, _, emulator = kube
    seed_run(cluster, "r1")
    extra = {"kube_config": json.dumps(emulator.kubeconfig())}
    monkeypatch.setenv("AIRFLOW_CONN_KUBE_EMULATOR", json.dumps({"conn_type": "kubernetes", "extra": extra}))
    api = api_client_from_connection("kube_emulator")
    kind = "list_named" if method == "GET" else "delete"
    cluster.faults.slow[kind] = 2.5
    query: list[tuple[str, object]] | None = (
        [("fieldSelector", "metadata.name=sandbox-r1")] if method == "GET" else None
    )
    path = "/api/v1/namespaces/ci/pods" + ("" if method == "GET" else "/sandbox-r1")
    started = time.monotonic()
    with pytest.raises(u3exc.ReadTimeoutError) as raised:
        call(api, method, path, 1.0, query)
    assert time.monotonic() - started < 1.0 + SLACK
    assert cluster.counters[kind] == 1
    assert retryable(raised.value) is True  # the reaper's own retry, guarded, decides


def test_the_emulators_429_carries_retry_after_1_as_the_api_servers_does(kube) -> None:
    cluster, api, _ = kube
    cluster.faults.fail_next["list"] = ["429"]
    with pytest.raises(ApiException) as raised:
        call(api, "GET", "/api/v1/pods", 5.0)
    assert raised.value.status == 429 and raised.value.headers["Retry-After"] == "1"
    assert retryable(raised.value) == 1.0
