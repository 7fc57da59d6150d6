"""RBAC for the API emulator: bearer tokens name users, (Cluster)Roles and their bindings decide.

Like the API server's RBAC authorizer (https://kubernetes.io/docs/reference/access-authn-authz/rbac/):
a request is allowed when a ClusterRoleBinding, or a RoleBinding in the request's namespace, binds a
rule to the user or one of its groups whose apiGroups, resources (`rljobs` and `rljobs/status` are
different resources; `*` is every resource but no subresource, `*/status` or `rljobs/*` name
subresources), verbs and resourceNames match. Members of `system:masters` may do anything (the
emulator's default token is one). Not emulated: aggregated ClusterRoles, nonResourceURLs (discovery is
open to every authenticated user, as the default system:discovery binding makes it), impersonation,
escalation checks when writing roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class User:
    """Who sent a request (what the API server puts in AdmissionReview.request.userInfo)."""

    username: str
    groups: tuple[str, ...] = ("system:authenticated",)
    uid: str = ""

    def info(self) -> Obj:
        """As authentication.k8s.io/v1 UserInfo."""
        return {"username": self.username, "uid": self.uid, "groups": list(self.groups)}


ADMIN = User("emulator-admin", ("system:masters", "system:authenticated"))


def service_account(namespace: str, name: str) -> User:
    """The user a ServiceAccount's token authenticates as."""
    return User(f"system:serviceaccount:{namespace}:{name}",
                ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))


@dataclass
class Request:
    """What RBAC decides on: a verb on a resource (with its subresource), maybe named, maybe in a namespace."""

    verb: str
    group: str
    resource: str
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None

    @property
    def full_resource(self) -> str:
        """`rljobs` or `rljobs/status`, as roles spell it."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def _resource_matches(granted: str, req: Request) -> bool:
    if granted == "*/*" or granted == req.full_resource:
        return True
    if granted == "*":
        return req.subresource is None
    head, _, tail = granted.partition("/")
    if tail and req.subresource is not None:
        return (head in ("*", req.resource)) and (tail in ("*", req.subresource))
    return False


def rule_allows(rule: Obj, req: Request) -> bool:
    """Whether one PolicyRule grants the request."""
    if not any(g in ("*", req.group) for g in rule.get("apiGroups") or []):
        return False
    if not any(_resource_matches(r, req) for r in rule.get("resources") or []):
        return False
    if not any(v in ("*", req.verb) for v in rule.get("verbs") or []):
        return False
    names = rule.get("resourceNames") or []
    return not names or (req.name is not None and req.name in names)


def _subject_matches(subject: Obj, user: User) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return user.username == f"system:serviceaccount:{subject.get('namespace')}:{name}"
    if kind == "User":
        return user.username == name
    if kind == "Group":
        return name in user.groups
    return False


def _bound(binding: Obj, user: User) -> bool:
    return any(_subject_matches(s, user) for s in binding.get("subjects") or [])


def allowed(objects: list[Obj], user: User, req: Request) -> bool:
    """Decide with the RBAC objects `objects` (Roles, ClusterRoles, RoleBindings, ClusterRoleBindings)."""
    if "system:masters" in user.groups:
        return True
    roles = {("Role", o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects if o["kind"] == "Role"}
    cluster_roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding") or not _bound(binding, user):
            continue
        ref = binding.get("roleRef") or {}
        if binding["kind"] == "RoleBinding":
            if req.namespace != binding["metadata"].get("namespace"):
                continue  # a RoleBinding grants in its own namespace only (never cluster-scoped requests)
            role = roles.get(("Role", req.namespace, ref.get("name"))) if ref.get("kind") == "Role" \
                else cluster_roles.get(ref.get("name"))
        else:
            role = cluster_roles.get(ref.get("name")) if ref.get("kind") == "ClusterRole" else None
        if role and any(rule_allows(rule, req) for rule in role.get("rules") or []):
            return True
    return False


def forbidden_message(user: User, req: Request) -> str:
    """The API server's 403 message, word for word."""
    what = f"{req.resource}.{req.group}" if req.group else req.resource
    subject = f'{what} "{req.name}"' if req.name else what
    where = f'in the namespace "{req.namespace}"' if req.namespace else "at the cluster scope"
    return (f'{subject} is forbidden: User "{user.username}" cannot {req.verb} resource "{req.full_resource}" '
            f'in API group "{req.group}" {where}')
