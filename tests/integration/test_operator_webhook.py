"""Validation at apply time: the operator's webhook, called over HTTPS by the API emulator, refuses bad RLJobs.

The chart's own ValidatingWebhookConfiguration (rendered by helm) is installed in the emulator; the
operator runs with the chart's webhook flags (self-signed certificate in a Secret, caBundle written
by the operator); the emulator calls it as an API server does (TLS verified against caBundle for the
Service's DNS name, timeout, failurePolicy, namespaceSelector) and the real kubectl shows the answer.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import pathlib
import socket
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from rljob_operator.validation import check_rljob
from tests.support import binaries
from tests.support.helm import CHART, render
from tests.support.kube_emulator import KubeEmulator
from tests.support.kube_rbac import User
from tests.support.operator_proc import Operator, wait_for
from tests.support.server_process import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
RLJ, VWC = "rl.hybridflow.dev/v1alpha1", "admissionregistration.k8s.io/v1"
NS = "rljob-system"
HOOK = "validate.rljobs.rl.hybridflow.dev"


def manifest(name: str, **spec: Any) -> dict[str, Any]:
    job = yaml.safe_load((ROOT / "examples" / "rljob_cpu_tiny.yaml").read_text())
    job["metadata"] = {"name": name}
    job["spec"].update(spec)
    return job


def bad_manifest(name: str) -> dict[str, Any]:
    """Two problems only the operator's checks see (no schema or CEL rule catches them)."""
    job = manifest(name)
    job["spec"]["config"]["trainer"]["nnodes"] = 2  # a local checkpoint path on 2 nodes
    job["spec"]["resources"] = {"memory": "8Gi", "sharedMemory": "16Gi"}  # /dev/shm above the memory
    return job


@pytest.fixture(scope="module")
def kubectl() -> pathlib.Path:
    try:
        return binaries.ensure("kubectl")
    except binaries.BinaryUnavailable as err:
        pytest.skip(f"no kubectl binary: {err}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubeEmulator, Operator, dict[str, Any]]]:
    """Emulator + the chart's webhook configuration + the operator serving it with the chart's flags."""
    objs = render(binaries.ensure("helm"), CHART)
    (vwc,) = [o for o in objs if o["kind"] == "ValidatingWebhookConfiguration"]
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    kube = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml")),
                        namespaces=("default", "kube-system", NS, "team-a")).start()
    kube.create(VWC, "validatingwebhookconfigurations", vwc)
    port = free_port()
    service = vwc["webhooks"][0]["clientConfig"]["service"]
    kube.admission.endpoints[(service["namespace"], service["name"])] = ("127.0.0.1", port)
    webhook_args = [a for a in container["args"] if a.startswith("--webhook-") and not a.startswith("--webhook-port")]
    scratch = tmp_path_factory.mktemp("webhook-operator-tmp")  # the operator's TMPDIR: where its key files go
    operator = Operator(kube, tmp_path_factory.mktemp("webhook-operator"),
                        args=["--standalone", "-A", f"--webhook-port={port}", "--webhook-address=127.0.0.1",
                              *webhook_args], env={"POD_NAMESPACE": NS, "TMPDIR": str(scratch)})
    operator.start()
    name = vwc["metadata"]["name"]
    wait_for(lambda: kube.get(VWC, "validatingwebhookconfigurations", name, None)["webhooks"][0]["clientConfig"]
             .get("caBundle"), "the operator writing the caBundle", timeout=30)
    wait_for(lambda: _listening(port), "the webhook server", timeout=30)
    (key_folder,) = scratch.glob("rljob-webhook-*")
    assert (key_folder / "tls.key").stat().st_mode & 0o077 == 0  # the private key is the operator's alone
    yield kube, operator, {"port": port, "vwc": name, "service": service}
    operator.stop()
    kube.stop()
    assert "Traceback" not in operator.log.read_text(), operator.log.read_text()[-3000:]
    assert not key_folder.exists(), "a clean stop leaves the self-signed certificate's key behind"


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def run(kubectl: pathlib.Path, kube: KubeEmulator, tmp: pathlib.Path, *args: str,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    config = kube.write_kubeconfig(tmp / "admin-kubeconfig")
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(tmp)}
    return subprocess.run([str(kubectl), *args], env=env, capture_output=True, text=True, timeout=60,
                          input=stdin, check=False)


def apply(kubectl: pathlib.Path, kube: KubeEmulator, tmp: pathlib.Path, obj: dict[str, Any],
          namespace: str = "default", dry_run: bool = False) -> subprocess.CompletedProcess[str]:
    """`kubectl apply` (`--dry-run=server`: admitted, not stored, so the operator never races its deletion)."""
    # JSON, not YAML: kubectl reads YAML 1.1, where safe_dump's unquoted `n:` (rollout.n) is a boolean.
    extra = ["--dry-run=server"] if dry_run else []
    return run(kubectl, kube, tmp, "apply", "--validate=false", *extra, "-n", namespace, "-f", "-",
               stdin=json.dumps(obj))


def test_kubectl_apply_of_a_bad_rljob_is_refused_with_rljob_validates_messages(
        kubectl: pathlib.Path, cluster: tuple[KubeEmulator, Operator, dict[str, Any]], tmp_path: pathlib.Path) -> None:
    kube, _, _ = cluster
    bad = bad_manifest("bad")
    expected = check_rljob(bad).errors
    assert len(expected) == 2, expected
    done = apply(kubectl, kube, tmp_path, bad)
    assert done.returncode != 0
    assert f'admission webhook "{HOOK}" denied the request: RLJob \'bad\' is invalid (2 problems):' in done.stderr
    for problem in expected:  # the very lines `rljob validate` prints
        assert f"  - {problem}" in done.stderr, done.stderr
    assert kube.find(RLJ, "rljobs", "bad") is None
    assert kube.admission.calls[-1].outcome == "denied"

    # A good one goes through, and the webhook's warnings reach kubectl as `Warning:` lines.
    good = manifest("good")
    done = apply(kubectl, kube, tmp_path, good)
    assert done.returncode == 0, done.stderr
    for warning in check_rljob(good).warnings:
        assert f"Warning: spec check: {warning}" in done.stderr, done.stderr
    # A spec edit that breaks it is refused; the stored object is unchanged.
    patch = json.dumps({"spec": {"resources": {"memory": "8Gi", "sharedMemory": "16Gi"}}})
    done = run(kubectl, kube, tmp_path, "patch", "rljob", "good", "--type=merge", "-p", patch)
    assert done.returncode != 0 and "spec.resources.sharedMemory: 16Gi is not below the worker memory 8Gi" in done.stderr
    assert kube.get(RLJ, "rljobs", "good")["spec"]["resources"]["sharedMemory"] == good["spec"]["resources"]["sharedMemory"]


def test_metadata_changes_of_an_invalid_rljob_are_allowed(
        kubectl: pathlib.Path, cluster: tuple[KubeEmulator, Operator, dict[str, Any]], tmp_path: pathlib.Path) -> None:
    """An RLJob that got in before the webhook existed can still be labelled, handled by kopf and deleted."""
    kube, _, _ = cluster
    kube.create(RLJ, "rljobs", bad_manifest("legacy"), "default")  # written past admission, as before the chart
    wait_for(lambda: "kopf.zalando.org/last-handled-configuration" in (
        kube.get(RLJ, "rljobs", "legacy")["metadata"].get("annotations") or {}), "kopf's own annotation patch")
    done = run(kubectl, kube, tmp_path, "label", "rljob", "legacy", "team=a")
    assert done.returncode == 0, done.stderr
    assert run(kubectl, kube, tmp_path, "delete", "rljob", "legacy").returncode == 0


def test_the_operators_own_writes_skip_the_webhook(cluster: tuple[KubeEmulator, Operator, dict[str, Any]]) -> None:
    """The chart's matchCondition keeps the operator's service account away from its own webhook (kopf patches
    annotations and finalizers of every RLJob it handles); any other user's write is still reviewed."""
    kube, _, info = cluster
    (condition,) = kube.get(VWC, "validatingwebhookconfigurations", info["vwc"], None)["webhooks"][0]["matchConditions"]
    account = condition["expression"].split("'")[1]
    assert account == "system:serviceaccount:rljob-system:rljob-rljob-operator"
    kube.create(RLJ, "rljobs", manifest("own-writes"), "default")
    url = f"{kube.url}/apis/rl.hybridflow.dev/v1alpha1/namespaces/default/rljobs/own-writes"
    for username, skipped in ((account, True), ("alice", False)):
        token = kube.add_token(User(username, ("system:masters", "system:authenticated")))
        before, calls = kube.admission.skipped, len(kube.admission.calls)
        request = urllib.request.Request(
            url, method="PATCH", data=json.dumps({"metadata": {"labels": {"by": username.split(":")[-1]}}}).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/merge-patch+json"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert resp.status == 200
        assert kube.admission.skipped - before == int(skipped), username
        if not skipped:
            assert len(kube.admission.calls) > calls


def test_namespace_selector_limits_the_webhook(
        kubectl: pathlib.Path, cluster: tuple[KubeEmulator, Operator, dict[str, Any]], tmp_path: pathlib.Path) -> None:
    kube, _, info = cluster
    selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]}
    original = kube.get(VWC, "validatingwebhookconfigurations", info["vwc"], None)
    changed = copy.deepcopy(original)
    changed["webhooks"][0]["namespaceSelector"] = selector
    kube.store.update(kube.rt(VWC, "validatingwebhookconfigurations"), None, info["vwc"], lambda _: changed)
    try:
        accepted = apply(kubectl, kube, tmp_path, bad_manifest("elsewhere"), dry_run=True)
        assert accepted.returncode == 0 and "(server dry run)" in accepted.stdout, accepted.stderr  # not selected
        refused = apply(kubectl, kube, tmp_path, bad_manifest("selected"), namespace="team-a", dry_run=True)
        assert refused.returncode != 0 and "denied the request" in refused.stderr
    finally:
        kube.store.update(kube.rt(VWC, "validatingwebhookconfigurations"), None, info["vwc"],
                          lambda cur: {**cur, "webhooks": original["webhooks"]})


def test_self_signed_certificate_is_shared_through_the_secret(
        cluster: tuple[KubeEmulator, Operator, dict[str, Any]]) -> None:
    kube, _, info = cluster
    secret = kube.get("v1", "secrets", "rljob-rljob-operator-webhook-tls", NS)
    assert secret["type"] == "kubernetes.io/tls"
    bundle = kube.get(VWC, "validatingwebhookconfigurations", info["vwc"], None)["webhooks"][0]["clientConfig"]["caBundle"]
    assert bundle == secret["data"]["ca.crt"]
    # The served certificate chains to that CA for the Service's DNS name (and to no other name).
    ctx = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
    host = f"{info['service']['name']}.{NS}.svc"
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    with pytest.raises(ssl.SSLCertVerificationError):
        with socket.create_connection(("127.0.0.1", info["port"]), timeout=5) as raw:
            ctx.wrap_socket(raw, server_hostname="elsewhere.example")


def _post(info: dict[str, Any], kube: KubeEmulator, body: bytes, path: str = "/validate-rljob") -> tuple[int, str]:
    bundle = kube.get(VWC, "validatingwebhookconfigurations", info["vwc"], None)["webhooks"][0]["clientConfig"]["caBundle"]
    ctx = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
    ctx.check_hostname = False  # dialled by address; the chain is still verified
    req = urllib.request.Request(f"https://127.0.0.1:{info['port']}{path}", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize(("body", "path", "needle"), [
    (b"{not json", "/validate-rljob", "not JSON"),
    (b"[1, 2]", "/validate-rljob", "expected an AdmissionReview object"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(), "/validate-rljob",
     "list v1 in admissionReviewVersions"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u"}}).encode(),
     "/validate-rljob", "request.resource"),
    (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "userInfo": {}, "object": {}, "resource": {"group": "rl.hybridflow.dev", "version": "v1alpha1",
                                                               "resource": "rljobs"}}}).encode(),
     "/elsewhere", "clientConfig path must be /validate-rljob"),
], ids=["not-json", "not-an-object", "v1beta1", "no-resource", "wrong-path"])  # fmt: skip
def test_malformed_admission_reviews_get_400_and_the_server_keeps_serving(
        cluster: tuple[KubeEmulator, Operator, dict[str, Any]], body: bytes, path: str, needle: str) -> None:
    kube, operator, info = cluster
    status, text = _post(info, kube, body, path)
    assert status == 400 and needle in text, (status, text)
    assert operator.proc is not None and operator.proc.poll() is None


class _SilentServer:
    """A TCP server on 127.0.0.1 that accepts connections and never answers (a hung webhook)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_a_hung_webhook_times_out_by_its_failure_policy(
        kubectl: pathlib.Path, cluster: tuple[KubeEmulator, Operator, dict[str, Any]], tmp_path: pathlib.Path,
        policy: str) -> None:
    kube, _, _ = cluster
    silent = _SilentServer()
    hung = {"apiVersion": VWC, "kind": "ValidatingWebhookConfiguration", "metadata": {"name": f"hung-{policy.lower()}"},
            "webhooks": [{"name": "hung.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                          "failurePolicy": policy, "timeoutSeconds": 1,
                          "clientConfig": {"url": f"https://127.0.0.1:{silent.port}/"},
                          "rules": [{"apiGroups": ["rl.hybridflow.dev"], "apiVersions": ["*"], "resources": ["rljobs"],
                                     "operations": ["CREATE"]}]}]}
    kube.create(VWC, "validatingwebhookconfigurations", hung)
    try:
        done = apply(kubectl, kube, tmp_path, manifest(f"hung-{policy.lower()}"), dry_run=True)
    finally:
        kube.delete(VWC, "validatingwebhookconfigurations", hung["metadata"]["name"], None)
        silent.close()
    calls = [c for c in kube.admission.calls if c.webhook == "hung.example.com"]
    assert calls[-1].seconds < 3 and "context deadline exceeded" in calls[-1].detail
    if policy == "Fail":
        assert done.returncode != 0
        assert 'Internal error occurred: failed calling webhook "hung.example.com"' in done.stderr
        assert "context deadline exceeded" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert calls[-1].outcome == "failed-open"


def test_an_untrusted_certificate_fails_the_call(
        kubectl: pathlib.Path, cluster: tuple[KubeEmulator, Operator, dict[str, Any]], tmp_path: pathlib.Path) -> None:
    """A caBundle that did not sign the served certificate: the call fails (closed, with Fail), as TLS must."""
    kube, _, info = cluster
    stranger = {"apiVersion": VWC, "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "stranger"},
                "webhooks": [{"name": "stranger.example.com", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                              "clientConfig": {"service": {**info["service"]}, "caBundle": base64.b64encode(
                                  _other_ca()).decode()},
                              "rules": [{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["rljobs"],
                                         "operations": ["CREATE"]}]}]}
    kube.create(VWC, "validatingwebhookconfigurations", stranger)
    try:
        done = apply(kubectl, kube, tmp_path, manifest("stranger"), dry_run=True)
    finally:
        kube.delete(VWC, "validatingwebhookconfigurations", "stranger", None)
    assert done.returncode != 0 and 'failed calling webhook "stranger.example.com"' in done.stderr
    assert "certificate" in done.stderr.lower(), done.stderr


def _other_ca() -> bytes:
    import datetime

    from rljob_operator.webhook import build_self_signed

    return build_self_signed(["other"], datetime.datetime.now(datetime.timezone.utc)).ca



