"""Decoders for what users export from their fleet, into the policy's model.

- ``gcloud compute instances list --format=json``: a list of GCE instance resources.
- ``kubectl get pods,secrets,networkpolicies -A -o json``: a ``List`` of objects.
- Evidence files: run-store documents, held lease keys, writer-health reports.
- A recorded sweep input: the ``sweep-input.msgpack`` a sweep keeps in ``airflow.sweep_store``.

Decoding is typed and streaming-friendly (``msgspec``): fields the rules do not
read are skipped by the parser and never become Python objects. That is what
keeps a 100,000-instance export small in memory, and it is why a Secret's
``data`` is never held: the decoder has no field to put it in.

The DAG's listings decode the APIs' answers with the same structs and normalizers
(:class:`RawInstance` and :func:`gce_instance`, :class:`KubeList` and :func:`k8s_object`),
so that an export is read, and refused, as the sweep reads the fleet it was taken from.

Any problem raises :class:`InputError` naming the file, the option it came from
and the JSON path that is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from reaper.config import ConfigError
from reaper.model import GceGroup, GceInstance, K8sObject, Keyed, SweepData, WriterRecord

T = TypeVar("T")

K8S_KINDS = ("Pod", "Secret", "NetworkPolicy")


class InputError(ConfigError):
    """An input file is unreadable or not shaped as documented; nothing is evaluated."""


# --- GCE -------------------------------------------------------------------------------------


class MetadataItem(msgspec.Struct):
    """A metadata entry; only its key is read (values may be large startup scripts). An entry without
    a key (the API's JSON mapping leaves empty fields out) is no ``created-by``: it is read, not refused."""

    key: str = ""


class Metadata(msgspec.Struct):
    items: list[MetadataItem] = []


# The metadata key a managed instance group stamps on the instances it creates (their URL as value).
CREATED_BY = "created-by"


class RawInstance(msgspec.Struct):
    """A Compute API instance resource, as a listing page or a ``gcloud`` export holds it: the fields the
    rules read (the listing's partial response asks for these only: ``gce.inventory.INSTANCE_FIELDS``).

    The one struct of both readers, so that they accept and refuse the same instances. A field the
    answer leaves out reads as the protobuf default would (empty, zero, false), so the normalizer
    refuses the same instances it refused when the SDK parsed them; ``null`` is no value the API
    writes, and is refused.
    """

    name: str = ""
    id: str | int = ""
    status: str = ""
    zone: str = ""
    selfLink: str = ""
    labels: dict[str, str] = {}
    creationTimestamp: str = ""
    lastStopTimestamp: str = ""
    lastSuspendedTimestamp: str = ""
    deletionProtection: bool = False
    labelFingerprint: str = ""
    metadata: Metadata = msgspec.field(default_factory=Metadata)


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


def rfc3339(text: str, what: str) -> float:
    """An API timestamp string (``2026-11-01T10:00:00.123-07:00``) as unix seconds; an offset is required."""
    try:
        ts = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{what}: expected an RFC 3339 timestamp, got {text!r}") from None
    return _aware(ts, what)


def gce_instance(raw: RawInstance) -> GceInstance:
    """The one normalizer of an instance, for listed pages and exports alike.

    The project comes from ``selfLink``, else from the ``zone`` URL. An instance without a name, a
    status, a zone (its re-read and its delete name one), a creation time, or a numeric id
    (:func:`numeric_id`; an absent id reads as 0) cannot be judged, re-validated or deleted by id:
    it is refused (``ValueError``), which makes its listing incomplete. An empty
    ``lastStopTimestamp`` (the protobuf default) is an instance never stopped.
    """
    name = raw.name
    ident = numeric_id(raw.id)
    if not name or not raw.status or ident is None:
        raise ValueError(f"instance {name or '?'}: expected a name, a status and a numeric id, got {raw.id!r}")
    if not raw.zone:
        raise ValueError(f"instance {name}: no zone")
    project = _url_part(raw.selfLink, "projects") or _url_part(raw.zone, "projects")
    if not project:
        raise ValueError(f"instance {name}: no project in selfLink or zone URL")
    stopped, suspended = raw.lastStopTimestamp, raw.lastSuspendedTimestamp
    return GceInstance(
        project,
        _url_part(raw.zone, "zones") or raw.zone,
        name,
        ident,
        raw.status,
        raw.labels,
        rfc3339(raw.creationTimestamp, f"instance {name} creationTimestamp"),
        rfc3339(stopped, f"instance {name} lastStopTimestamp") if stopped else None,
        raw.deletionProtection,
        any(item.key == CREATED_BY for item in raw.metadata.items),
        raw.labelFingerprint,
        rfc3339(suspended, f"instance {name} lastSuspendedTimestamp") if suspended else None,
    )


_GCLOUD = msgspec.json.Decoder(list[RawInstance])


def load_gce(path: str | Path) -> list[GceInstance]:
    """Read a ``gcloud compute instances list --format=json`` export: the instances as the listing reads them.

    One difference remains: a key repeated in one object reads as its last value here (msgspec's rule, as
    most JSON parsers'), where the listing refuses the page (``gce.inventory.decode_once_each``). gcloud
    never writes a key twice, and counting every key of a full export costs four to seven times its
    decoding; the listing pays it on its partial responses only.
    """
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
    phase: str = ""
    containerStatuses: list[_ContainerStatus] = []
    initContainerStatuses: list[_ContainerStatus] = []


class KubeItem(msgspec.Struct):
    """A Pod, Secret or NetworkPolicy as the API returns it; a Secret's ``data`` is never decoded."""

    metadata: _Meta
    kind: str = ""
    spec: _Spec | None = None
    status: _Status | None = None


class ListMeta(msgspec.Struct):
    """A list's own metadata: the continue token of a page, and how many items remain past it."""

    # "continue" is a Python keyword.
    next: str = msgspec.field(default="", name="continue")
    remainingItemCount: int | None = None


class KubeList(msgspec.Struct):
    """A list as the API answers it (a page of it) and as ``kubectl get -o json`` writes it (a ``List``).

    ``items`` is required: an answer without it is no list, never an empty one. ``null`` is an empty one in a
    metadata-only list only (:data:`METADATA_LIST`): the API server answers one that matches nothing with
    ``"items": null`` (it is built by appending, so no match leaves a nil slice: kubernetes-client/python#2142,
    fixed there in #2155); in any other answer it is no list (:func:`item_kinds`)."""

    items: list[KubeItem] | None
    kind: str = ""
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)


def _finished_for_good(status: _ContainerStatus | None, restarted_on_failure: bool) -> bool:
    """Whether a container has terminated and will never run again (docs/design.md §5, row 6).

    Its own status decides, never the pod's phase: a Succeeded or Failed pod whose container still
    reports running is still running. No status yet, running or waiting: not finished. Terminated
    with exit code 0: finished. Terminated otherwise: finished only where nothing restarts it.
    """
    if status is None or status.state.terminated is None:
        return False
    return status.state.terminated.exitCode == 0 or not restarted_on_failure


def _containers(spec: _Spec, status: _Status) -> dict[str, bool]:
    statuses = {s.name: s for s in status.containerStatuses + status.initContainerStatuses}
    # A Pod in a terminal phase restarts nothing: the kubelet stops its native sidecars (often exit 137 or 143) once
    # its containers have ended, and never starts them again (kubernetes.io, Pod lifecycle and sidecar containers).
    # A container that still reports running is still running, whatever the phase.
    live = status.phase not in ("Succeeded", "Failed")
    pod_restarts = live and spec.restartPolicy in ("Always", "OnFailure")
    found = {c.name: _finished_for_good(statuses.get(c.name), pod_restarts) for c in spec.containers}
    for c in spec.initContainers:
        native = live and c.restartPolicy == "Always"
        found[c.name] = _finished_for_good(statuses.get(c.name), pod_restarts or native)
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
    found: list[tuple[str, str, tuple[str, ...]]] = [
        (key, "In", (value,)) for key, value in sorted(selector.matchLabels.items())
    ]
    found += [(r.key, r.operator, tuple(r.values)) for r in selector.matchExpressions]
    return tuple(found)


def k8s_object(item: KubeItem, cluster: str, kind: str | None = None) -> K8sObject:
    """Normalize one object; ``kind`` overrides the item's (metadata-only lists do not carry it)."""
    kind = kind or item.kind
    meta = item.metadata
    # The API server gives every object a uid and a resourceVersion; the deletes are made on both as
    # preconditions, so an object without one is surprising evidence, never a candidate (docs/design.md §1).
    if not meta.name or not meta.uid or not meta.resourceVersion:
        raise ValueError(f"{kind} {meta.namespace}/{meta.name or '?'}: expected a name, a uid and a resourceVersion")
    containers: dict[str, bool] = {}
    deadline = None
    uses: tuple[str, ...] = ()
    if kind == "Pod":
        if item.spec is None:  # a metadata-only answer: no container a rule could read as running
            raise ValueError(f"Pod {meta.namespace}/{meta.name}: expected its spec (containers, volumes), got none")
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


_KUBECTL = msgspec.json.Decoder(KubeList)


def load_k8s(path: str | Path, cluster: str) -> list[K8sObject]:
    """Read ``kubectl get pods,secrets,networkpolicies -A -o json`` or a typed ``PodList``; other kinds are ignored."""
    listing = _decode(path, "--k8s", _KUBECTL)
    return _normalize(
        path, "--k8s", lambda: [k8s_object(i, cluster, kind) for i, kind in item_kinds(listing) if kind in K8S_KINDS]
    )


METADATA_LIST = "PartialObjectMetadataList"  # the kind of a metadata-only list (reaper.k8s.client.METADATA_ONLY)
# Lists that do not say their items' kind, and item kinds that do not say what the object is.
_UNTYPED_LISTS = ("", "List", METADATA_LIST)
_NO_KIND = ("", "PartialObjectMetadata")


def item_kinds(listing: KubeList, asked: str = "") -> list[tuple[KubeItem, str]]:
    """Each item with its kind: its own, else the one its typed list names (``PodList`` -> ``Pod``), else
    the kind ``asked`` for (a listing of one collection; metadata-only lists name no kind at all).

    The API and client libraries leave the kind off the items of a typed list. An item whose kind
    cannot be known, or is not the one its list or the request names, is an error (``ValueError``),
    never skipped nor read as another kind: skipping it would report "no orphans" for objects the
    reaper never read.
    """
    if listing.kind not in _UNTYPED_LISTS and not listing.kind.endswith("List"):  # a Status answered 200, say
        raise ValueError(f"a {listing.kind} answered a list")
    if listing.items is None and listing.kind != METADATA_LIST:
        raise ValueError(f"a {listing.kind or 'list'} answered items null: only an empty metadata-only list does")
    typed = listing.kind not in _UNTYPED_LISTS  # a list kind, checked above
    listed = listing.kind.removesuffix("List") if typed else ""
    if asked and listed and listed != asked:
        raise ValueError(f"a {listing.kind} answered a list of {asked}s")
    listed = listed or asked
    kinds = []
    for i, item in enumerate(listing.items or []):
        own = "" if item.kind in _NO_KIND else item.kind
        meta = item.metadata
        where = f"$.items[{i}] ({meta.namespace}/{meta.name})" if meta.namespace else f"$.items[{i}] ({meta.name})"
        if own and listed and own != listed:
            raise ValueError(f"{where}: kind {own} in a {listing.kind or 'list'}; expected {listed}")
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
    return Keyed(known=known, failed=frozenset(unknown), complete=True)


def load_leases(path: str | Path) -> Keyed[float | None]:
    """A list of run keys whose lease is held; every other key's lease is absent."""
    keys = _decode(path, "--leases", _LEASES)
    return Keyed(known=dict.fromkeys(keys), complete=True)


def load_writer_health(path: str | Path) -> list[WriterRecord]:
    """Heartbeat-writer reports ``{"manager", "project", "last_pass", "failing"}``."""
    return _decode(path, "--writer-health", _WRITERS)


# SweepData[Any]: SweepData is invariant in its resources' type, and a file just decoded (its own list)
# is safely read as the wider GceInstance | GceGroup | K8sObject that load_recorded returns.
_RECORDED: dict[str, msgspec.msgpack.Decoder[SweepData[Any]]] = {
    "gce": msgspec.msgpack.Decoder(SweepData[GceInstance | GceGroup]),
    "k8s": msgspec.msgpack.Decoder(SweepData[K8sObject]),
}


def load_recorded(path: str | Path) -> SweepData[GceInstance | GceGroup | K8sObject]:
    """A sweep's whole input as its ``gather_evidence`` recorded it: one target's resources and evidence.

    ``path``: a local file, or a ``file://`` URL as the sweep names it; a file of a shared store (``gs://``,
    ``s3://``) is copied here first (``gcloud storage cp``), so that reading it needs no connection. GCE
    resources are tagged (``"type": "instance"`` or ``"group"``) and Kubernetes objects are not, so the first
    resource says which target's file it is; an empty one reads as either.
    """
    scheme, _, rest = str(path).partition("://")
    if rest and scheme != "file":
        raise InputError(
            f"invalid input {path} (--recorded): expected a local file; copy it from the sweep store first "
            f"(gcloud storage cp, aws s3 cp)"
        )
    try:
        data = Path(rest if rest else path).read_bytes()
    except OSError as exc:
        raise InputError(f"invalid input {path} (--recorded): cannot read the file ({exc.strerror})") from None
    try:
        peek = msgspec.msgpack.decode(data)
        first: object = next(iter(peek.get("resources") or ()), {}) if isinstance(peek, dict) else {}
        target = "gce" if isinstance(first, dict) and "type" in first else "k8s"
        return _RECORDED[target].decode(data)
    except msgspec.ValidationError as exc:
        raise InputError(f"invalid input {path} (--recorded): expected {EXPECTED['--recorded']}; {exc}") from None
    except msgspec.DecodeError as exc:
        raise InputError(f"invalid input {path} (--recorded): not valid MessagePack ({exc})") from None


# What each option takes, for a file that is something else (a kubectl List given to --gce): the decoder's
# own words ("Expected `array`, got `object`") then say where, this says what.
EXPECTED = {
    "--gce": "a gcloud export (gcloud compute instances list --format=json: a JSON array of instances)",
    "--k8s": "a kubectl export (kubectl get pods,secrets,networkpolicies -o json: a JSON List object)",
    "--leases": "a JSON array of the run keys whose lease is held",
    "--writer-health": "a JSON array of heartbeat-writer reports",
    "--recorded": "a sweep input (sweep-input.msgpack, from a sweep's folder in airflow.sweep_store)",
}


def _decode(path: str | Path, option: str, decoder: msgspec.json.Decoder[T]) -> T:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"invalid input {path} ({option}): cannot read the file ({exc.strerror})") from None
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InputError(f"invalid input {path} ({option}): expected {EXPECTED[option]}; {exc}") from None
    except msgspec.DecodeError as exc:
        raise InputError(f"invalid input {path} ({option}): not valid JSON ({exc})") from None


def _normalize(path: str | Path, option: str, build: Callable[[], T]) -> T:
    try:
        return build()
    except ValueError as exc:
        raise InputError(f"invalid input {path} ({option}): {exc}") from None
