"""The operator's one Kubernetes API client: a small aiohttp client with only the verbs we use.

Credentials: the in-cluster service account when running in a pod (KUBERNETES_SERVICE_HOST set and the
token mounted), else the current context of $KUBECONFIG (or ~/.kube/config): token, client
certificate, CA, insecure-skip-tls-verify. kopf logs in on its own for its watches; this client is
for our reads/writes (children, status, Events) and is created once at start-up.
"""

from __future__ import annotations

import base64
import datetime
import os
import pathlib
import socket
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from hybridflow import yamlio

Obj = dict[str, Any]
SA_DIR = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
COMPONENT = "rljob-operator"


class KubeApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, code: int, reason: str, message: str, verb: str, path: str) -> None:
        """Keep the HTTP code, Kubernetes reason and message, and what was asked."""
        super().__init__(f"{verb} {path}: HTTP {code} {reason}: {message}")
        self.code, self.reason, self.message = code, reason, message


@dataclass
class Credentials:
    """Where the API server is and how to authenticate to it."""

    server: str
    token: str | None = None
    token_file: pathlib.Path | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False


def _data_file(data: str) -> str:
    """Write base64 kubeconfig `*-data` to a private temp file (ssl wants file names)."""
    handle = tempfile.NamedTemporaryFile(prefix="rljob-kube-", delete=False)  # noqa: SIM115
    handle.write(base64.b64decode(data))
    handle.close()
    os.chmod(handle.name, 0o600)
    return handle.name


def load_credentials(kubeconfig: str | None = None) -> Credentials:
    """In-cluster service account, or the current context of a kubeconfig file."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    if not path and os.environ.get("KUBERNETES_SERVICE_HOST") and (SA_DIR / "token").exists():
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host
        return Credentials(server=f"https://{host}:{port}", token_file=SA_DIR / "token",
                           ca_file=str(SA_DIR / "ca.crt"))
    path = path or str(pathlib.Path.home() / ".kube" / "config")
    if not pathlib.Path(path).exists():
        raise RuntimeError(f"no Kubernetes credentials: {path} does not exist and this is not a pod; "
                           f"set KUBECONFIG to a kubeconfig file")
    try:
        config = yamlio.read_mapping(path, "kubeconfig settings", file="kubeconfig")
    except yamlio.YamlError as err:
        raise RuntimeError(f"kubeconfig {err}; point KUBECONFIG at a valid kubeconfig file") from None
    ctx_name = config.get("current-context")
    ctx = next((c["context"] for c in config.get("contexts", []) if c["name"] == ctx_name), None)
    if ctx is None:
        raise RuntimeError(f"kubeconfig {path}: current-context {ctx_name!r} is not defined; "
                           f"run `kubectl config use-context NAME`")
    cluster = next(c["cluster"] for c in config.get("clusters", []) if c["name"] == ctx["cluster"])
    user: Obj = next((u["user"] for u in config.get("users", []) if u["name"] == ctx.get("user")), {}) or {}
    return Credentials(
        server=cluster["server"].rstrip("/"),
        token=user.get("token"),
        token_file=pathlib.Path(user["tokenFile"]) if user.get("tokenFile") else None,
        ca_file=cluster.get("certificate-authority") or (
            _data_file(cluster["certificate-authority-data"]) if cluster.get("certificate-authority-data") else None),
        cert_file=user.get("client-certificate") or (
            _data_file(user["client-certificate-data"]) if user.get("client-certificate-data") else None),
        key_file=user.get("client-key") or (
            _data_file(user["client-key-data"]) if user.get("client-key-data") else None),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
    )


def resource_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None,
                  subresource: str | None = None) -> str:
    """The REST path of a collection or object, e.g. /apis/ray.io/v1/namespaces/ns/rayjobs/x/status."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [base] + ([f"namespaces/{namespace}"] if namespace else []) + [plural]
    parts += [name] if name else []
    parts += [subresource] if subresource else []
    return "/".join(parts)


PLURALS = {"ConfigMap": "configmaps", "RayJob": "rayjobs", "RLJob": "rljobs", "Event": "events",
           "ClusterKopfPeering": "clusterkopfpeerings", "KopfPeering": "kopfpeerings"}


class KubeClient:
    """Async client: get/list/create/patch/delete/post_event; errors raise KubeApiError."""

    def __init__(self, credentials: Credentials, on_error: Callable[[str, int], None] | None = None) -> None:
        """Prepare the client; `on_error(verb, code)` is called for every failed request (metrics)."""
        self.credentials = credentials
        self.on_error = on_error
        self._session: aiohttp.ClientSession | None = None
        self._token: str | None = credentials.token
        self._token_read = 0.0

    async def __aenter__(self) -> KubeClient:
        """Open the HTTP session."""
        creds = self.credentials
        ssl_ctx: ssl.SSLContext | bool = False if creds.insecure else ssl.create_default_context(cafile=creds.ca_file)
        if isinstance(ssl_ctx, ssl.SSLContext) and creds.cert_file:
            ssl_ctx.load_cert_chain(creds.cert_file, creds.key_file)
        connector = aiohttp.TCPConnector(ssl=ssl_ctx if creds.server.startswith("https") else False, limit=32)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30))
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()

    def _auth(self) -> dict[str, str]:
        creds = self.credentials
        # Projected service-account tokens rotate: re-read the file at most once a minute.
        if creds.token_file and time.monotonic() - self._token_read > 60:
            self._token = creds.token_file.read_text().strip()
            self._token_read = time.monotonic()
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def request(self, verb: str, path: str, body: Any = None, content_type: str = "application/json",
                      params: dict[str, str] | None = None) -> Obj:
        """Send one request and return the decoded JSON answer; raise KubeApiError on 4xx/5xx."""
        if self._session is None:
            raise RuntimeError("KubeClient is not open: use `async with KubeClient(...)`")
        headers = {**self._auth(), "Accept": "application/json", "Content-Type": content_type}
        async with self._session.request(verb, self.credentials.server + path, json=body, headers=headers,
                                         params=params) as resp:
            data = await resp.json(content_type=None) if resp.content_length != 0 else {}
            if resp.status >= 400:
                if self.on_error:
                    self.on_error(verb.lower(), resp.status)
                data = data if isinstance(data, dict) else {}
                raise KubeApiError(resp.status, data.get("reason", ""), data.get("message", str(data)), verb, path)
            return data or {}

    async def may(self, verb: str, group: str, resource: str, namespace: str | None = None) -> bool | None:
        """Whether this client's identity may `verb` the resource (a SelfSubjectAccessReview, as `kubectl auth
        can-i` asks); None when the API server does not answer the question."""
        attrs = {"verb": verb, "group": group, "resource": resource, **({"namespace": namespace} if namespace else {})}
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": attrs}}
        try:
            answer = await self.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
        except (KubeApiError, aiohttp.ClientError, TimeoutError):
            return None
        allowed = (answer.get("status") or {}).get("allowed")
        return allowed if isinstance(allowed, bool) else None

    async def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> Obj:
        """Read one object."""
        return await self.request("GET", resource_path(api_version, plural, namespace, name))

    async def list(self, api_version: str, plural: str, namespace: str | None, labels: str | None = None) -> list[Obj]:
        """List objects, optionally by label selector."""
        params = {"labelSelector": labels} if labels else None
        return (await self.request("GET", resource_path(api_version, plural, namespace), params=params))["items"]

    async def create(self, obj: Obj) -> Obj:
        """Create an object (its namespace from metadata)."""
        path = resource_path(obj["apiVersion"], PLURALS[obj["kind"]], obj["metadata"].get("namespace"))
        return await self.request("POST", path, obj)

    async def patch(self, api_version: str, plural: str, namespace: str | None, name: str, patch: Obj,
                    subresource: str | None = None) -> Obj:
        """JSON-merge-patch an object (or its status subresource)."""
        path = resource_path(api_version, plural, namespace, name, subresource)
        return await self.request("PATCH", path, patch, MERGE_PATCH)

    async def delete(self, api_version: str, plural: str, namespace: str | None, name: str,
                     propagation: str = "Background") -> Obj:
        """Delete an object; `propagation` is Background, Foreground or Orphan (for its dependents)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        return await self.request("DELETE", resource_path(api_version, plural, namespace, name), body)

    async def post_event(self, obj: Obj, type_: str, reason: str, message: str,
                         now: datetime.datetime | None = None) -> Obj:
        """Post a core/v1 Event about `obj` (shown by `kubectl describe` and `kubectl get events`)."""
        meta = obj["metadata"]
        stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace") or "default"},
            "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "name": meta["name"],
                               "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "reportingInstance": socket.gethostname(), "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        return await self.create(event)
