"""The operator, started with the chart's own args, sends only requests the chart's RBAC grants.

The emulator enforces no RBAC; it counts requests by (verb, resource). So this checks verbs and
resources, not scope: a cluster-wide request that a namespaced Role would refuse is not caught here.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support import binaries
from tests.support.helm import CHART, render
from tests.support.kube_emulator import KubeEmulator
from tests.support.operator_proc import Operator, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, RAY, KOPF = "rl.hybridflow.dev/v1alpha1", "ray.io/v1", "kopf.dev/v1"
#: Groups of the resources the emulator serves, by plural (its request log keeps plurals only).
GROUPS = {"rljobs": "rl.hybridflow.dev", "rayjobs": "ray.io", "configmaps": "", "events": "", "namespaces": "",
          "clusterkopfpeerings": "kopf.dev", "kopfpeerings": "kopf.dev",
          "customresourcedefinitions": "apiextensions.k8s.io"}


SCENARIOS: dict[str, dict[str, Any]] = {
    "cluster": {},
    "namespaced": {"rbac": {"scope": "namespaced"}, "watchNamespaces": ["team-a"]},
}
#: Denied on purpose in namespaced mode: kopf then treats its namespace list as existing namespaces.
TOLERATED = {"namespaced": {("list", "", "namespaces"), ("watch", "", "namespaces")}}


@pytest.fixture(scope="module")
def chart() -> pathlib.Path:
    """The chart folder of the repository, as a clone has it."""
    return CHART


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    emulator = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml")),
                            namespaces=("default", "kube-system", "team-a")).start()
    yield emulator
    emulator.stop()


def _granted(objs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(verb, group, resource) granted by the chart's (Cluster)Roles; status grants count for the object."""
    out = set()
    for role in (o for o in objs if o["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out |= {(verb, group, resource.split("/")[0]) for verb in rule["verbs"]
                            if resource.count("/") == 0 or resource.endswith("/status")}
    return out


def _manifest(name: str, **spec: Any) -> dict[str, Any]:
    job = yaml.safe_load((ROOT / "examples" / "rljob_cpu_tiny.yaml").read_text())
    job["metadata"] = {"name": name}
    job["spec"].update(spec)
    return job


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_request_of_the_operator_is_granted(kube: KubeEmulator, chart: pathlib.Path, scenario: str,
                                                   tmp_path: pathlib.Path) -> None:
    objs = render(binaries.ensure("helm"), chart, SCENARIOS[scenario])
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    namespace = (SCENARIOS[scenario].get("watchNamespaces") or ["default"])[0]
    peering = "kopfpeerings" if SCENARIOS[scenario].get("watchNamespaces") else "clusterkopfpeerings"
    operator = Operator(kube, tmp_path / "op", args=container["args"], pod_id="rljob-operator-abc")
    operator.start()
    try:
        kube.create(RLJ, "rljobs", _manifest("rbac"), namespace)
        wait_for(lambda: kube.find(RAY, "rayjobs", "rbac-a1", namespace), "RayJob rbac-a1")
        config = _manifest("rbac")["spec"]["config"]
        config["trainer"]["n_gpus_per_node"] = 1
        kube.patch(RLJ, "rljobs", "rbac", {"spec": {"config": config}}, namespace)  # a new attempt: a1 is deleted
        wait_for(lambda: kube.find(RAY, "rayjobs", "rbac-a2", namespace), "RayJob rbac-a2 after the spec edit")
        kube.patch_status(RAY, "rayjobs", "rbac-a2", {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED"},
                          namespace)
        wait_for(lambda: kube.find(RAY, "rayjobs", "rbac-a3", namespace), "RayJob rbac-a3 (retry)")
        kube.create(RLJ, "rljobs", _manifest("rbac-bad", config={"trainer": {"nnodes": 1}}), namespace)
        wait_for(lambda: any(e["reason"] == "InvalidSpec" for e in kube.list("v1", "events")), "InvalidSpec Event")
        wait_for(lambda: kube.request_counts[("get", peering)] > 0, "a resync checking peering")
    finally:
        operator.stop()
    log = operator.log.read_text()
    assert "Traceback" not in log, log[-3000:]

    granted = _granted(objs) | TOLERATED.get(scenario, set())
    sent = {(verb, GROUPS[plural], plural) for (verb, plural), n in kube.request_counts.items() if n}
    assert sent - granted == set(), f"the operator sent requests the chart does not grant: {sent - granted}"
    # The scenario exercised the grants this chart version added.
    assert {("delete", "ray.io", "rayjobs"), ("create", "kopf.dev", peering), ("get", "kopf.dev", peering),
            ("patch", "kopf.dev", peering)} <= sent
    assert ("get", "rl.hybridflow.dev", "rljobs") not in sent  # why the chart grants no get on rljobs
