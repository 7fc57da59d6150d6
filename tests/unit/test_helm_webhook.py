"""The chart's validating webhook: configuration, certificate sources and RBAC follow the values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from rljob_operator import webhook
from rljob_operator.settings import parse_settings
from tests.support import binaries
from tests.support.helm import CHART, render, template, validate_object

#: The cert-manager.io/v1 fields the chart uses, unknown ones forbidden (cert-manager's CRDs are not here).
_ISSUER_REF = {"type": "object", "additionalProperties": False, "required": ["name"],
               "properties": {"name": {"type": "string"}, "kind": {"enum": ["Issuer", "ClusterIssuer"]},
                              "group": {"type": "string"}}}
CERT_MANAGER = {
    "Issuer": {"type": "object", "required": ["metadata", "spec"], "properties": {"spec": {
        "type": "object", "additionalProperties": False, "properties": {"selfSigned": {"type": "object"}}}}},
    "Certificate": {"type": "object", "required": ["metadata", "spec"], "properties": {"spec": {
        "type": "object", "additionalProperties": False, "required": ["secretName", "dnsNames", "issuerRef"],
        "properties": {"secretName": {"type": "string"}, "duration": {"type": "string"},
                       "renewBefore": {"type": "string"}, "issuerRef": _ISSUER_REF,
                       "dnsNames": {"type": "array", "minItems": 1, "items": {"type": "string"}}}}}},
}  # fmt: skip


@pytest.fixture(scope="module")
def helm() -> Path:
    return binaries.ensure("helm")


def _one(objs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    return found


def _container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = _one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _validate_all(objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        if obj["apiVersion"] == "cert-manager.io/v1":
            jsonschema.validate(obj, CERT_MANAGER[obj["kind"]])
        else:
            validate_object(obj)


def test_self_signed_webhook_is_wired_end_to_end(helm: Path) -> None:
    """Service -> container port, clientConfig path -> the handler id, flags -> the objects' names."""
    objs = render(helm, CHART)
    _validate_all(objs)
    vwc = _one(objs, "ValidatingWebhookConfiguration")
    (hook,) = vwc["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["timeoutSeconds"] == 10 and hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"] and "caBundle" not in hook["clientConfig"]
    assert hook["rules"] == [{"apiGroups": ["rl.hybridflow.dev"], "apiVersions": ["v1alpha1"], "resources": ["rljobs"],
                              "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}]
    assert "namespaceSelector" not in hook  # every namespace, as the operator serves every namespace
    target = hook["clientConfig"]["service"]
    assert target["path"] == f"/{webhook.HANDLER_ID}"
    service = _one(objs, "Service", "-webhook")
    assert (target["name"], target["namespace"], target["port"]) == (service["metadata"]["name"], "rljob-system",
                                                                    service["spec"]["ports"][0]["port"])
    container = _container(objs)
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"
    assert {"name": "webhook", "containerPort": 9443, "protocol": "TCP"} in container["ports"]
    settings = parse_settings(container["args"], env={"POD_NAMESPACE": "rljob-system"})
    ws = settings.webhook
    assert ws is not None and ws.port == 9443 and ws.cert_dir is None
    assert ws.configuration == vwc["metadata"]["name"] and ws.service == service["metadata"]["name"]
    assert f"{target['name']}.{target['namespace']}.svc" in ws.dns_names()
    # RBAC: that one Secret and that one configuration, nothing wider.
    role = _one(objs, "Role", "-webhook")
    assert role["metadata"]["namespace"] == "rljob-system"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [ws.secret], "verbs": ["get", "update"]}]
    assert _one(objs, "ClusterRole", "-webhook")["rules"] == [
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
         "resourceNames": [vwc["metadata"]["name"]], "verbs": ["get", "patch"]}]
    for binding in (_one(objs, "RoleBinding", "-webhook"), _one(objs, "ClusterRoleBinding", "-webhook")):
        assert binding["subjects"][0]["name"] == _one(objs, "ServiceAccount")["metadata"]["name"]


@pytest.mark.parametrize(("values", "selector"), [
    ({"watchNamespaces": ["team-a", "team-b"]},
     {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}),
    ({"webhook": {"namespaceSelector": {"matchLabels": {"rljob.example/validate": "true"}}}},
     {"matchLabels": {"rljob.example/validate": "true"}}),
])  # fmt: skip
def test_namespace_selector_and_policy_follow_the_values(helm: Path, values: dict[str, Any],
                                                         selector: dict[str, Any]) -> None:
    values = {**values, "webhook": {**values.get("webhook", {}), "failurePolicy": "Ignore", "timeoutSeconds": 3}}
    (hook,) = _one(render(helm, CHART, values), "ValidatingWebhookConfiguration")["webhooks"]
    assert hook["namespaceSelector"] == selector
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 3)


@pytest.mark.parametrize("issuer", [{}, {"kind": "ClusterIssuer", "name": "internal-ca"}], ids=["own-issuer", "given"])
def test_cert_manager_certificate_is_mounted_and_injected(helm: Path, issuer: dict[str, Any]) -> None:
    objs = render(helm, CHART, {"webhook": {"certificate": {"source": "cert-manager",
                                                            "certManager": {"issuerRef": issuer}}}})
    _validate_all(objs)
    cert = _one(objs, "Certificate")
    vwc = _one(objs, "ValidatingWebhookConfiguration")
    ns, name = vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].split("/")
    assert (ns, name) == (cert["metadata"]["namespace"], cert["metadata"]["name"])
    target = vwc["webhooks"][0]["clientConfig"]["service"]
    assert f"{target['name']}.{target['namespace']}.svc" in cert["spec"]["dnsNames"]
    issuers = [o for o in objs if o["kind"] == "Issuer"]
    if issuer:
        assert cert["spec"]["issuerRef"] == issuer and not issuers
    else:
        assert cert["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuers[0]["metadata"]["name"]}
    container = _container(objs)
    ws = parse_settings(container["args"], env={}).webhook
    assert ws is not None and ws.secret is None and ws.cert_dir is not None
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "webhook-tls"]
    assert mount["mountPath"] == str(ws.cert_dir) and mount["readOnly"] is True
    (volume,) = [v for v in _one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "webhook-tls"]
    assert volume["secret"]["secretName"] == cert["spec"]["secretName"]
    assert not [o for o in objs if o["metadata"]["name"].endswith("-webhook") and "Role" in o["kind"]], \
        "cert-manager mode needs no Secret or configuration grants"


def test_disabled_webhook_leaves_nothing_behind(helm: Path) -> None:
    objs = render(helm, CHART, {"webhook": {"enabled": False}})
    assert not [o for o in objs if o["kind"] in ("ValidatingWebhookConfiguration", "Certificate", "Issuer")]
    assert not [o for o in objs if "webhook" in o["metadata"]["name"]]
    container = _container(objs)
    assert parse_settings(container["args"], env={}).webhook is None
    assert "POD_NAMESPACE" not in {e["name"] for e in container["env"]}


@pytest.mark.parametrize(("values", "needle"), [
    ({"webhook": {"failurePolicy": "Sometimes"}}, "/webhook/failurePolicy'"),
    ({"webhook": {"timeoutSeconds": 31}}, "/webhook/timeoutSeconds': maximum"),
    ({"webhook": {"certificate": {"source": "vault"}}}, "/webhook/certificate/source'"),
    ({"webhook": {"port": 443}}, "/webhook/port': minimum"),
    ({"webhook": {"namespaceSelector": {"matchLabel": {"a": "b"}}}}, "additional properties 'matchLabel' not allowed"),
])  # fmt: skip
def test_bad_webhook_values_are_refused(helm: Path, values: dict[str, Any], needle: str) -> None:
    result = template(helm, CHART, values)
    assert result.returncode != 0 and needle in result.stderr, result.stderr
