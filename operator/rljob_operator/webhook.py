"""The validating admission webhook: an invalid RLJob is refused at `kubectl apply` with `rljob validate`'s messages.

The API server sends an AdmissionReview (admission.k8s.io/v1) for every CREATE and UPDATE of an RLJob
that the chart's ValidatingWebhookConfiguration matches; kopf serves it (`@kopf.on.validate`) and
`review` answers it with `validation.check_rljob`, the checks of `rljob validate` and of the
operator's Validated condition. Updates that leave spec alone (kopf's own annotation writes,
labels, a finalizer removed) are allowed, so an RLJob created before the webhook existed can still
be handled and deleted.

The serving certificate comes from one of two places (`WebhookSettings`):
- a folder with tls.crt/tls.key (cert-manager's Certificate mounted from its Secret; kopf reloads
  the files when they change, cert-manager's CA injector fills the configuration's caBundle);
- self-signed by the operator: a CA and a serving certificate for the webhook Service's DNS names,
  kept in a Secret so that every replica serves the same one; the operator writes the CA into the
  configuration's caBundle and checks both every `RECHECK_SECONDS` (renewing before expiry).

The chart owns the ValidatingWebhookConfiguration (failurePolicy, timeout, namespace selector are
its values); kopf's "managed" mode is not used because it writes its own fixed failurePolicy and
timeout. kopf refuses to start with an admission handler and no server, so `register` adds the
handler only when the operator serves a webhook. Pure parts: `review`, `denial_message`,
`build_self_signed`, `bundle_problem`. The time to answer each request is the metric
`rljob_webhook_duration_seconds{operation,allowed}` (bench.operator_scale reads it).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import logging
import pathlib
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import kopf
from prometheus_client import Histogram

from rljob_operator import api, metrics
from rljob_operator.kube import KubeApiError, KubeClient, resource_path
from rljob_operator.settings import WebhookSettings
from rljob_operator.validation import check_rljob

Obj = dict[str, Any]
log = logging.getLogger(__name__)

#: kopf serves a handler at /<id>: the chart's clientConfig.service.path is "/validate-rljob".
HANDLER_ID = "validate-rljob"
TLS_CERT, TLS_KEY, CA_CERT = "tls.crt", "tls.key", "ca.crt"
#: How often the self-signed Secret and the configuration's caBundle are checked again.
RECHECK_SECONDS = 300.0
#: Self-signed certificates: the CA lives 10 years, the serving certificate 1 year, renewed 30 days early.
CA_DAYS, SERVING_DAYS, RENEW_BEFORE_DAYS = 3650, 365, 30
VWC_API = "admissionregistration.k8s.io/v1"
#: Time from a well-formed AdmissionReview read to its answer, on the operator's side (queueing behind other
#: work of the event loop included; the TLS handshake and the network not).
WEBHOOK_SECONDS = Histogram(
    "rljob_webhook_duration_seconds", "Time the operator took to answer one admission request, by operation "
    "and answer (allowed true/false, or error).", ["operation", "allowed"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=metrics.REGISTRY)


# ------------------------------------------------------------------------------------------ review


@dataclass(frozen=True)
class Decision:
    """The answer to one admission request."""

    allowed: bool
    message: str = ""
    warnings: tuple[str, ...] = ()


def denial_message(obj: Mapping[str, Any], errors: list[str]) -> str:
    """The refusal as `rljob validate` prints it: a count, then one problem per line."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    name = meta.get("name") or meta.get("generateName") or "<unnamed>"
    count = f"{len(errors)} problem{'s' if len(errors) != 1 else ''}"
    return f"RLJob {name!r} is invalid ({count}):\n" + "\n".join(f"  - {problem}" for problem in errors)


def review(obj: Any, old: Any, operation: str | None) -> Decision:
    """Allow or refuse one RLJob CREATE/UPDATE (other operations are allowed); warnings ride along."""
    if operation not in ("CREATE", "UPDATE"):
        return Decision(True)
    if not isinstance(obj, dict):
        return Decision(False, "the admission request carries no RLJob object (request.object); this is a bug "
                               "of the API server or of a proxy in between")
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    if operation == "UPDATE" and isinstance(old, dict) and (meta.get("deletionTimestamp")
                                                           or obj.get("spec") == old.get("spec")):
        return Decision(True)  # metadata or status only: never block handling or deleting an existing job
    report = check_rljob(obj)
    warnings = tuple(f"spec check: {w}" for w in report.warnings)
    if report.errors:
        return Decision(False, denial_message(obj, report.errors), warnings)
    return Decision(True, warnings=warnings)


async def validate_rljob(body: kopf.Body, old: kopf.Body | None, operation: str | None, warnings: list[str],
                         **_: Any) -> None:
    """kopf's validating handler: raise AdmissionError (HTTP 422 to the user) for an invalid RLJob.

    A coroutine on purpose: kopf runs a plain function in its thread pool, and the hop there and back
    (one GIL, so no parallelism to gain) cost 15-20% of the reviews per second at 50 in flight over kept
    connections (bench.operator_scale). The checks (a few ms, CPU only) run on the event loop instead.
    """
    plain = {k: v for k, v in body.items()}
    decision = review(plain, dict(old) if old is not None else None, operation)
    warnings.extend(decision.warnings)
    if not decision.allowed:
        raise kopf.AdmissionError(decision.message, code=422)


def review_problem(data: Any) -> str | None:
    """Why a decoded request body is no AdmissionReview v1 this server can answer (None: it is one)."""
    if not isinstance(data, dict):
        return f"expected an AdmissionReview object, got {type(data).__name__}"
    if data.get("apiVersion") != "admission.k8s.io/v1" or data.get("kind") != "AdmissionReview":
        return (f"expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got "
                f"{data.get('apiVersion')!r}/{data.get('kind')!r}; list v1 in admissionReviewVersions")
    request = data.get("request")
    if not isinstance(request, dict):
        return "AdmissionReview.request is missing or not an object"
    resource = request.get("resource")
    if not isinstance(resource, dict) or not all(isinstance(resource.get(k), str)
                                                 for k in ("group", "version", "resource")):
        return "AdmissionReview.request.resource must hold group, version and resource strings"
    if not isinstance(request.get("uid"), str) or not isinstance(request.get("userInfo"), dict):
        return "AdmissionReview.request needs a uid (string) and userInfo (object)"
    if not isinstance(request.get("object"), dict) and not isinstance(request.get("oldObject"), dict):
        return "AdmissionReview.request has neither object nor oldObject"
    return None


class AdmissionServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server, answering malformed requests with 400 instead of an exception."""

    @staticmethod
    async def _serve(fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        try:
            data = json.loads(await request.text())
        except (ValueError, UnicodeDecodeError) as err:
            return aiohttp.web.json_response({"error": f"the body is not JSON: {err}"}, status=400)
        problem = review_problem(data)
        if problem is None and request.match_info.get("id") != HANDLER_ID:
            problem = f"no webhook at {request.path}; the configuration's clientConfig path must be /{HANDLER_ID}"
        if problem is not None:
            log.warning("refused a malformed admission request: %s", problem)
            return aiohttp.web.json_response({"error": problem}, status=400)
        operation = str(data["request"].get("operation") or "")
        started = time.perf_counter()
        try:
            peer = request.transport.get_extra_info("peercert") if request.transport else None
            answer = await fn(data, webhook=request.match_info.get("id"), headers=dict(request.headers), sslpeer=peer)
            allowed = "true" if (answer.get("response") or {}).get("allowed") else "false"
            return aiohttp.web.json_response(answer)
        except Exception as err:  # noqa: BLE001 - an admission request must never take the server down
            allowed = "error"
            log.exception("admission request %s failed", data["request"].get("uid"))
            return aiohttp.web.json_response({"error": f"{type(err).__name__}: {err}"}, status=500)
        finally:
            WEBHOOK_SECONDS.labels(operation=operation, allowed=allowed).observe(time.perf_counter() - started)


def register() -> None:
    """Add the validating handler and the certificate start-up (call before kopf.run, only with a webhook)."""
    kopf.on.validate(api.GROUP, api.VERSION, api.PLURAL, id=HANDLER_ID, operations=["CREATE", "UPDATE"])(
        validate_rljob)  # type: ignore[arg-type]  # kopf's WebhookFn spells out every kwarg; this takes **_
    kopf.on.startup(id="webhook-server")(start_webhook)
    kopf.on.cleanup(id="webhook-server")(stop_webhook)


# ------------------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class TlsBundle:
    """PEM bytes of a CA, a serving certificate it signed and that certificate's key."""

    ca: bytes
    cert: bytes
    key: bytes


def build_self_signed(dns_names: list[str], now: datetime.datetime) -> TlsBundle:
    """A new CA and a serving certificate for `dns_names` (IP addresses become IP SANs); ECDSA P-256."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rljob-operator webhook CA")])
    start = now - datetime.timedelta(minutes=5)  # tolerate clock skew between the operator and API servers
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start)
          .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    sans: list[x509.GeneralName] = []
    for name in dns_names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(now + datetime.timedelta(days=SERVING_DAYS))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return TlsBundle(ca=ca.public_bytes(pem), cert=cert.public_bytes(pem), key=key_pem)


def bundle_problem(bundle: TlsBundle, dns_names: list[str], now: datetime.datetime) -> str | None:
    """Why a stored bundle cannot serve (None: it can): unreadable, not the CA's, too old, names missing."""
    from cryptography import x509

    try:
        ca, cert = x509.load_pem_x509_certificate(bundle.ca), x509.load_pem_x509_certificate(bundle.cert)
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except Exception as err:  # noqa: BLE001 - any parse or signature failure means "make a new one"
        return f"unreadable or not signed by its CA ({type(err).__name__})"
    held = {str(n) for n in sans.get_values_for_type(x509.DNSName)}
    held |= {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    missing = [n for n in dns_names if n not in held]
    if missing:
        return f"not issued for {', '.join(missing)}"
    if min(cert.not_valid_after_utc, ca.not_valid_after_utc) - now < datetime.timedelta(days=RENEW_BEFORE_DAYS):
        return f"expires on {cert.not_valid_after_utc:%Y-%m-%d}"
    return None


def _secret_bundle(secret: Obj) -> TlsBundle | None:
    data = secret.get("data") or {}
    try:
        return TlsBundle(*(base64.b64decode(data[k]) for k in (CA_CERT, TLS_CERT, TLS_KEY)))
    except (KeyError, ValueError, TypeError):
        return None


def _secret(name: str, namespace: str, bundle: TlsBundle, resource_version: str | None = None) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace,
                 "labels": {"app.kubernetes.io/managed-by": "rljob-operator",
                            "app.kubernetes.io/component": "webhook-certificate"}}
    if resource_version:
        meta["resourceVersion"] = resource_version
    data = {CA_CERT: bundle.ca, TLS_CERT: bundle.cert, TLS_KEY: bundle.key}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


async def ensure_serving_secret(client: KubeClient, ws: WebhookSettings, now: datetime.datetime) -> TlsBundle:
    """The self-signed bundle from the Secret, created or renewed when missing or unusable.

    Replicas race safely: a create that finds the Secret (409), or a replace that finds it changed
    (409), reads again and uses what the other replica wrote.
    """
    assert ws.secret and ws.namespace
    path = resource_path("v1", "secrets", ws.namespace, ws.secret)
    for _ in range(3):
        try:
            current: Obj | None = await client.request("GET", path)
        except KubeApiError as err:
            if err.code != 404:
                raise
            current = None
        bundle = _secret_bundle(current) if current else None
        problem = bundle_problem(bundle, ws.dns_names(), now) if bundle else "missing"
        if problem is None and bundle is not None:
            return bundle
        log.info("webhook certificate in Secret %s/%s: %s; issuing a new self-signed one", ws.namespace,
                 ws.secret, problem)
        fresh = build_self_signed(ws.dns_names(), now)
        try:
            if current is None:
                await client.request("POST", resource_path("v1", "secrets", ws.namespace),
                                     _secret(ws.secret, ws.namespace, fresh))
            else:
                await client.request("PUT", path, _secret(ws.secret, ws.namespace, fresh,
                                                          current["metadata"].get("resourceVersion")))
            return fresh
        except KubeApiError as err:
            if err.code != 409:
                raise
    raise RuntimeError(f"Secret {ws.namespace}/{ws.secret} keeps changing under the operator; is another "
                       "program writing it? Give the webhook a Secret of its own (--webhook-secret)")


async def patch_ca_bundle(client: KubeClient, configuration: str, ca: bytes, service: str | None,
                          namespace: str | None) -> int:
    """Set caBundle on the configuration's webhooks that call our Service; returns how many changed."""
    path = resource_path(VWC_API, "validatingwebhookconfigurations", None, configuration)
    vwc = await client.request("GET", path)
    encoded = base64.b64encode(ca).decode()
    ops: list[Obj] = []
    for i, hook in enumerate(vwc.get("webhooks") or []):
        config = hook.get("clientConfig") or {}
        target = config.get("service") or {}
        if service and (target.get("name"), target.get("namespace")) != (service, namespace):
            continue
        if config.get("caBundle") == encoded:
            continue
        # `test` first: the list may have been reordered since we read it.
        ops += [{"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")},
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded}]
    if ops:
        await client.request("PATCH", path, ops, "application/json-patch+json")
    return len(ops) // 2


# ------------------------------------------------------------------------------------ start / stop


async def _write_files(folder: pathlib.Path, bundle: TlsBundle) -> None:
    for name, data in ((TLS_CERT, bundle.cert), (TLS_KEY, bundle.key)):
        target = folder / name
        if not target.exists() or target.read_bytes() != data:
            tmp = folder / f".{name}.tmp"
            tmp.write_bytes(data)
            tmp.chmod(0o600)
            tmp.replace(target)


async def _keep_self_signed(client: KubeClient, ws: WebhookSettings, folder: pathlib.Path) -> None:
    """Every RECHECK_SECONDS: renew the Secret when needed, reload the files, re-set the caBundle."""
    while True:
        await asyncio.sleep(RECHECK_SECONDS)
        try:
            bundle = await ensure_serving_secret(client, ws, datetime.datetime.now(datetime.timezone.utc))
            await _write_files(folder, bundle)  # kopf's server restarts with them (file_check_interval)
            if ws.configuration:
                await patch_ca_bundle(client, ws.configuration, bundle.ca, ws.service, ws.namespace)
        except Exception as err:  # noqa: BLE001 - keep serving the current certificate, try again later
            log.warning("checking the webhook certificate failed: %s; retrying in %.0f s", err, RECHECK_SECONDS)


async def start_webhook(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    """Prepare the serving certificate and hand kopf the HTTPS server (kopf starts it after start-up)."""
    ws: WebhookSettings = memo.settings.webhook
    if ws.cert_dir is not None:
        certfile, keyfile = ws.cert_dir / TLS_CERT, ws.cert_dir / TLS_KEY
        for path in (certfile, keyfile):
            if not path.is_file():
                raise kopf.PermanentError(f"--webhook-cert-dir {ws.cert_dir}: {path.name} is missing; mount the "
                                          "Secret of the webhook's Certificate there (cert-manager writes "
                                          "tls.crt and tls.key)")
    else:
        client: KubeClient = memo.runtime.client  # opened by handlers.startup, registered before this one
        bundle = await ensure_serving_secret(client, ws, datetime.datetime.now(datetime.timezone.utc))
        folder = pathlib.Path(tempfile.mkdtemp(prefix="rljob-webhook-"))
        memo.webhook_folder = folder  # holds the private key: removed again by stop_webhook
        await _write_files(folder, bundle)
        certfile, keyfile = folder / TLS_CERT, folder / TLS_KEY
        if ws.configuration:
            changed = await patch_ca_bundle(client, ws.configuration, bundle.ca, ws.service, ws.namespace)
            log.info("webhook configuration %s: caBundle set on %d webhook(s)", ws.configuration, changed)
        memo.webhook_task = asyncio.create_task(_keep_self_signed(client, ws, folder))
    settings.admission.server = AdmissionServer(addr=ws.address, port=ws.port, certfile=certfile,
                                                pkeyfile=keyfile, file_check_interval=30.0)
    settings.admission.managed = None  # the chart owns the ValidatingWebhookConfiguration
    log.info("serving the RLJob validating webhook on https://%s:%d/%s", ws.address, ws.port, HANDLER_ID)


async def stop_webhook(memo: Any, **_: Any) -> None:
    """Stop the certificate re-check task and remove the self-signed certificate's files."""
    task = getattr(memo, "webhook_task", None)
    if task is not None:
        task.cancel()
    folder = getattr(memo, "webhook_folder", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
