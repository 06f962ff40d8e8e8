"""RBAC as the API server's authorizer applies it, for the tokens a test grants: what a ServiceAccount may do.

``grant(token, documents)`` reads Kubernetes RBAC manifests (``Role``, ``ClusterRole``,
``RoleBinding``, ``ClusterRoleBinding``; the ``ServiceAccount`` they bind is the one whose token
this is) the way the authorizer does: a ``Role`` bound by a ``RoleBinding`` grants in that
namespace, a ``ClusterRole`` bound by a ``ClusterRoleBinding`` everywhere, by a ``RoleBinding``
in the binding's namespace. A request with a granted token is checked; any other token is not
(the tests' own seeding keeps working).
"""

from __future__ import annotations

from dataclasses import dataclass

from include.emulators.http import ApiError

API_GROUPS = {"pods": "", "secrets": "", "networkpolicies": "networking.k8s.io"}


@dataclass(frozen=True)
class Rule:
    """One rule of a role, where it applies (``namespace`` None: every namespace and the cluster scope)."""

    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    namespace: str | None

    def allows(self, verb: str, resource: str, namespace: str | None) -> bool:
        def has(values: frozenset[str], value: str) -> bool:
            return value in values or "*" in values

        where = self.namespace is None or self.namespace == namespace
        allowed = has(self.groups, API_GROUPS[resource]) and has(self.resources, resource) and has(self.verbs, verb)
        return where and allowed


@dataclass(frozen=True)
class Subject:
    user: str  # as the authorizer names it: system:serviceaccount:NAMESPACE:NAME
    rules: tuple[Rule, ...]

    def authorize(self, verb: str, resource: str, namespace: str | None) -> None:
        """Nothing if a rule allows it; otherwise 403, worded as the API server words it."""
        if any(rule.allows(verb, resource, namespace) for rule in self.rules):
            return
        group = API_GROUPS[resource]
        where = "at the cluster scope" if namespace is None else f'in the namespace "{namespace}"'
        raise ApiError(
            403,
            "Forbidden",
            f'{resource} is forbidden: User "{self.user}" cannot {verb} resource "{resource}" '
            f'in API group "{group}" {where}',
        )


def subject(documents: list[dict]) -> Subject:
    """The ServiceAccount of these manifests with every rule bound to it."""
    (account,) = [d for d in documents if d["kind"] == "ServiceAccount"]
    name, home = account["metadata"]["name"], account["metadata"]["namespace"]
    roles = {(d["kind"], _namespace(d), d["metadata"]["name"]): d for d in documents}
    rules: list[Rule] = []
    for binding in documents:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if {"kind": "ServiceAccount", "name": name, "namespace": home} not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        where = _namespace(binding)
        role = roles.get((ref["kind"], where if ref["kind"] == "Role" else None, ref["name"]))
        if role is None:
            continue  # a binding to a role these manifests do not hold grants nothing
        rules += [
            Rule(frozenset(r["apiGroups"]), frozenset(r["resources"]), frozenset(r["verbs"]), where)
            for r in role["rules"]
        ]
    return Subject(f"system:serviceaccount:{home}:{name}", tuple(rules))


def _namespace(document: dict) -> str | None:
    """Where a manifest's object lives: a namespaced kind without one goes to ``default``, as kubectl puts it."""
    if document["kind"] in ("Role", "RoleBinding"):
        return document["metadata"].get("namespace") or "default"
    return None
