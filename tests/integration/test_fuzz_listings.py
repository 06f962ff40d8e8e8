"""Evidence-decoder fuzz for the listings: GCE aggregated-list pages and Kubernetes list pages.

The emulators answer with generated pages (their ``rewrites`` hook replaces the body before the real
client libraries parse it), in every form the wire can carry: partial-success and zone warnings,
unreachable zones, instances or objects listed twice, ids and uids missing, empty or zero,
timestamps without an offset, names missing, continue and page tokens repeated.

The oracle, written from the API references and not from the reaper's code: a scope's listing is
complete only when every page is the documented complete form (GCE: no top-level warning, no zone
warning but "no results on this page", no unreachable zone, every instance with a name, a status, a
non-zero decimal id and an RFC 3339 creation time with an offset, no id twice, page tokens never
repeated; Kubernetes: every item with a name, a uid and an RFC 3339 creation time with an offset, no
uid twice, continue tokens never repeated). The property: whenever the oracle says incomplete, the
sweep's policy holds the scope (``inventory_incomplete``) and plans no delete there; when it says
complete, the listing is complete and holds every instance or object served.
"""

from __future__ import annotations

import base64
import itertools
import json
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from include.emulators.gce import Emulator
from include.emulators.k8s import K8sEmulator
from include.emulators.shapes import gcloud_instance, kube_pod
from reaper.config import parse_settings
from reaper.gce.clients import compute_clients
from reaper.gce.inventory import list_project
from reaper.k8s.inventory import list_cluster
from reaper.model import Evidence, Keyed, Phase, WriterRecord, incomplete_scopes
from reaper.policy import evaluate
from tests.helpers import fast_backoff
from tests.helpers.k8s import MANAGED

FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
NOW = datetime.now(UTC).timestamp()
STALE = str(int(NOW - 6 * 3600))
ZONES = ("us-east1-b", "us-east1-c")
# Tokens the emulator can decode: it reads each request's pageToken before its answer is rewritten
# (any other token is a 400, and the listing incomplete whatever the pages drawn).
PAGE_TOKENS = [base64.urlsafe_b64encode(f"offset:{n}".encode()).decode() for n in (1, 2, 3)]
CONFIG = parse_settings({"budget": {"min_stale": 1000}, "k8s": {"clusters": ["c1"]}}, "fuzz")


# --- GCE ---------------------------------------------------------------------------------------------

ids = st.one_of(
    st.integers(1, 10**18).map(str),  # documented: a decimal string
    st.integers(1, 10**18),  # a JSON number: the JSON mapping reads it the same
    st.integers(1, 10**18).map(lambda n: f"0{n}"),  # leading zeros: the same number, so the same instance
    # Absent (None), zero, empty, not decimal, beyond a uint64, not ASCII ("٧", ARABIC-INDIC DIGIT SEVEN).
    st.sampled_from(["0", 0, "", None, "abc", " 7", str(2**64), 2**64, "٧", "1_0"]),
)
created = st.one_of(
    st.just("2026-11-29T10:00:00.000-07:00"),
    st.sampled_from(["2026-11-29T10:00:00", "yesterday", "", None]),
)


@st.composite
def gce_instance(draw) -> tuple[dict[str, object], bool]:
    """An instance in some wire form, and whether that form is the documented one."""
    zone = draw(st.sampled_from(ZONES))
    inst = gcloud_instance("p", zone, draw(st.sampled_from(["vm-a", "vm-b", "vm-c", "vm-d"])), 1, "RUNNING", None, 0)
    inst["labels"] = {"ci_ephemeral": "true", "runner_manager_heartbeat": STALE}
    for field, value in (("id", draw(ids)), ("creationTimestamp", draw(created))):
        if value is None:
            del inst[field]
        else:
            inst[field] = value
    ident, stamp = inst.get("id"), inst.get("creationTimestamp")
    good = ident is not None and str(ident).isascii() and str(ident).isdigit() and 0 < int(str(ident)) < 2**64
    good = good and stamp == "2026-11-29T10:00:00.000-07:00"
    if draw(st.integers(0, 9)) == 0:
        for field in draw(st.sets(st.sampled_from(["name", "status"]), min_size=1)):
            del inst[field]
        good = False
    return inst, good


@st.composite
def gce_pages(draw) -> tuple[list[dict[str, object]], bool, int]:
    """Aggregated-list pages, whether they are the documented complete form, and how many instances they hold."""
    complete, count, seen = True, 0, set()
    pages: list[dict[str, object]] = []
    tokens = draw(st.lists(st.sampled_from(PAGE_TOKENS), max_size=2))
    complete = complete and len(set(tokens)) == len(tokens)
    for index in range(len(tokens) + 1):
        items: dict[str, object] = {}
        for zone in ZONES:
            shape = draw(st.sampled_from(["instances", "instances", "no_results", "unreachable", "other_warning"]))
            if shape == "instances":
                drawn = draw(st.lists(gce_instance(), min_size=1, max_size=3))
                items[f"zones/{zone}"] = {"instances": [i for i, _ in drawn]}
                for inst, good in drawn:
                    key = int(str(inst["id"])) if good else None  # "1", "01" and 1 are the one instance 1
                    complete = complete and good and key not in seen
                    seen.add(key)
                    count += 1
            else:
                code = {"no_results": "NO_RESULTS_ON_PAGE", "unreachable": "UNREACHABLE"}.get(shape, "DEPRECATED")
                items[f"zones/{zone}"] = {"warning": {"code": code, "message": code}}
                complete = complete and shape == "no_results"
        page: dict[str, object] = {"kind": "compute#instanceAggregatedList", "items": items}
        if draw(st.integers(0, 5)) == 0:
            page["warning"] = {"code": "PARTIAL_SUCCESS", "message": "Some results may be missing."}
            complete = False
        if draw(st.integers(0, 7)) == 0:
            page["unreachables"] = [f"projects/p/zones/{ZONES[0]}"]
            complete = False
        if index < len(tokens):
            page["nextPageToken"] = tokens[index]
        pages.append(page)
    return pages, complete, count


@pytest.fixture(scope="module")
def gce_server():
    with Emulator() as emulator:
        emulator.fleet.add_zone("p", ZONES[0])
        yield emulator, compute_clients(api_endpoint=emulator.endpoint)


@FUZZ
@given(gce_pages())
def test_gce_listing_is_complete_only_in_its_documented_form(gce_server, drawn) -> None:
    emulator, clients = gce_server
    pages, complete, count = drawn
    served = iter(pages)
    emulator.fleet.rewrites["aggregated_list"] = lambda _body: next(served)
    listing = list_project(clients, "p", {"ci_ephemeral": "true"}, fast_backoff(0), 10)
    evidence = Evidence(
        writer_health=[WriterRecord("m", "p", NOW, False)],
        incomplete=incomplete_scopes([listing]),
        swept=frozenset({("gce", "p")}),
    )
    plan = evaluate(listing.resources, evidence, CONFIG, Phase.ENFORCEMENT, datetime.now(UTC))
    if complete:
        assert listing.complete, listing.problems
        assert len(listing.resources) == count
    else:
        assert plan.scopes[0].holds == ("inventory_incomplete",), "a partial listing passed for complete"
        assert plan.deletes() == []


# --- Kubernetes ---------------------------------------------------------------------------------------


@st.composite
def k8s_pages(draw) -> tuple[list[dict[str, object]], bool, int]:
    """Pod list pages, whether they are the documented complete form, and how many Pods they hold."""
    complete, count, uids = True, 0, set()
    # Tokens the emulator can parse when they come back (its own format): the page after them is ours anyway.
    tokens = [_token(t) for t in draw(st.lists(st.sampled_from(["t1", "t2", "t3"]), max_size=2))]
    complete = complete and len(set(tokens)) == len(tokens)
    pages = []
    names = itertools.count()
    for index in range(len(tokens) + 1):
        items = []
        for _ in range(draw(st.integers(0, 3))):
            uid = draw(st.sampled_from(["u1", "u2", "u3", "u4", "", None]))
            stamp = draw(st.sampled_from(["2026-11-29T10:00:00Z", "2026-11-29T10:00:00+02:00", "2026-11-29T10:00:00"]))
            labels = {**MANAGED, "iterion.io/run-id": f"r{next(names)}"}
            pod = kube_pod(f"p{next(names)}", "ci", uid or "x", labels, 0)
            pod["metadata"] = {**pod["metadata"], "creationTimestamp": stamp}
            if uid is None:
                del pod["metadata"]["uid"]
            else:
                pod["metadata"]["uid"] = uid
            complete = complete and bool(uid) and uid not in uids and stamp != "2026-11-29T10:00:00"
            uids.add(uid)
            items.append(pod)
            count += 1
        page: dict[str, object] = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        if index < len(tokens):
            page["metadata"] = {"continue": tokens[index]}
        pages.append(page)
    return pages, complete, count


def _token(key: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"after": ["ci", key], "rv": "1"}).encode()).decode()


@pytest.fixture(scope="module")
def k8s_server():
    from kubernetes import config as kconfig

    with K8sEmulator() as emulator:
        yield emulator, kconfig.new_client_from_config_dict(emulator.kubeconfig())


@FUZZ
@given(k8s_pages())
def test_k8s_listing_is_complete_only_in_its_documented_form(k8s_server, drawn) -> None:
    emulator, api = k8s_server
    pages, complete, count = drawn
    served = iter(pages)
    emulator.cluster.rewrites["list"] = lambda body: next(served) if body["kind"] == "PodList" else body
    listing = list_cluster(api, "c1", MANAGED, fast_backoff(0), 10)
    runs = Keyed(known={o.labels["iterion.io/run-id"]: "failed" for o in listing.resources}, complete=True)
    evidence = Evidence(
        leases=Keyed(complete=True),
        runs=runs,
        incomplete=incomplete_scopes([listing]),
        swept=frozenset({("k8s", "c1")}),
    )
    plan = evaluate(listing.resources, evidence, CONFIG, Phase.ENFORCEMENT, datetime.now(UTC))
    if complete:
        assert listing.complete, listing.problems
        assert len(listing.resources) == count
    else:
        assert plan.scopes[0].holds == ("inventory_incomplete",), "a partial or odd listing passed for complete"
        assert plan.deletes() == []
