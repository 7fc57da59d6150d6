"""Validating admission webhooks for the API emulator, called over HTTPS as the API server calls them.

What the API server does (https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/)
and this does too: after the object is decoded, defaulted and schema/CEL-validated, every webhook of
every ValidatingWebhookConfiguration whose rules match (apiGroups, apiVersions, resources with
subresources, operations, scope), whose namespaceSelector matches the namespace's labels and whose
objectSelector matches the object's labels gets an AdmissionReview v1 (uid, kind, resource,
subResource, name, namespace, operation, userInfo, object, oldObject, dryRun). TLS is verified against
the webhook's caBundle (or the system roots without one), for the Service's DNS name
`<name>.<namespace>.svc` (clientConfig.service) or the URL's host (clientConfig.url); the call is
cancelled after timeoutSeconds (default 10). A denial becomes the user's error (`admission webhook
"<name>" denied the request: <message>`, the webhook's code, 400 when it gives none); a webhook that
cannot be called, answers garbage or times out refuses the request with failurePolicy Fail (500,
`failed calling webhook`) and is skipped with Ignore. Warnings are returned for `Warning` headers.

Services do not resolve here: `endpoints[(namespace, name)] = (host, port)` says where a Service's
pods listen (the port named in clientConfig.service.port is that Service's port, mapped there).
matchConditions are CEL expressions over `request` (the AdmissionRequest), `object` and `oldObject`
(cel-python, as the CRD rules): the webhook is called only when all are true; one that cannot be evaluated
fails as the call would (failurePolicy). `authorizer` is not offered to them.
Not emulated: mutating webhooks, reinvocation, matchPolicy Exact vs Equivalent (one version per group is
served), admissionReviewVersions other than v1.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp

from . import kube_schema
from .kube_rbac import User
from .kube_store import ApiError, ResourceType, match_labels

Obj = dict[str, Any]


@dataclass
class Attributes:
    """One write as admission sees it."""

    operation: str  # CREATE, UPDATE or DELETE
    rt: ResourceType
    namespace: str | None
    name: str
    subresource: str | None
    obj: Obj | None
    old: Obj | None
    user: User
    dry_run: bool = False


@dataclass
class Call:
    """A record of one webhook call (for tests): who, what came of it, how long it took."""

    webhook: str
    outcome: str  # allowed, denied, failed-closed, failed-open
    detail: str
    seconds: float


def selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) against labels."""
    if not selector:
        return True
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], ",".join(expr.get("values") or [])
        terms.append({"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key,
                      "DoesNotExist": f"!{key}"}[op])
    return match_labels(labels, ",".join(terms))


def _resource_matches(granted: str, resource: str, subresource: str | None) -> bool:
    full = f"{resource}/{subresource}" if subresource else resource
    if granted in ("*/*", full):
        return True
    if granted == "*":
        return subresource is None
    head, _, tail = granted.partition("/")
    return bool(tail) and subresource is not None and head in ("*", resource) and tail in ("*", subresource)


def rule_matches(rule: Obj, attrs: Attributes) -> bool:
    """Whether one RuleWithOperations covers the write."""
    rt = attrs.rt
    if not any(g in ("*", rt.group) for g in rule.get("apiGroups") or []):
        return False
    if not any(v in ("*", rt.version) for v in rule.get("apiVersions") or []):
        return False
    if not any(o in ("*", attrs.operation) for o in rule.get("operations") or []):
        return False
    if not any(_resource_matches(r, rt.plural, attrs.subresource) for r in rule.get("resources") or []):
        return False
    scope = rule.get("scope", "*")
    return scope == "*" or scope == ("Namespaced" if rt.namespaced else "Cluster")


class Admission:
    """Calls the validating webhooks that match a write; `validate` raises ApiError to refuse it."""

    def __init__(self) -> None:
        """No Service endpoints known yet; no calls made."""
        self.endpoints: dict[tuple[str, str], tuple[str, int]] = {}
        self.calls: list[Call] = []
        self.skipped = 0  # writes a webhook's matchConditions kept away from it (not calls)

    def matching(self, configurations: list[Obj], namespace_labels: dict[str, str] | None,
                 attrs: Attributes) -> list[Obj]:
        """The webhooks (in configuration-name order) that this write must be sent to."""
        hooks = []
        for vwc in sorted(configurations, key=lambda c: c["metadata"]["name"]):
            for hook in vwc.get("webhooks") or []:
                if not any(rule_matches(rule, attrs) for rule in hook.get("rules") or []):
                    continue
                if attrs.rt.namespaced and not selector_matches(hook.get("namespaceSelector"), namespace_labels or {}):
                    continue
                if attrs.rt.gk == ("", "namespaces") and not selector_matches(
                        hook.get("namespaceSelector"), ((attrs.obj or attrs.old or {}).get("metadata") or {}).get("labels") or {}):
                    continue
                objects = [o for o in (attrs.obj, attrs.old) if o is not None]
                if not any(selector_matches(hook.get("objectSelector"), (o.get("metadata") or {}).get("labels") or {})
                           for o in objects):
                    continue
                hooks.append(hook)
        return hooks

    async def validate(self, configurations: list[Obj], namespace_labels: dict[str, str] | None,
                       attrs: Attributes) -> list[str]:
        """Call every matching webhook (in parallel, as the API server does); return their warnings."""
        hooks = self.matching(configurations, namespace_labels, attrs)
        if not hooks:
            return []
        results = await asyncio.gather(*(self._one(hook, attrs) for hook in hooks))
        denials = [r for r in results if isinstance(r, ApiError)]
        if denials:
            raise denials[0]
        return [w for r in results if isinstance(r, list) for w in r]

    async def _one(self, hook: Obj, attrs: Attributes) -> list[str] | ApiError:
        name = hook.get("name", "")
        started = time.monotonic()
        review = self._review(attrs)
        try:
            wanted = all(_condition(c.get("expression", ""), {"request": review["request"], "object": attrs.obj,
                                                              "oldObject": attrs.old})
                         for c in hook.get("matchConditions") or [])
        except Exception as err:  # noqa: BLE001 - celpy raises its own error types
            return self._failed(hook, f"matchConditions could not be evaluated: {err}", started)
        if not wanted:
            self.skipped += 1
            return []
        if attrs.dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            return ApiError(400, "BadRequest", f'admission webhook "{name}" does not support dry run')
        try:
            url, target, hostname = self._target(hook)
        except ApiError as err:
            return self._failed(hook, url_error=err.message, started=started)
        timeout = float(hook.get("timeoutSeconds") or 10)
        try:
            ctx = self._ssl(hook)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
                async with session.post(f"{target}?timeout={int(timeout)}s", json=review, ssl=ctx,
                                        server_hostname=hostname) as resp:
                    text = await resp.text()
                    if resp.status != 200:
                        raise RuntimeError(f"the server responded with HTTP {resp.status}: {text[:300]}")
            answer = json.loads(text)
            response = answer["response"]
            if answer.get("apiVersion") != "admission.k8s.io/v1" or answer.get("kind") != "AdmissionReview":
                raise RuntimeError("expected an admission.k8s.io/v1 AdmissionReview response")
            if response.get("uid") != review["request"]["uid"]:
                raise RuntimeError(f"expected response.uid={review['request']['uid']!r}, got {response.get('uid')!r}")
            if not isinstance(response.get("allowed"), bool):
                raise RuntimeError("response.allowed is missing")
        except asyncio.TimeoutError:
            return self._failed(hook, f'Post "{url}?timeout={int(timeout)}s": context deadline exceeded', started)
        except ssl.SSLError as err:
            return self._failed(hook, f'Post "{url}": tls: failed to verify certificate: {err}', started)
        except (aiohttp.ClientError, OSError, ValueError, KeyError, TypeError, RuntimeError) as err:
            return self._failed(hook, f'Post "{url}": {type(err).__name__}: {err}', started)
        warnings = [str(w) for w in response.get("warnings") or []]
        if response["allowed"]:
            self.calls.append(Call(name, "allowed", "", time.monotonic() - started))
            return warnings
        status = response.get("status") or {}
        message = status.get("message") or status.get("reason") or ""
        text = f'admission webhook "{name}" denied the request' + (f": {message}" if message else " without explanation")
        code = status.get("code") if isinstance(status.get("code"), int) and status["code"] >= 400 else 400
        self.calls.append(Call(name, "denied", message, time.monotonic() - started))
        return ApiError(code, status.get("reason") or "", text)

    def _failed(self, hook: Obj, url_error: str, started: float) -> list[str] | ApiError:
        name = hook.get("name", "")
        if hook.get("failurePolicy", "Fail") == "Ignore":
            self.calls.append(Call(name, "failed-open", url_error, time.monotonic() - started))
            return []
        self.calls.append(Call(name, "failed-closed", url_error, time.monotonic() - started))
        return ApiError(500, "InternalError", f'Internal error occurred: failed calling webhook "{name}": '
                                              f"failed to call webhook: {url_error}")

    def _target(self, hook: Obj) -> tuple[str, str, str | None]:
        """(URL as the API server names it, URL actually dialled, TLS server name)."""
        config = hook.get("clientConfig") or {}
        if "url" in config:
            return config["url"], config["url"], None
        service = config.get("service") or {}
        ns, name, port = service.get("namespace"), service.get("name"), int(service.get("port") or 443)
        path = service.get("path") or ""
        host = f"{name}.{ns}.svc"
        url = f"https://{host}:{port}{path}"
        if (ns, name) not in self.endpoints:
            raise ApiError(500, "InternalError", f'Post "{url}": service "{name}" not found')
        addr, local_port = self.endpoints[(ns, name)]
        return url, f"https://{addr}:{local_port}{path}", host

    @staticmethod
    def _ssl(hook: Obj) -> ssl.SSLContext:
        bundle = (hook.get("clientConfig") or {}).get("caBundle")
        if not bundle:
            return ssl.create_default_context()
        return ssl.create_default_context(cadata=base64.b64decode(bundle).decode())

    @staticmethod
    def _review(attrs: Attributes) -> Obj:
        rt = attrs.rt
        kind = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        resource = {"group": rt.group, "version": rt.version, "resource": rt.plural}
        options = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}[attrs.operation]
        request: Obj = {"uid": str(uuid.uuid4()), "kind": kind, "resource": resource, "requestKind": kind,
                        "requestResource": resource, "name": attrs.name, "operation": attrs.operation,
                        "userInfo": attrs.user.info(), "object": attrs.obj, "oldObject": attrs.old,
                        "dryRun": attrs.dry_run, "options": {"apiVersion": "meta.k8s.io/v1", "kind": options}}
        if attrs.subresource:
            request["subResource"] = request["requestSubResource"] = attrs.subresource
        if attrs.namespace:
            request["namespace"] = attrs.namespace
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}



def _condition(expression: str, variables: dict[str, Any]) -> bool:
    """One matchCondition: its CEL expression must give a bool."""
    if kube_schema.celpy is None:
        raise RuntimeError("cel-python is not installed (the dev extra has it)")
    result = kube_schema._program(expression).evaluate(kube_schema.cel_activation(expression, variables))
    if not isinstance(result, kube_schema.celpy.celtypes.BoolType):
        raise ValueError(f"{expression!r} gave {result!r}, not a bool")
    return bool(result)
