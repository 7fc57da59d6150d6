"""A Kubernetes API server emulator for tests: real HTTP on 127.0.0.1, served from a background thread.

Why not kmock's `KubernetesEmulator` as shipped: its write path (kmock/_internal/k8s.py `_handle`)
merges bodies blindly under its own lock, has no resourceVersion, replays every object on watch and
its discovery says groupVersion "/v1" (see PLATFORM-NOTES "Kubernetes API emulation"). Every one of
those would need overriding kmock internals, so the HTTP layer here is plain aiohttp (what kmock uses)
and the API-server semantics live in `kube_store.Store`. kopf, our own client and real `kubectl`
talk to it like to an API server: discovery, list/watch (from a resourceVersion, without replay),
get/create/replace/patch (JSON, merge, strategic-as-merge)/delete, the status subresource, CRDs.

Use from tests: `KubeEmulator(crd_files=[...]).start()`, `.url`, `.write_kubeconfig(path)`, the sync
helpers (`create`, `get`, `list`, `patch`, `patch_status`, `delete`), `.request_counts`, `.stop()`.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import functools
import json
import pathlib
import re
import threading
from typing import Any

import aiohttp.web
import yaml

from . import kube_rbac
from .kube_admission import Admission, Attributes
from .kube_patch import PatchError, json_patch, merge_patch, strip_directives
from .kube_rbac import ADMIN, User
from .kube_store import ApiError, Changed, Obj, ResourceType, Store

KUBERAY_DIR = pathlib.Path(__file__).resolve().parents[3] / "shared" / "kuberay"
_BUILTINS = [
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, short_names=("ns",)),
    ResourceType("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    ResourceType("", "v1", "secrets", "Secret"),
    ResourceType("", "v1", "events", "Event", short_names=("ev",)),
    ResourceType("", "v1", "pods", "Pod", short_names=("po",), status_subresource=True),
    ResourceType("", "v1", "services", "Service", short_names=("svc",), status_subresource=True),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    ResourceType("events.k8s.io", "v1", "events", "Event", short_names=("ev",)),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                 namespaced=False, short_names=("crd", "crds"), status_subresource=True),
    ResourceType("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                 "ValidatingWebhookConfiguration", namespaced=False),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    ResourceType("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
]
_RBAC_KINDS = ("roles", "rolebindings", "clusterroles", "clusterrolebindings")
#: Write verbs that pass through validating admission, by HTTP method.
_OPERATIONS = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE", "delete": "DELETE"}
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _singular(rt: ResourceType) -> str:
    return rt.singular or rt.kind.lower()


@functools.lru_cache(maxsize=16)
def _load_crds(path: str, mtime: float) -> tuple[Obj, ...]:
    """Parse a CRD file once per process (KubeRay's are ~25k lines); `mtime` invalidates the cache."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    docs = yaml.load_all(pathlib.Path(path).read_text(), Loader=loader)
    return tuple(d for d in docs if d and d.get("kind") == "CustomResourceDefinition")


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' version order: GA over beta over alpha, then by number (v1 > v1beta2 > v1alpha1)."""
    m = re.fullmatch(r"v(\d+)(alpha|beta)?(\d*)", version)
    if not m:
        return (-1, 0, 0)
    return (int(m.group(1)), {"alpha": 0, "beta": 1, None: 2}[m.group(2)], int(m.group(3) or 0))


_NAME_COLUMN = {"name": "Name", "type": "string", "format": "name", "priority": 0,
                "description": "Name must be unique within a namespace."}
_AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
               "description": "When the object was created."}


def _wants_table(request: aiohttp.web.Request) -> bool:
    """kubectl asks for server-side printing with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`."""
    return "as=Table" in request.headers.get("Accept", "")


def _json_path(obj: Any, path: str) -> Any:
    """The value at a simple JSONPath such as `.status.progress.step` (what printer columns use); None if absent."""
    for part in path.strip().lstrip(".").split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _age(stamp: Any, now: datetime.datetime) -> str:
    """A creationTimestamp as kubectl shows ages (`45s`, `3m12s`, `2h`, `4d`), as the API server's Table does."""
    try:
        then = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    s = max(0, int((now - then).total_seconds()))
    m, h, d = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    return f"{d}d" if d < 730 else f"{d // 365}y"


def _table(rt: ResourceType, items: list[Obj], rv: int) -> Obj:
    """A meta.k8s.io/v1 Table like the API server's for CRDs: Name, then the printer columns (or Age)."""
    columns = [dict(c) for c in rt.printer_columns] or [_AGE_COLUMN]
    definitions = [_NAME_COLUMN] + [{"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
                                     "description": c.get("description", ""), "priority": c.get("priority", 0)}
                                    for c in columns]
    now = datetime.datetime.now(datetime.timezone.utc)

    def cell(item: Obj, column: Obj) -> Any:
        value = _json_path(item, column["jsonPath"])
        return _age(value, now) if column.get("type") == "date" and value is not None else value

    rows = [{"cells": [item["metadata"]["name"]] + [cell(item, c) for c in columns], "object": item}
            for item in items]
    return {"apiVersion": "meta.k8s.io/v1", "kind": "Table", "metadata": {"resourceVersion": str(rv)},
            "columnDefinitions": definitions, "rows": rows}


class KubeEmulator:
    """An in-memory API server on 127.0.0.1:<random port>, running in its own thread and event loop."""

    def __init__(self, crd_files: list[pathlib.Path] | None = None, kuberay: bool = True,
                 namespaces: tuple[str, ...] = ("default", "kube-system")) -> None:
        """Serve the built-in types, the CRDs in `crd_files` and (when `kuberay`) KubeRay's RayJob/RayCluster.

        KubeRay's CRDs are read from ../shared/kuberay/ when present; when absent their resources are
        served without schema validation and `kuberay_schema` is False.
        """
        self.store = Store()
        for rt in _BUILTINS:
            self.store.register(rt)
        for path in crd_files or []:
            self.install_crds(path)
        self.kuberay_schema = False
        if kuberay:
            if (KUBERAY_DIR / "ray.io_rayjobs.yaml").exists():
                for name in ("ray.io_rayjobs.yaml", "ray.io_rayclusters.yaml"):
                    self.install_crds(KUBERAY_DIR / name)
                self.kuberay_schema = True
            else:
                for plural, kind in (("rayjobs", "RayJob"), ("rayclusters", "RayCluster")):
                    self.store.register(ResourceType("ray.io", "v1", plural, kind, status_subresource=True))
        ns_type = self.store.resolve("", "v1", "namespaces")
        for ns in namespaces:
            self.store.create(ns_type, None, {"metadata": {"name": ns}})
        self.request_counts: collections.Counter[tuple[str, str]] = collections.Counter()
        #: Requests by (verb, group, resource or resource/subresource, namespace or "").
        self.requests_by_resource: collections.Counter[tuple[str, str, str, str]] = collections.Counter()
        #: Bearer tokens and the users they authenticate; requests without a token are the admin's too.
        self.tokens: dict[str, User] = {"emulator-token": ADMIN}
        #: RBAC refusals (the 403 messages), in order.
        self.denied: list[str] = []
        #: Validating webhooks: `admission.endpoints[(ns, service)] = (host, port)`, `admission.calls`.
        self.admission = Admission()
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: aiohttp.web.AppRunner | None = None
        self._tick: asyncio.Event | None = None
        self._closing = False

    # ---- set-up -----------------------------------------------------------------------------------
    def install_crds(self, path: pathlib.Path) -> None:
        """Create every CustomResourceDefinition found in a YAML file (so it is also listed and served)."""
        crd_type = self.store.resolve("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        for doc in _load_crds(str(path), pathlib.Path(path).stat().st_mtime):
            self.store.create(crd_type, None, doc)
            self.store.register_crd(doc)

    def start(self) -> KubeEmulator:
        """Serve HTTP from a daemon thread; returns once the port is bound."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            self._tick = asyncio.Event()
            app = aiohttp.web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._dispatch)
            self._runner = aiohttp.web.AppRunner(app, shutdown_timeout=1.0)
            await self._runner.setup()
            site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = self._runner.addresses[0][1]
            self.url = f"http://127.0.0.1:{port}"
            self.store.listeners.append(lambda: self._loop.call_soon_threadsafe(self._wake))  # type: ignore[union-attr]
            ready.set()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="kube-emulator", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the Kubernetes emulator did not start within 10 s")
        return self

    def stop(self) -> None:
        """End open watches, close the server and the thread."""
        if self._loop is None or self._runner is None:
            return
        self._closing = True
        self._loop.call_soon_threadsafe(self._wake)
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop.close()
        self._loop = None

    def add_token(self, user: User) -> str:
        """A new bearer token that authenticates as `user` (RBAC then applies to its requests)."""
        token = f"token-{len(self.tokens)}-{user.username.replace(':', '-')}"
        self.tokens[token] = user
        return token

    def write_kubeconfig(self, path: pathlib.Path, namespace: str = "default",
                         token: str = "emulator-token") -> pathlib.Path:
        """Write a kubeconfig pointing at this emulator (token auth, plain HTTP) and return its path."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator", "preferences": {},
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": token}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "emulator",
                                                          "namespace": namespace}}],
        }
        path = pathlib.Path(path)
        path.write_text(yaml.safe_dump(config))
        return path

    def _wake(self) -> None:
        if self._tick is not None:
            old, self._tick = self._tick, asyncio.Event()
            old.set()

    # ---- sync helpers for tests (thread-safe; they share the store with the HTTP server) ------------
    def rt(self, api_version: str, plural: str) -> ResourceType:
        """Resolve `("ray.io/v1", "rayjobs")` to a served resource type."""
        group, _, version = api_version.rpartition("/")
        return self.store.resolve(group, version, plural)

    def create(self, api_version: str, plural: str, obj: Obj, namespace: str | None = None) -> Obj:
        """Create an object as a client would."""
        return self.store.create(self.rt(api_version, plural), namespace, obj)

    def get(self, api_version: str, plural: str, name: str, namespace: str | None = "default") -> Obj:
        """Read one object (raises ApiError 404)."""
        return self.store.get(self.rt(api_version, plural), namespace, name)

    def find(self, api_version: str, plural: str, name: str, namespace: str | None = "default") -> Obj | None:
        """Read one object, or None when it does not exist."""
        try:
            return self.get(api_version, plural, name, namespace)
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise

    def list(self, api_version: str, plural: str, namespace: str | None = None,
             labels: str | None = None) -> list[Obj]:
        """List objects (all namespaces unless `namespace`)."""
        return self.store.list(self.rt(api_version, plural), namespace, labels)[0]

    def patch(self, api_version: str, plural: str, name: str, patch: Obj, namespace: str | None = "default",
              subresource: str | None = None) -> Obj:
        """Apply a JSON merge patch to the object (or to its status with `subresource="status"`)."""
        return self.store.update(self.rt(api_version, plural), namespace, name,
                                 lambda cur: merge_patch(cur, patch), subresource=subresource)

    def patch_status(self, api_version: str, plural: str, name: str, status: Obj,
                     namespace: str | None = "default") -> Obj:
        """Merge `status` into the object's status through the status subresource (as a controller would)."""
        return self.patch(api_version, plural, name, {"status": status}, namespace, subresource="status")

    def delete(self, api_version: str, plural: str, name: str, namespace: str | None = "default") -> Obj:
        """Delete an object (finalizers and garbage collection apply)."""
        return self.store.delete(self.rt(api_version, plural), namespace, name)

    def count_requests(self, verbs: tuple[str, ...] | None = None, plural: str | None = None) -> int:
        """How many API requests were served, optionally only some verbs / one resource."""
        return sum(n for (verb, res), n in self.request_counts.items()
                   if (verbs is None or verb in verbs) and (plural is None or res == plural))

    # ---- HTTP ------------------------------------------------------------------------------------
    async def _dispatch(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        try:
            return await self._route(request)
        except ApiError as exc:
            if exc.code == 403:
                self.denied.append(exc.message)
            return aiohttp.web.json_response(exc.status(), status=exc.code)
        except PatchError as exc:
            reason = "Invalid" if exc.status == 422 else "BadRequest"
            err = ApiError(exc.status, reason, str(exc))
            return aiohttp.web.json_response(err.status(), status=exc.status)

    async def _route(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if request.method == "GET":
            discovery = self._discovery(parts)
            if discovery is not None:
                return aiohttp.web.json_response(discovery)
        if parts[:1] == ["api"] and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource {request.path}")
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        user = self._user(request)
        if (group, rest) == ("authorization.k8s.io", ["selfsubjectaccessreviews"]) and request.method == "POST":
            return aiohttp.web.json_response(self._access_review(user, await request.json()), status=201)
        rt = self.store.resolve(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if subresource not in (None, "status") or (subresource == "status" and not rt.status_subresource):
            raise ApiError(404, "NotFound", f"{rt.plural} has no subresource {subresource!r}")
        return await self._serve(request, rt, namespace, name, subresource, user)

    def _user(self, request: aiohttp.web.Request) -> User:
        """Who sent the request: the bearer token's user (401 for an unknown one); no token: the admin."""
        header = request.headers.get("Authorization", "")
        if not header:
            return ADMIN
        token = header.removeprefix("Bearer ").strip()
        if token not in self.tokens:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return self.tokens[token]

    def _authorize(self, user: User, verb: str, rt: ResourceType, namespace: str | None, name: str | None,
                   subresource: str | None) -> None:
        """Count the request and refuse it (403, the API server's message) when RBAC grants it to nobody."""
        full = f"{rt.plural}/{subresource}" if subresource else rt.plural
        self.requests_by_resource[(verb, rt.group, full, namespace or "")] += 1
        req = kube_rbac.Request(verb, rt.group, rt.plural, subresource, namespace if rt.namespaced else None, name)
        if not self._allowed(user, req):
            raise ApiError(403, "Forbidden", kube_rbac.forbidden_message(user, req))

    def _allowed(self, user: User, req: kube_rbac.Request) -> bool:
        if "system:masters" in user.groups:
            return True
        rbac = [o for plural in _RBAC_KINDS
                for o in self.store.list(self.store.resolve("rbac.authorization.k8s.io", "v1", plural))[0]]
        return kube_rbac.allowed(rbac, user, req)

    def _access_review(self, user: User, body: Any) -> Obj:
        """A SelfSubjectAccessReview (`kubectl auth can-i`): may the caller do spec.resourceAttributes? Every
        authenticated user may ask, as on a real cluster (system:basic-user)."""
        attrs = ((body or {}).get("spec") or {}).get("resourceAttributes") or {}
        req = kube_rbac.Request(attrs.get("verb", ""), attrs.get("group", ""), attrs.get("resource", ""),
                                attrs.get("subresource") or None, attrs.get("namespace") or None, attrs.get("name") or None)
        return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs}, "status": {"allowed": self._allowed(user, req)}}

    async def _admit(self, user: User, operation: str, rt: ResourceType, namespace: str | None, name: str,
                     subresource: str | None, obj: Obj | None, old: Obj | None, dry_run: bool) -> list[str]:
        """Run the validating webhooks that match this write; their warnings (raises ApiError to refuse)."""
        vwc_type = self.store.resolve("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
        configurations = self.store.list(vwc_type)[0]
        if not configurations:
            return []
        labels = None
        if rt.namespaced and namespace:
            ns_obj = self.find("v1", "namespaces", namespace, None)
            labels = ((ns_obj or {}).get("metadata") or {}).get("labels") or {}
        attrs = Attributes(operation, rt, namespace, name, subresource, obj, old, user, dry_run)
        return await self.admission.validate(configurations, labels, attrs)

    async def _serve(self, request: aiohttp.web.Request, rt: ResourceType, namespace: str | None,
                     name: str | None, subresource: str | None, user: User = ADMIN) -> aiohttp.web.StreamResponse:
        q = request.query
        method, dry_run = request.method, q.get("dryRun") == "All"
        strict = q.get("fieldValidation") == "Strict"
        if name is None and method == "GET":
            verb = "watch" if q.get("watch") in ("true", "1") else "list"
            self._authorize(user, verb, rt, namespace, None, None)
            self.request_counts[(verb, rt.plural)] += 1
            if verb == "watch":
                return await self._watch(request, rt, namespace)
            items, rv = self.store.list(rt, namespace, q.get("labelSelector"), q.get("fieldSelector"))
            if _wants_table(request):
                return aiohttp.web.json_response(_table(rt, items, rv))
            return aiohttp.web.json_response({"apiVersion": rt.api_version, "kind": f"{rt.kind}List",
                                              "metadata": {"resourceVersion": str(rv)}, "items": items})
        body: Any = None
        if method in ("POST", "PUT", "PATCH") or (method == "DELETE" and request.can_read_body):
            raw = await request.read()
            body = json.loads(raw) if raw.strip() else None
        verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
        if verb is None or (name is None and method != "POST") or (name is not None and method == "POST"):
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {request.path}")
        self._authorize(user, verb, rt, namespace, name, subresource)
        self.request_counts[(verb, rt.plural)] += 1
        if verb == "get":
            obj = self.store.get(rt, namespace, name or "")
            if _wants_table(request):
                return aiohttp.web.json_response(_table(rt, [obj], int(obj["metadata"]["resourceVersion"])))
            return aiohttp.web.json_response(obj)
        operation = _OPERATIONS[verb]
        if verb == "create":
            # Admission sees the object as it would be stored (defaulted, schema- and CEL-checked).
            preview = self.store.create(rt, namespace, body, dry_run=True, strict=strict)
            warnings = await self._admit(user, operation, rt, namespace, preview["metadata"]["name"], None,
                                         preview, None, dry_run)
            if isinstance(body, dict) and not (body.get("metadata") or {}).get("name"):
                body = {**body, "metadata": {**(body.get("metadata") or {}), "name": preview["metadata"]["name"]}}
            obj = self.store.create(rt, namespace, body, dry_run=dry_run, strict=strict)
            self._after_write(rt, obj, dry_run)
            return self._respond(obj, warnings, status=201)
        assert name is not None
        if verb == "delete":
            opts = body or {}
            current = self.store.get(rt, namespace, name)
            warnings = await self._admit(user, operation, rt, namespace, name, None, None, current, dry_run)
            propagation = q.get("propagationPolicy") or opts.get("propagationPolicy")
            obj = self.store.delete(rt, namespace, name, propagation,
                                    (opts.get("preconditions") or {}).get("resourceVersion"))
            return self._respond(obj, warnings)
        change = (lambda _cur: body) if verb == "update" else self._patcher(request.content_type, body)
        for _ in range(10):  # admit the change on a preview, apply it only to the object admission saw
            old = self.store.get(rt, namespace, name)
            preview = self.store.update(rt, namespace, name, change, subresource, True, strict,
                                        if_version=old["metadata"]["resourceVersion"])
            warnings = await self._admit(user, operation, rt, namespace, name, subresource, preview, old, dry_run)
            try:
                obj = self.store.update(rt, namespace, name, change, subresource, dry_run, strict,
                                        if_version=old["metadata"]["resourceVersion"])
                break
            except Changed:
                continue
        else:
            raise ApiError(409, "Conflict", f"{rt.plural} {name!r} kept changing while it was admitted; try again")
        self._after_write(rt, obj, dry_run)
        return self._respond(obj, warnings)

    @staticmethod
    def _respond(obj: Obj, warnings: list[str], status: int = 200) -> aiohttp.web.Response:
        """A JSON answer with one `Warning: 299 - "..."` header per admission warning (kubectl prints them)."""
        response = aiohttp.web.json_response(obj, status=status)
        for warning in warnings:
            response.headers.add("Warning", '299 - "' + warning.replace('"', "'").replace("\n", " ") + '"')
        return response

    def _after_write(self, rt: ResourceType, obj: Obj, dry_run: bool) -> None:
        if rt.plural == "customresourcedefinitions" and not dry_run:
            self.store.register_crd(obj)

    @staticmethod
    def _patcher(content_type: str, body: Any) -> Any:
        if content_type == "application/json-patch+json":
            return lambda cur: json_patch(cur, body)
        if content_type == "application/merge-patch+json":
            return lambda cur: merge_patch(cur, body)
        if content_type == "application/strategic-merge-patch+json":
            return lambda cur: merge_patch(cur, strip_directives(body))
        raise ApiError(415, "UnsupportedMediaType",
                       f"patch content type {content_type!r} is not supported by the emulator: use "
                       f"application/json-patch+json, merge-patch+json or strategic-merge-patch+json "
                       f"(server-side apply is not emulated; use client-side kubectl apply)")

    async def _watch(self, request: aiohttp.web.Request, rt: ResourceType,
                     namespace: str | None) -> aiohttp.web.StreamResponse:
        q = request.query
        labels, fields = q.get("labelSelector"), q.get("fieldSelector")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(q.get("timeoutSeconds") or 3600)
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        start = q.get("resourceVersion") or "0"
        if start == "0":  # no resourceVersion: the current state first, as synthetic ADDED events
            items, rv = self.store.list(rt, namespace, labels, fields)
            for item in items:
                await response.write(json.dumps({"type": "ADDED", "object": item}).encode() + b"\n")
        else:
            rv = int(start)
        try:
            while not self._closing and loop.time() < deadline:
                tick = self._tick
                assert tick is not None
                for event in self.store.events_after(rt, rv, namespace, labels, fields):
                    await response.write(json.dumps({"type": event.type, "object": event.obj}).encode() + b"\n")
                    rv = event.rv
                try:
                    await asyncio.wait_for(tick.wait(), timeout=max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    break
            await response.write_eof()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass  # the client went away (operator stopped): nothing to finish
        return response

    # ---- discovery ---------------------------------------------------------------------------------
    def _discovery(self, parts: list[str]) -> Obj | None:
        types = list(self.store.types.values())
        if parts == []:
            paths = {"/api", "/api/v1", "/apis", "/version"}
            paths |= {f"/apis/{rt.group}/{rt.version}" for rt in types if rt.group}
            return {"paths": sorted(paths)}
        if parts == ["version"]:
            return {"major": "1", "minor": "33", "gitVersion": "v1.33.0-emulator", "platform": "linux/amd64"}
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if parts == ["apis"]:
            groups = sorted({rt.group for rt in types if rt.group})
            return {"apiVersion": "v1", "kind": "APIGroupList", "groups": [self._group(g) for g in groups]}
        if len(parts) == 2 and parts[0] == "apis":
            if not any(rt.group == parts[1] for rt in types):
                raise ApiError(404, "NotFound", f"the server could not find the requested group {parts[1]}")
            return {"apiVersion": "v1", **self._group(parts[1])}
        if (len(parts) == 2 and parts[0] == "api") or (len(parts) == 3 and parts[0] == "apis"):
            group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
            served = [rt for rt in types if (rt.group, rt.version) == (group, version)]
            if not served:
                raise ApiError(404, "NotFound", f"the server could not find the requested version {parts}")
            resources: list[Obj] = []
            for rt in served:
                resources.append({"name": rt.plural, "singularName": _singular(rt), "namespaced": rt.namespaced,
                                  "kind": rt.kind, "verbs": _VERBS, "shortNames": list(rt.short_names),
                                  "categories": list(rt.categories)})
                if rt.status_subresource:
                    resources.append({"name": f"{rt.plural}/status", "singularName": "", "kind": rt.kind,
                                      "namespaced": rt.namespaced, "verbs": ["get", "patch", "update"]})
            return {"apiVersion": "v1", "kind": "APIResourceList", "resources": resources,
                    "groupVersion": f"{group}/{version}" if group else version}
        return None

    def _group(self, group: str) -> Obj:
        versions = sorted({rt.version for rt in self.store.types.values() if rt.group == group},
                          key=_version_priority, reverse=True)
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"kind": "APIGroup", "name": group, "versions": entries, "preferredVersion": entries[0]}
