"""Operator settings from command-line flags and environment variables (flags win)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from pydantic import ValidationError

from hybridflow import yamlio
from rljob_operator.api import DEFAULT_IMAGE, PodSpec
from rljob_operator.validation import pod_problems

DEFAULT_PEERING = "rljob-operator"
#: The trainer driver's /metrics through KubeRay's head Service ({cluster}: the RayJob's Ray cluster).
TRAINER_METRICS_URL = "http://{cluster}-head-svc.{namespace}.svc:{port}/metrics"


@dataclass(frozen=True)
class Settings:
    """How the operator runs; built once at start-up by `parse_settings`."""

    namespaces: tuple[str, ...] = ()  # empty: every namespace (cluster-wide)
    peering: str | None = DEFAULT_PEERING  # None: standalone (no peering, for one replica)
    priority: int | None = None  # peering priority; None: random per process (see peering.py)
    peering_lifetime: int = 60  # seconds a keep-alive counts; a crashed replica is replaced after it
    metrics_port: int = 8080  # 0: no /metrics and /healthz endpoint
    resync_seconds: float = 60.0  # timer interval: level-based resync and progress reading
    trainer_metrics_url: str = TRAINER_METRICS_URL  # template: {cluster} {namespace} {port} {rljob}
    trainer_image: str = DEFAULT_IMAGE  # pods of RLJobs that set no spec.image
    pod_defaults: PodSpec = field(default_factory=PodSpec)  # under every RLJob's spec.pod
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
    resync = args.resync_seconds if args.resync_seconds is not None else float(env.get("RLJOB_RESYNC_SECONDS", "60"))
    if resync <= 0:
        raise SystemExit("rljob operator: --resync-seconds must be > 0 (e.g. 60)")
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
                    metrics_port=port, resync_seconds=resync, trainer_metrics_url=metrics_url,
                    trainer_image=image.strip() if image else DEFAULT_IMAGE,
                    pod_defaults=pod_defaults, verbose=args.verbose)


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
