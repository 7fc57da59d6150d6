"""The operator, started with the chart's own args and RBAC, is never refused by the API server.

The emulator enforces RBAC like the API server's authorizer (tests/support/kube_rbac.py): the chart's
ServiceAccount, (Cluster)Roles and bindings are installed, the operator authenticates as that
ServiceAccount, and every request is checked by verb, API group, resource *and subresource*
(`rljobs` and `rljobs/status` are separate grants), namespace and resourceNames. A request the chart
does not grant is refused with 403, so a missing grant shows up as a refusal here, a broken workflow
(the wait_for steps) or both.
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
from tests.support.kube_rbac import service_account
from tests.support.operator_proc import Operator, wait_for
from tests.support.server_process import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, RAY, KOPF = "rl.hybridflow.dev/v1alpha1", "ray.io/v1", "kopf.dev/v1"
RELEASE_NS = "rljob-system"
#: Where each kind the chart renders is created in the emulator (its resource and API version).
INSTALLED = {"ServiceAccount": ("v1", "serviceaccounts"),
             "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles"),
             "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings"),
             "Role": ("rbac.authorization.k8s.io/v1", "roles"),
             "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings"),
             "ValidatingWebhookConfiguration": ("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations"),
             "ClusterKopfPeering": (KOPF, "clusterkopfpeerings"), "KopfPeering": (KOPF, "kopfpeerings")}


SCENARIOS: dict[str, dict[str, Any]] = {
    "cluster": {},
    "namespaced": {"rbac": {"scope": "namespaced"}, "watchNamespaces": ["team-a"]},
}
# Found once RBAC was enforced: kopf 1.45 retries a refused namespace list for about a minute before it
# watches anything. The operator asks first (a SelfSubjectAccessReview) and skips kopf's scans when refused,
# so the namespaced scenario reconciles within the same 20 s as the cluster-wide one.
PARAMS = [pytest.param("cluster", id="cluster"), pytest.param("namespaced", id="namespaced")]


@pytest.fixture(scope="module")
def chart() -> pathlib.Path:
    """The chart folder of the repository, as a clone has it."""
    return CHART


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    emulator = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml")),
                            namespaces=("default", "kube-system", "team-a", RELEASE_NS)).start()
    yield emulator
    emulator.stop()


def _install(kube: KubeEmulator, objs: list[dict[str, Any]]) -> None:
    """Create what the chart renders that the emulator serves (RBAC, peering, the webhook configuration)."""
    for obj in objs:
        if obj["kind"] in INSTALLED and not obj["kind"].endswith("KopfPeering"):
            api_version, plural = INSTALLED[obj["kind"]]
            kube.create(api_version, plural, obj, obj["metadata"].get("namespace") or RELEASE_NS)


def _manifest(name: str, **spec: Any) -> dict[str, Any]:
    job = yaml.safe_load((ROOT / "examples" / "rljob_cpu_tiny.yaml").read_text())
    job["metadata"] = {"name": name}
    job["spec"].update(spec)
    return job


def _start(kube: KubeEmulator, objs: list[dict[str, Any]], workdir: pathlib.Path) -> Operator:
    """The operator with the Deployment's args, as its ServiceAccount, its webhook reachable through its Service."""
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    token = kube.add_token(service_account(RELEASE_NS, pod["serviceAccountName"]))
    port = free_port()
    for hook in next(o for o in objs if o["kind"] == "ValidatingWebhookConfiguration")["webhooks"]:
        service = hook["clientConfig"]["service"]
        kube.admission.endpoints[(service["namespace"], service["name"])] = ("127.0.0.1", port)
    args = [*container["args"], f"--webhook-port={port}", "--webhook-address=127.0.0.1"]  # the last flag wins
    operator = Operator(kube, workdir, args=args, pod_id="rljob-operator-abc", token=token,
                        env={"POD_NAMESPACE": RELEASE_NS})
    operator.start()
    return operator


@pytest.mark.parametrize("scenario", PARAMS)
def test_every_request_of_the_operator_is_granted(kube: KubeEmulator, chart: pathlib.Path, scenario: str,
                                                   tmp_path: pathlib.Path) -> None:
    values = SCENARIOS[scenario]
    objs = render(binaries.ensure("helm"), chart, values)
    _install(kube, objs)
    namespace = (values.get("watchNamespaces") or ["default"])[0]
    peering = "kopfpeerings" if values.get("watchNamespaces") else "clusterkopfpeerings"
    operator = _start(kube, objs, tmp_path / "op")
    try:
        kube.create(RLJ, "rljobs", _manifest("rbac"), namespace)
        wait_for(lambda: kube.find(RAY, "rayjobs", "rbac-a1", namespace), "RayJob rbac-a1")
        wait_for(lambda: (kube.get(RLJ, "rljobs", "rbac", namespace).get("status") or {}).get("rayJobName"),
                 "the status written through rljobs/status")
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
        # The webhook's own grants: the Secret it keeps its certificate in, the caBundle it writes.
        wait_for(lambda: kube.find("v1", "secrets", "rljob-rljob-operator-webhook-tls", RELEASE_NS),
                 "the webhook's Secret")
    finally:
        operator.stop()
    log = operator.log.read_text()
    assert "Traceback" not in log, log[-3000:]

    assert kube.denied == [], f"the operator sent requests the chart does not grant: {kube.denied}"
    assert kube.admission.skipped > 0  # kopf's own RLJob patches, kept from the webhook by the chart's matchCondition
    assert ("not allowed to list namespaces: watching team-a as given" in log) == (scenario == "namespaced")
    sent = {(verb, group, resource) for (verb, group, resource, _), n in kube.requests_by_resource.items() if n}
    # The scenario exercised the grants this chart version added, the status subresource among them.
    assert {("delete", "ray.io", "rayjobs"), ("create", "kopf.dev", peering), ("get", "kopf.dev", peering),
            ("patch", "kopf.dev", peering), ("patch", "rl.hybridflow.dev", "rljobs/status"),
            ("create", "", "secrets"), ("patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations"),
            } <= sent
    assert ("get", "rl.hybridflow.dev", "rljobs") not in sent  # why the chart grants no get on rljobs


def test_a_grant_on_rljobs_does_not_cover_rljobs_status(kube: KubeEmulator, chart: pathlib.Path,
                                                        tmp_path: pathlib.Path) -> None:
    """Without the chart's `rljobs/status` rule the operator's status write is refused, named as such."""
    objs = render(binaries.ensure("helm"), chart)
    for role in (o for o in objs if o["kind"] == "ClusterRole"):
        role["rules"] = [r for r in role["rules"] if r["resources"] != ["rljobs/status"]]
    _install(kube, objs)
    operator = _start(kube, objs, tmp_path / "op")
    try:
        kube.create(RLJ, "rljobs", _manifest("nostatus"), "default")
        wait_for(lambda: [m for m in kube.denied if 'cannot patch resource "rljobs/status"' in m],
                 "the status patch refused")
    finally:
        operator.stop()
    (message, *_) = [m for m in kube.denied if "rljobs/status" in m]
    assert message == ('rljobs.rl.hybridflow.dev "nostatus" is forbidden: User "system:serviceaccount:rljob-system:'
                       'rljob-rljob-operator" cannot patch resource "rljobs/status" in API group "rl.hybridflow.dev" '
                       'in the namespace "default"')
    assert not (kube.get(RLJ, "rljobs", "nostatus", "default").get("status") or {}).get("phase")
