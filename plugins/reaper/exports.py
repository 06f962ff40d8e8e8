"""Decoders for what users export from their fleet, into the policy's model.

- ``gcloud compute instances list --format=json``: a list of GCE instance resources.
- ``kubectl get pods,secrets,networkpolicies -A -o json``: a ``List`` of objects.
- Evidence files: run-store documents, held lease keys, writer-health reports.

Decoding is typed and streaming-friendly (``msgspec``): fields the rules do not
read are skipped by the parser and never become Python objects. That is what
keeps a 100,000-instance export small in memory, and it is why a Secret's
``data`` is never held: the decoder has no field to put it in.

Any problem raises :class:`InputError` naming the file, the option it came from
and the JSON path that is wrong.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import msgspec

from reaper.config import ConfigError
from reaper.model import GceInstance, K8sObject, Keyed, WriterRecord

K8S_KINDS = ("Pod", "Secret", "NetworkPolicy")


class InputError(ConfigError):
    """An input file is unreadable or not shaped as documented; nothing is evaluated."""


# --- GCE -------------------------------------------------------------------------------------


class GcloudMetadataItem(msgspec.Struct):
    """A metadata entry; only its key is read (values may be large startup scripts)."""

    key: str


class GcloudMetadata(msgspec.Struct):
    items: list[GcloudMetadataItem] = []


# The metadata key a managed instance group stamps on the instances it creates (their URL as value).
CREATED_BY = "created-by"


class GcloudInstance(msgspec.Struct):
    """The fields of a Compute API instance resource that the rules read."""

    name: str
    id: str | int
    status: str
    zone: str
    creationTimestamp: datetime
    selfLink: str = ""
    labels: dict[str, str] = {}
    lastStopTimestamp: datetime | None = None
    deletionProtection: bool = False
    metadata: GcloudMetadata | None = None


def _aware(ts: datetime, path: str) -> float:
    if ts.tzinfo is None:
        raise ValueError(f"{path}: expected an RFC 3339 timestamp with an offset, got {ts.isoformat()}")
    return ts.timestamp()


def _url_part(url: str, collection: str) -> str:
    """The path segment after ``collection`` in a Compute URL (``.../projects/P/zones/Z``)."""
    parts = url.rstrip("/").split("/")
    for i, part in enumerate(parts[:-1]):
        if part == collection:
            return parts[i + 1]
    return ""


def numeric_id(value: str | int) -> str | None:
    """A Compute resource id as the API means it, or None: ASCII digits of a number from 1 to 2**64 - 1
    (a uint64; the SDK refused the rest), written without leading zeros, so that "01" and 1 are the one
    instance 1, as the SDK read them, and the listing's duplicate check sees them as one."""
    text = str(value)
    if not (text.isascii() and text.isdigit()):
        return None
    number = int(text)
    return str(number) if 0 < number < 2**64 else None


def instance_record(
    name: str,
    instance_id: str | int,
    status: str,
    zone_url: str,
    self_link: str,
    labels: dict[str, str],
    created: float,
    last_stop: float | None,
    deletion_protection: bool = False,
    group_member: bool = False,
) -> GceInstance:
    """The one normalizer of an instance, for exports and for the Compute SDK alike.

    The project comes from ``selfLink``, else from the ``zone`` URL. An instance without a name, a
    status, or a numeric id (:func:`numeric_id`; an absent id reads as 0) cannot be re-validated or
    deleted by id: it is refused, which makes its listing incomplete.
    """
    ident = numeric_id(instance_id)
    if not name or not status or ident is None:
        raise ValueError(f"instance {name or '?'}: expected a name, a status and a numeric id, got {instance_id!r}")
    project = _url_part(self_link, "projects") or _url_part(zone_url, "projects")
    if not project:
        raise ValueError(f"instance {name}: no project in selfLink or zone URL")
    zone = _url_part(zone_url, "zones") or zone_url
    return GceInstance(
        project, zone, name, ident, status, labels, created, last_stop, deletion_protection, group_member
    )


def gce_instance(raw: GcloudInstance) -> GceInstance:
    """Normalize one decoded export instance."""
    return instance_record(
        raw.name,
        raw.id,
        raw.status,
        raw.zone,
        raw.selfLink,
        raw.labels,
        _aware(raw.creationTimestamp, f"instance {raw.name} creationTimestamp"),
        None
        if raw.lastStopTimestamp is None
        else _aware(raw.lastStopTimestamp, f"instance {raw.name} lastStopTimestamp"),
        raw.deletionProtection,
        raw.metadata is not None and any(item.key == CREATED_BY for item in raw.metadata.items),
    )


def rfc3339(text: str, what: str) -> float:
    """An API timestamp string (``2026-11-01T10:00:00.123-07:00``) as unix seconds; an offset is required."""
    try:
        return _aware(datetime.fromisoformat(text), what)
    except ValueError:
        raise ValueError(f"{what}: expected an RFC 3339 timestamp, got {text!r}") from None


_GCLOUD = msgspec.json.Decoder(list[GcloudInstance])


def load_gce(path: str | Path) -> list[GceInstance]:
    """Read a ``gcloud compute instances list --format=json`` export."""
    raws = _decode(path, "--gce", _GCLOUD)
    return _normalize(path, "--gce", lambda: [gce_instance(r) for r in raws])


# --- Kubernetes ------------------------------------------------------------------------------


class _OwnerRef(msgspec.Struct):
    uid: str = ""


class _Meta(msgspec.Struct):
    name: str
    uid: str
    creationTimestamp: datetime
    namespace: str = ""
    labels: dict[str, str] = {}
    resourceVersion: str = ""
    ownerReferences: list[_OwnerRef] = []
    deletionTimestamp: str | None = None


class _Ref(msgspec.Struct):
    name: str = ""


class _ValueFrom(msgspec.Struct):
    secretKeyRef: _Ref | None = None


class _Env(msgspec.Struct):
    valueFrom: _ValueFrom | None = None


class _EnvFrom(msgspec.Struct):
    secretRef: _Ref | None = None


class _Container(msgspec.Struct):
    name: str
    restartPolicy: str | None = None  # "Always" on an init container: a native sidecar
    env: list[_Env] = []
    envFrom: list[_EnvFrom] = []


class _SecretVolume(msgspec.Struct):
    secretName: str = ""


class _Projection(msgspec.Struct):
    secret: _Ref | None = None


class _Projected(msgspec.Struct):
    sources: list[_Projection] = []


class _VolumeSource(msgspec.Struct):
    """The Secret references of the volume plugins that take one (CSI, Ceph, RBD, iSCSI, Flex, ...)."""

    secretRef: _Ref | None = None
    nodePublishSecretRef: _Ref | None = None  # CSI


_SECRET_REF_PLUGINS = ("csi", "cephfs", "cinder", "flexVolume", "iscsi", "rbd", "scaleIO", "storageos")


class _Volume(msgspec.Struct):
    secret: _SecretVolume | None = None
    projected: _Projected | None = None
    azureFile: _SecretVolume | None = None
    csi: _VolumeSource | None = None
    cephfs: _VolumeSource | None = None
    cinder: _VolumeSource | None = None
    flexVolume: _VolumeSource | None = None
    iscsi: _VolumeSource | None = None
    rbd: _VolumeSource | None = None
    scaleIO: _VolumeSource | None = None
    storageos: _VolumeSource | None = None

    def secret_names(self) -> set[str]:
        """Every Secret this volume names."""
        names = {source.secretName for source in (self.secret, self.azureFile) if source}
        if self.projected:
            names |= {p.secret.name for p in self.projected.sources if p.secret}
        for source in filter(None, (getattr(self, plugin) for plugin in _SECRET_REF_PLUGINS)):
            names |= {ref.name for ref in (source.secretRef, source.nodePublishSecretRef) if ref}
        return names


class _Requirement(msgspec.Struct):
    key: str
    operator: str
    values: list[str] = []


class _Selector(msgspec.Struct):
    matchLabels: dict[str, str] = {}
    matchExpressions: list[_Requirement] = []


class _Spec(msgspec.Struct):
    """A Pod's spec (containers, volumes) or a NetworkPolicy's (its pod selector): what the rules read."""

    containers: list[_Container] = []
    initContainers: list[_Container] = []
    ephemeralContainers: list[_Container] = []  # `kubectl debug`: read for the Secrets they use only
    activeDeadlineSeconds: int | None = None
    restartPolicy: str = "Always"  # the API's default
    volumes: list[_Volume] = []
    imagePullSecrets: list[_Ref] = []
    podSelector: _Selector | None = None


class _Terminated(msgspec.Struct, frozen=True):
    exitCode: int | None = None


class _State(msgspec.Struct, frozen=True):
    terminated: _Terminated | None = None


class _ContainerStatus(msgspec.Struct):
    name: str
    state: _State = _State()


class _Status(msgspec.Struct):
    containerStatuses: list[_ContainerStatus] = []
    initContainerStatuses: list[_ContainerStatus] = []


class KubeItem(msgspec.Struct):
    """A Pod, Secret or NetworkPolicy as the API returns it; a Secret's ``data`` is never decoded."""

    metadata: _Meta
    kind: str = ""
    spec: _Spec | None = None
    status: _Status | None = None


class _KubeList(msgspec.Struct):
    items: list[KubeItem]
    kind: str = ""


def _finished_for_good(status: _ContainerStatus | None, restarted_on_failure: bool) -> bool:
    """Whether a container has terminated and will never run again (DESIGN.md section 5, row 6).

    Its own status decides, never the pod's phase: a Succeeded or Failed pod whose container still
    reports running is still running. No status yet, running or waiting: not finished. Terminated
    with exit code 0: finished. Terminated otherwise: finished only where nothing restarts it.
    """
    if status is None or status.state.terminated is None:
        return False
    return status.state.terminated.exitCode == 0 or not restarted_on_failure


def _containers(spec: _Spec, status: _Status) -> dict[str, bool]:
    statuses = {s.name: s for s in status.containerStatuses + status.initContainerStatuses}
    pod_restarts = spec.restartPolicy in ("Always", "OnFailure")
    found = {c.name: _finished_for_good(statuses.get(c.name), pod_restarts) for c in spec.containers}
    for c in spec.initContainers:
        found[c.name] = _finished_for_good(statuses.get(c.name), pod_restarts or c.restartPolicy == "Always")
    return found


def _secrets_used(spec: _Spec) -> tuple[str, ...]:
    """Every Secret a Pod mounts or reads: any volume that names one, env and envFrom of every kind of
    container, image pull secrets. A reference missed here could let an orphaned run's Secret go while
    a Pod outside the run still uses it (``in_use_outside_run``)."""
    names = set().union(*(v.secret_names() for v in spec.volumes))
    for c in spec.containers + spec.initContainers + spec.ephemeralContainers:
        names |= {e.valueFrom.secretKeyRef.name for e in c.env if e.valueFrom and e.valueFrom.secretKeyRef}
        names |= {e.secretRef.name for e in c.envFrom if e.secretRef}
    names |= {ref.name for ref in spec.imagePullSecrets}
    return tuple(sorted(names - {""}))


def _selects(spec: _Spec | None) -> tuple[tuple[str, str, tuple[str, ...]], ...] | None:
    """A NetworkPolicy's pod selector as (key, operator, values) requirements; no selector: every Pod."""
    selector = spec.podSelector if spec else None
    if selector is None:
        return ()
    found = [(key, "In", (value,)) for key, value in sorted(selector.matchLabels.items())]
    found += [(r.key, r.operator, tuple(r.values)) for r in selector.matchExpressions]
    return tuple(found)


def k8s_object(item: KubeItem, cluster: str, kind: str | None = None) -> K8sObject:
    """Normalize one object; ``kind`` overrides the item's (metadata-only lists do not carry it)."""
    kind = kind or item.kind
    meta = item.metadata
    if not meta.name or not meta.uid:
        raise ValueError(f"{kind} {meta.namespace}/{meta.name or '?'}: expected a name and a uid")
    containers: dict[str, bool] = {}
    deadline = None
    uses: tuple[str, ...] = ()
    if kind == "Pod" and item.spec is not None:
        containers = _containers(item.spec, item.status or _Status())
        deadline = item.spec.activeDeadlineSeconds
        uses = _secrets_used(item.spec)
    return K8sObject(
        kind=kind,
        cluster=cluster,
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        labels=meta.labels,
        created=_aware(meta.creationTimestamp, f"{kind} {meta.namespace}/{meta.name} creationTimestamp"),
        resource_version=meta.resourceVersion,
        containers=containers,
        owner_references=len(meta.ownerReferences),
        active_deadline_seconds=deadline,
        deleting=meta.deletionTimestamp is not None,
        uses=uses,
        selects=_selects(item.spec) if kind == "NetworkPolicy" else None,
    )


_KUBECTL = msgspec.json.Decoder(_KubeList)


def load_k8s(path: str | Path, cluster: str) -> list[K8sObject]:
    """Read ``kubectl get pods,secrets,networkpolicies -A -o json`` or a typed ``PodList``; other kinds are ignored."""
    listing = _decode(path, "--k8s", _KUBECTL)
    return _normalize(
        path, "--k8s", lambda: [k8s_object(i, cluster, kind) for i, kind in _item_kinds(listing) if kind in K8S_KINDS]
    )


# Lists that do not say their items' kind, and item kinds that do not say what the object is.
_UNTYPED_LISTS = ("", "List", "PartialObjectMetadataList")
_NO_KIND = ("", "PartialObjectMetadata")


def _item_kinds(listing: _KubeList) -> list[tuple[KubeItem, str]]:
    """Each item with its kind: its own, else the one its typed list names (``PodList`` -> ``Pod``).

    The API and client libraries leave the kind off the items of a typed list. An item
    whose kind cannot be known is an error, never skipped: skipping it would report
    "no orphans" for objects the reaper never read.
    """
    typed = listing.kind not in _UNTYPED_LISTS and listing.kind.endswith("List")
    listed = listing.kind.removesuffix("List") if typed else ""
    kinds = []
    for i, item in enumerate(listing.items):
        own = "" if item.kind in _NO_KIND else item.kind
        meta = item.metadata
        where = f"$.items[{i}] ({meta.namespace}/{meta.name})" if meta.namespace else f"$.items[{i}] ({meta.name})"
        if own and listed and own != listed:
            raise ValueError(f"{where}: kind {own} in a {listing.kind}; expected {listed}")
        if not (own or listed):
            raise ValueError(
                f"{where}: no kind, and the list ({listing.kind or 'no kind'}) does not name one; "
                "expected a kind on each item, or a typed list such as PodList"
            )
        kinds.append((item, own or listed))
    return kinds


# --- evidence files --------------------------------------------------------------------------


_LEASES = msgspec.json.Decoder(list[str])
_WRITERS = msgspec.json.Decoder(list[WriterRecord])


def load_runs(path: str | Path, keys: Iterable[str]) -> Keyed[str]:
    """Run-store documents (``mongoexport --jsonArray``, MongoDB Extended JSON) for these run keys.

    The export is the whole store, so a key with no record is not_found. Keys are matched with the
    run store's own rules (:func:`reaper.stores.mongo.documents_answer`): the string, or for a 24-hex
    key its ObjectId; a record holding the key in another form (a number, an ObjectId under another
    spelling), records that disagree, or a status that is not a string make that key unknown.
    """
    from bson import json_util
    from bson.errors import BSONError

    from reaper.stores.mongo import documents_answer, run_status

    try:
        docs = json_util.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"invalid input {path} (--runs): cannot read the file ({exc.strerror})") from None
    except (ValueError, TypeError, BSONError) as exc:
        raise InputError(f"invalid input {path} (--runs): not valid Extended JSON ({exc})") from None
    if not isinstance(docs, list) or not all(isinstance(d, dict) and "_id" in d for d in docs):
        raise InputError(f"invalid input {path} (--runs): expected a JSON list of documents with an _id")
    known, unknown = documents_answer(keys, docs, "_id", run_status("status"), exhaustive=False)
    return Keyed(known=known, failed=frozenset(unknown), complete=True)  # type: ignore[arg-type]


def load_leases(path: str | Path) -> Keyed[float | None]:
    """A list of run keys whose lease is held; every other key's lease is absent."""
    keys = _decode(path, "--leases", _LEASES)
    return Keyed(known=dict.fromkeys(keys), complete=True)


def load_writer_health(path: str | Path) -> list[WriterRecord]:
    """Heartbeat-writer reports ``{"manager", "project", "last_pass", "failing"}``."""
    return _decode(path, "--writer-health", _WRITERS)


def _decode(path: str | Path, option: str, decoder: msgspec.json.Decoder):  # type: ignore[no-untyped-def]
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"invalid input {path} ({option}): cannot read the file ({exc.strerror})") from None
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InputError(f"invalid input {path} ({option}): {exc}") from None
    except msgspec.DecodeError as exc:
        raise InputError(f"invalid input {path} ({option}): not valid JSON ({exc})") from None


def _normalize(path: str | Path, option: str, build):  # type: ignore[no-untyped-def]
    try:
        return build()
    except ValueError as exc:
        raise InputError(f"invalid input {path} ({option}): {exc}") from None
