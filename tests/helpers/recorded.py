"""The recorded API answers of ``tests/data/recorded`` (provenance in its README), and the wrappers the tests put
around them the way the API server, ``gcloud`` and ``kubectl`` write them."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from tests.helpers import ROOT

RECORDED = ROOT / "tests" / "data" / "recorded"


def recorded(name: str) -> bytes:
    """A recorded body as it is stored, e.g. ``recorded("gce/instances-list.json")``."""
    return (RECORDED / name).read_bytes()


def recorded_object(name: str) -> dict[str, object]:
    return json.loads(recorded(name))


def utc(text: str) -> float:
    """A UTC wall-clock time (``2019-10-31 11:41:40.541``) as unix seconds, computed apart from the readers."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()


def instances_of(page: bytes) -> list[dict[str, object]]:
    """The instance resources of an aggregated page, in its order."""
    return [inst for scoped in json.loads(page)["items"].values() for inst in scoped.get("instances", [])]


def gcloud_export(instances: list[dict[str, object]]) -> bytes:
    """``gcloud compute instances list --format=json``: the list of the instance resources."""
    return json.dumps(instances, indent=2).encode()


def api_list(kind: str, *objects: dict[str, object]) -> bytes:
    """A typed list as the API server answers it: the list names the kind, its items do not."""
    items = [{k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} for obj in objects]
    body = {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}
    return json.dumps(body).encode()


def metadata_list(*objects: dict[str, object]) -> bytes:
    """A metadata-only list, as the API answers the listing's Secret requests (``as=PartialObjectMetadataList``)."""
    meta = "meta.k8s.io/v1"
    items = [{"kind": "PartialObjectMetadata", "apiVersion": meta, "metadata": obj["metadata"]} for obj in objects]
    body = {"kind": "PartialObjectMetadataList", "apiVersion": meta, "metadata": {}, "items": items}
    return json.dumps(body).encode()


def kubectl_list(*objects: dict[str, object]) -> bytes:
    """``kubectl get pods,secrets,networkpolicies -A -o json``: a ``List`` whose items each name their kind."""
    body = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": list(objects)}
    return json.dumps(body).encode()
