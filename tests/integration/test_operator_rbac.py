"""The operator, started with the chart's own args, sends only requests the chart's ClusterRole grants."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support import binaries
from tests.support.helm import copy_chart_with_stand_in, render
from tests.support.kube_emulator import KubeEmulator
from tests.support.operator_proc import Operator, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, RAY, KOPF = "rl.hybridflow.dev/v1alpha1", "ray.io/v1", "kopf.dev/v1"
#: Groups of the resources the emulator serves, by plural (its request log keeps plurals only).
GROUPS = {"rljobs": "rl.hybridflow.dev", "rayjobs": "ray.io", "configmaps": "", "events": "", "namespaces": "",
          "clusterkopfpeerings": "kopf.dev", "kopfpeerings": "kopf.dev",
          "customresourcedefinitions": "apiextensions.k8s.io"}


@pytest.fixture(scope="module")
def chart_objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The chart rendered with its default values (cluster-wide, peering on)."""
    chart = copy_chart_with_stand_in(tmp_path_factory.mktemp("chart"))
    return render(binaries.ensure("helm"), chart)


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    emulator = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml"))).start()
    yield emulator
    emulator.stop()


def _granted(objs: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """(verb, group, resource) granted by every ClusterRole of the chart; status grants count for the object."""
    out = set()
    for role in (o for o in objs if o["kind"] == "ClusterRole"):
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


def test_every_request_of_the_operator_is_granted(kube: KubeEmulator, chart_objects: list[dict[str, Any]],
                                                   tmp_path: pathlib.Path) -> None:
    (deployment,) = [o for o in chart_objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    operator = Operator(kube, tmp_path / "op", args=container["args"], pod_id="rljob-operator-abc")
    operator.start()
    try:
        kube.create(RLJ, "rljobs", _manifest("rbac"), "default")
        wait_for(lambda: kube.find(RAY, "rayjobs", "rbac-a1"), "RayJob rbac-a1")
        config = _manifest("rbac")["spec"]["config"]
        config["trainer"]["n_gpus_per_node"] = 1
        kube.patch(RLJ, "rljobs", "rbac", {"spec": {"config": config}})  # a new attempt: a1 is deleted
        wait_for(lambda: kube.find(RAY, "rayjobs", "rbac-a2"), "RayJob rbac-a2 after the spec edit")
        kube.patch_status(RAY, "rayjobs", "rbac-a2", {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED"})
        wait_for(lambda: kube.find(RAY, "rayjobs", "rbac-a3"), "RayJob rbac-a3 (retry)")
        kube.create(RLJ, "rljobs", _manifest("rbac-bad", config={"trainer": {"nnodes": 1}}), "default")
        wait_for(lambda: any(e["reason"] == "InvalidSpec" for e in kube.list("v1", "events")), "InvalidSpec Event")
        wait_for(lambda: kube.request_counts[("get", "clusterkopfpeerings")] > 0, "a resync checking peering")
    finally:
        operator.stop()
    log = operator.log.read_text()
    assert "Traceback" not in log and "403" not in log, log[-3000:]

    granted = _granted(chart_objects)
    sent = {(verb, GROUPS[plural], plural) for (verb, plural), n in kube.request_counts.items() if n}
    assert sent - granted == set(), f"the operator sent requests the chart does not grant: {sent - granted}"
    # The scenario exercised the grants this chart version added.
    assert {("delete", "ray.io", "rayjobs"), ("create", "kopf.dev", "clusterkopfpeerings"),
            ("get", "kopf.dev", "clusterkopfpeerings"), ("patch", "kopf.dev", "clusterkopfpeerings")} <= sent
    assert ("get", "rl.hybridflow.dev", "rljobs") not in sent  # why the chart grants no get on rljobs
