"""Operator settings from command-line flags and environment variables (flags win)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from hybridflow import yamlio
from rljob_operator.api import DEFAULT_IMAGE, PodSpec
from rljob_operator.validation import pod_problems

DEFAULT_PEERING = "rljob-operator"
#: The trainer driver's /metrics through KubeRay's head Service ({cluster}: the RayJob's Ray cluster).
TRAINER_METRICS_URL = "http://{cluster}-head-svc.{namespace}.svc:{port}/metrics"


@dataclass(frozen=True)
class WebhookSettings:
    """How the operator serves its webhook (`rljob operator --webhook-*`)."""

    port: int
    address: str = "0.0.0.0"
    #: A folder holding tls.crt and tls.key (e.g. cert-manager's Secret mounted there).
    cert_dir: Path | None = None
    #: Self-signed mode: the Secret (in `namespace`) that keeps the CA and the serving certificate.
    secret: str | None = None
    #: Namespace of the Secret and of the webhook Service (the pod's own, $POD_NAMESPACE).
    namespace: str | None = None
    #: The webhook Service: the certificate is issued for <service>.<namespace>.svc (and its variants).
    service: str | None = None
    #: The ValidatingWebhookConfiguration whose caBundle the operator sets (self-signed mode).
    configuration: str | None = None
    #: More DNS names or IP addresses for the self-signed certificate (e.g. for a test API server).
    extra_sans: tuple[str, ...] = ()

    def dns_names(self) -> list[str]:
        """The names the serving certificate must hold."""
        names = []
        if self.service and self.namespace:
            base = f"{self.service}.{self.namespace}"
            names = [self.service, base, f"{base}.svc", f"{base}.svc.cluster.local"]
        return [*names, *self.extra_sans]



@dataclass(frozen=True)
class Settings:
    """How the operator runs; built once at start-up by `parse_settings`."""

    namespaces: tuple[str, ...] = ()  # empty: every namespace (cluster-wide)
    peering: str | None = DEFAULT_PEERING  # None: standalone (no peering, for one replica)
    priority: int | None = None  # peering priority; None: random per process (see peering.py)
    peering_lifetime: int = 60  # seconds a keep-alive counts; a crashed replica is replaced after it
    metrics_port: int = 8080  # 0: no /metrics and /healthz endpoint
    resync_seconds: float = 60.0  # timer interval: level-based resync and progress reading
    pod_loss_grace_seconds: float = 10.0  # a lost pod counts once its attempt still runs this long after
    trainer_metrics_url: str = TRAINER_METRICS_URL  # template: {cluster} {namespace} {port} {rljob}
    trainer_image: str = DEFAULT_IMAGE  # pods of RLJobs that set no spec.image
    pod_defaults: PodSpec = field(default_factory=PodSpec)  # under every RLJob's spec.pod
    webhook: WebhookSettings | None = None  # None: no admission webhook served (--webhook-port 0)
    verbose: bool = False

    @property
    def clusterwide(self) -> bool:
        """True when no namespace list was given."""
        return not self.namespaces


def _env_namespaces(value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    return () if names in ((), ("*",)) else names


def parser() -> argparse.ArgumentParser:
    """The `rljob operator` argument parser."""
    p = argparse.ArgumentParser(prog="rljob operator", description="Run the RLJob operator (kopf).")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NS",
                       help="watch this namespace (repeat for several; env RLJOB_NAMESPACES=a,b)")
    scope.add_argument("-A", "--all-namespaces", action="store_true",
                       help="watch every namespace (the default when no namespace is given)")
    peer = p.add_mutually_exclusive_group()
    peer.add_argument("--peering", metavar="NAME",
                      help=f"kopf peering object name for running two replicas (default {DEFAULT_PEERING}; "
                           f"env RLJOB_PEERING). Needs kopf's KopfPeering/ClusterKopfPeering CRD installed")
    peer.add_argument("--standalone", action="store_true",
                      help="no peering: for a single replica or a cluster without kopf's peering CRD "
                           "(env RLJOB_STANDALONE=1)")
    p.add_argument("--priority", type=int, metavar="N",
                   help="peering priority: the live replica with the highest one is active (default: random "
                        "per replica, so that equal priorities never pause them all; env RLJOB_PEERING_PRIORITY)")
    p.add_argument("--peering-lifetime", type=int, metavar="S",
                   help="seconds a replica's keep-alive counts: another replica takes over this long after "
                        "the active one crashed (default 60; env RLJOB_PEERING_LIFETIME)")
    p.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="port of /metrics and /healthz (default 8080, 0 disables; env RLJOB_METRICS_PORT)")
    p.add_argument("--resync-seconds", type=float, metavar="S",
                   help="interval of the periodic resync/progress timer (default 60; env RLJOB_RESYNC_SECONDS)")
    p.add_argument("--pod-loss-grace-seconds", type=float, metavar="S",
                   help="a pod of a running attempt that is lost counts (a rollout or sandbox pod as a restart of "
                        "its role, a trainer pod as the attempt's end) once the attempt still runs this long after "
                        "(default 10; env RLJOB_POD_LOSS_GRACE_SECONDS)")
    p.add_argument("--trainer-metrics-url", metavar="TEMPLATE",
                   help="where to read a trainer's Prometheus metrics; {cluster}, {namespace}, {port} and "
                        "{rljob} are filled in (default: the Ray head Service, " + TRAINER_METRICS_URL.replace("%", "%%")
                        + "; env RLJOB_TRAINER_METRICS_URL)")
    p.add_argument("--trainer-image", metavar="IMAGE",
                   help=f"trainer image for RLJobs that set no spec.image (default {DEFAULT_IMAGE}; "
                        "env RLJOB_TRAINER_IMAGE), e.g. a mirror in your own registry")
    p.add_argument("--pod-defaults", metavar="YAML",
                   help="pod settings for every RLJob, in spec.pod's shape (YAML or JSON), e.g. "
                        "'{serviceAccountName: rl-trainer, tolerations: [{key: nvidia.com/gpu, operator: Exists}]}'; "
                        "an RLJob's own spec.pod wins where it sets something (env RLJOB_POD_DEFAULTS)")
    hook = p.add_argument_group("validating admission webhook (docs/operations.md, \"Validation at apply time\")")
    hook.add_argument("--webhook-port", type=int, metavar="PORT",
                      help="serve the RLJob validating webhook over HTTPS on this port (default 0: no webhook; "
                           "env RLJOB_WEBHOOK_PORT)")
    hook.add_argument("--webhook-address", metavar="ADDR", help="address to listen on (default 0.0.0.0)")
    tls = hook.add_mutually_exclusive_group()
    tls.add_argument("--webhook-cert-dir", type=Path, metavar="DIR",
                     help="serve the tls.crt/tls.key found in DIR (e.g. cert-manager's Secret mounted there)")
    tls.add_argument("--webhook-secret", metavar="NAME",
                     help="self-signed: keep a CA and serving certificate in this Secret of the pod's namespace "
                          "(created, shared by replicas, renewed before expiry)")
    hook.add_argument("--webhook-service", metavar="NAME",
                      help="the webhook Service; the self-signed certificate is issued for NAME.<namespace>.svc")
    hook.add_argument("--webhook-namespace", metavar="NS",
                      help="namespace of the Secret and the Service (default: $POD_NAMESPACE)")
    hook.add_argument("--webhook-configuration", metavar="NAME",
                      help="self-signed: the ValidatingWebhookConfiguration whose caBundle the operator sets")
    hook.add_argument("--webhook-extra-san", action="append", default=[], metavar="NAME",
                      help="another DNS name or IP address for the self-signed certificate (repeatable)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def parse_settings(argv: list[str], env: Mapping[str, str] | None = None) -> Settings:
    """Settings from argv, falling back to RLJOB_* environment variables, then to defaults."""
    env = os.environ if env is None else env
    args = parser().parse_args(argv)
    if args.namespaces:
        namespaces = tuple(args.namespaces)
    elif args.all_namespaces:
        namespaces = ()
    else:
        namespaces = _env_namespaces(env.get("RLJOB_NAMESPACES", ""))
    standalone = args.standalone or (not args.peering and env.get("RLJOB_STANDALONE", "") in ("1", "true", "yes"))
    peering = None if standalone else (args.peering or env.get("RLJOB_PEERING") or DEFAULT_PEERING)
    port = args.metrics_port if args.metrics_port is not None else int(env.get("RLJOB_METRICS_PORT", "8080"))
    resync = args.resync_seconds if args.resync_seconds is not None else _env_float(env, "RLJOB_RESYNC_SECONDS", 60.0)
    if resync <= 0:
        raise SystemExit("rljob operator: --resync-seconds must be > 0 (e.g. 60)")
    grace = args.pod_loss_grace_seconds if args.pod_loss_grace_seconds is not None else \
        _env_float(env, "RLJOB_POD_LOSS_GRACE_SECONDS", 10.0)
    if not grace >= 0:
        raise SystemExit("rljob operator: --pod-loss-grace-seconds must be >= 0 (e.g. 10)")
    priority = args.priority if args.priority is not None else _env_int(env, "RLJOB_PEERING_PRIORITY")
    lifetime = args.peering_lifetime if args.peering_lifetime is not None else \
        _env_int(env, "RLJOB_PEERING_LIFETIME") or 60
    if lifetime < 2:
        raise SystemExit("rljob operator: --peering-lifetime must be >= 2 seconds (keep-alives are sent every "
                         "lifetime - 5..10 s, at least every second; e.g. 60)")
    metrics_url = args.trainer_metrics_url or env.get("RLJOB_TRAINER_METRICS_URL") or TRAINER_METRICS_URL
    try:
        metrics_url.format(cluster="c", namespace="ns", port=8000, rljob="job")
    except (KeyError, IndexError, ValueError) as err:
        raise SystemExit(f"rljob operator: --trainer-metrics-url {metrics_url!r} is not a valid template ({err!r}); "
                         f"use only the fields {{cluster}}, {{namespace}}, {{port}} and {{rljob}}, e.g. "
                         f"{TRAINER_METRICS_URL}") from None
    source, image = ("--trainer-image", args.trainer_image) if args.trainer_image is not None else \
        ("RLJOB_TRAINER_IMAGE", env.get("RLJOB_TRAINER_IMAGE"))
    if image is not None and (not image.strip() or any(c.isspace() for c in image.strip())):
        raise SystemExit(f"rljob operator: {source}={image!r} is not an image reference; give one like "
                         f"{DEFAULT_IMAGE}, or leave it unset for that default")
    source, text = ("--pod-defaults", args.pod_defaults) if args.pod_defaults is not None else \
        ("RLJOB_POD_DEFAULTS", env.get("RLJOB_POD_DEFAULTS"))
    try:
        pod_defaults = parse_pod_defaults(source, text)
    except ValueError as err:
        raise SystemExit(f"rljob operator: {err}") from None
    return Settings(namespaces=namespaces, peering=peering, priority=priority, peering_lifetime=lifetime,
                    metrics_port=port, resync_seconds=resync, pod_loss_grace_seconds=grace,
                    trainer_metrics_url=metrics_url,
                    trainer_image=image.strip() if image else DEFAULT_IMAGE,
                    pod_defaults=pod_defaults, webhook=_webhook_settings(args, env), verbose=args.verbose)


def _webhook_settings(args: argparse.Namespace, env: Mapping[str, str]) -> WebhookSettings | None:
    """The webhook flags as WebhookSettings (None without a port); SystemExit naming the fix when incomplete."""
    port = args.webhook_port if args.webhook_port is not None else _env_int(env, "RLJOB_WEBHOOK_PORT") or 0
    if not port:
        return None
    if not 0 < port < 65536:
        raise SystemExit(f"rljob operator: --webhook-port {port} is not a TCP port; use 1..65535 (e.g. 9443)")
    if args.webhook_cert_dir is None and not args.webhook_secret:
        raise SystemExit("rljob operator: --webhook-port needs a serving certificate: --webhook-cert-dir DIR "
                         "(tls.crt/tls.key, e.g. from cert-manager) or --webhook-secret NAME (self-signed)")
    namespace = args.webhook_namespace or env.get("POD_NAMESPACE") or None
    if args.webhook_secret and not (namespace and (args.webhook_service or args.webhook_extra_san)):
        raise SystemExit("rljob operator: --webhook-secret needs the namespace (--webhook-namespace or "
                         "$POD_NAMESPACE) and the names to issue the certificate for (--webhook-service NAME)")
    return WebhookSettings(port=port, address=args.webhook_address or "0.0.0.0", cert_dir=args.webhook_cert_dir,
                           secret=args.webhook_secret, namespace=namespace, service=args.webhook_service,
                           configuration=args.webhook_configuration, extra_sans=tuple(args.webhook_extra_san))


def parse_pod_defaults(source: str, text: str | None) -> PodSpec:
    """Pod defaults from YAML/JSON `text` in spec.pod's shape; ValueError naming `source` when it is wrong."""
    if not text or not text.strip():
        return PodSpec()
    try:
        data = yamlio.load(text, source)
    except yamlio.YamlError as err:
        raise ValueError(f"{source} is not valid YAML or JSON ({err.problem}); give a mapping in spec.pod's "
                         "shape, e.g. {serviceAccountName: rl-trainer}") from None
    if data is None:
        return PodSpec()
    try:
        pod = PodSpec.model_validate(data)
    except ValidationError as err:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in err.errors()
        )
        raise ValueError(f"{source}: {errors}. It takes the fields of an RLJob's spec.pod (nodeSelector, "
                         "tolerations, affinity, priorityClassName, schedulerName, serviceAccountName, env, "
                         "envFrom, labels, annotations)") from None
    problems = pod_problems(pod, where=source)
    if problems:
        raise ValueError("; ".join(problems))
    return pod


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"rljob operator: {name}={value!r} is not an integer; set it to a whole number "
                         f"or unset it") from None


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    value = env.get(name, "").strip()
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise SystemExit(f"rljob operator: {name}={value!r} is not a number of seconds; set it to one (e.g. "
                         f"{default:g}) or unset it") from None
