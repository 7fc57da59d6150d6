"""The Kubernetes API emulator, exercised with plain HTTP requests like a client would."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.support.kube_emulator import KUBERAY_DIR, KubeEmulator

RLJOBS = "/apis/rl.hybridflow.dev/v1alpha1/namespaces/default/rljobs"
RAYJOBS = "/apis/ray.io/v1/namespaces/default/rayjobs"
CMS = "/api/v1/namespaces/default/configmaps"


def call(kube: KubeEmulator, method: str, path: str, body: Any = None,
         content_type: str = "application/json") -> tuple[int, Any]:
    """Send one request; return (HTTP status, decoded JSON body)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(kube.url + path, data=data, method=method,
                                 headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def rljob(name: str = "demo", **spec: Any) -> dict[str, Any]:
    """A small RLJob manifest that passes the CRD schema."""
    return {"apiVersion": "rl.hybridflow.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name},
            "spec": {"image": "hybridflow:test", "config": {"trainer": {"nnodes": 1}}, **spec}}


def cm(name: str, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"},
            "metadata": {"name": name, "labels": labels or {}, **meta}}


def test_discovery_core_and_groups(kube: KubeEmulator) -> None:
    assert call(kube, "GET", "/api/v1")[1]["groupVersion"] == "v1"
    names = {r["name"] for r in call(kube, "GET", "/apis/rl.hybridflow.dev/v1alpha1")[1]["resources"]}
    assert {"rljobs", "rljobs/status"} <= names
    groups = {g["name"]: g for g in call(kube, "GET", "/apis")[1]["groups"]}
    assert groups["ray.io"]["preferredVersion"]["version"] == "v1"
    status, namespaces = call(kube, "GET", "/api/v1/namespaces")
    assert status == 200 and {"default", "kube-system"} <= {n["metadata"]["name"] for n in namespaces["items"]}


def test_create_sets_identity_and_versions(kube: KubeEmulator) -> None:
    status, obj = call(kube, "POST", RLJOBS, rljob())
    assert status == 201
    meta = obj["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    assert meta["namespace"] == "default" and int(meta["resourceVersion"]) > 0
    assert obj["spec"]["imagePullPolicy"] == "IfNotPresent"  # the CRD schema's default was applied
    assert call(kube, "POST", RLJOBS, rljob())[0] == 409
    status, generated = call(kube, "POST", CMS, {"metadata": {"generateName": "x-"}})
    assert status == 201 and generated["metadata"]["name"].startswith("x-") and len(generated["metadata"]["name"]) == 7
    assert call(kube, "POST", "/api/v1/namespaces/nope/configmaps", cm("a"))[0] == 404


def test_schema_rejects_bad_objects_with_422(kube: KubeEmulator) -> None:
    status, err = call(kube, "POST", RLJOBS, rljob(suspend="yes"))
    assert status == 422 and err["reason"] == "Invalid" and "suspend" in err["message"]
    status, obj = call(kube, "POST", RLJOBS, rljob("pruned", bogus=1))
    assert status == 201 and "bogus" not in obj["spec"]  # unknown fields are pruned...
    status, err = call(kube, "POST", RLJOBS + "?fieldValidation=Strict", rljob("strict", bogus=1))
    assert status == 422 and "bogus" in err["message"]  # ...or rejected when the client asks for it


def test_generation_and_status_subresource(kube: KubeEmulator) -> None:
    obj = call(kube, "POST", RLJOBS, {**rljob(), "status": {"phase": "Running"}})[1]
    assert "status" not in obj  # status is ignored on create
    path = RLJOBS + "/demo"
    merge = "application/merge-patch+json"
    obj = call(kube, "PATCH", path, {"metadata": {"labels": {"a": "b"}}, "status": {"phase": "Failed"}}, merge)[1]
    assert obj["metadata"]["generation"] == 1 and "status" not in obj
    obj = call(kube, "PATCH", path + "/status", {"spec": {"suspend": True}, "status": {"phase": "Running"}}, merge)[1]
    assert obj["status"]["phase"] == "Running" and obj["metadata"]["generation"] == 1
    assert obj["spec"].get("suspend") is False  # spec ignored through /status
    obj = call(kube, "PATCH", path, {"spec": {"suspend": True}}, merge)[1]
    assert obj["metadata"]["generation"] == 2 and obj["status"]["phase"] == "Running"
    rv = obj["metadata"]["resourceVersion"]
    assert call(kube, "PATCH", path, {"spec": {"suspend": True}}, merge)[1]["metadata"]["resourceVersion"] == rv


def test_conflicts_and_json_patch_tests(kube: KubeEmulator) -> None:
    obj = call(kube, "POST", CMS, cm("c"))[1]
    stale = obj["metadata"]["resourceVersion"]
    call(kube, "PATCH", CMS + "/c", {"data": {"k": "2"}}, "application/merge-patch+json")
    assert call(kube, "PUT", CMS + "/c", cm("c", resourceVersion=stale))[0] == 409
    assert call(kube, "PATCH", CMS + "/c", {"metadata": {"resourceVersion": stale}, "data": {"k": "3"}},
                "application/merge-patch+json")[0] == 409
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": stale},
           {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}]
    status, err = call(kube, "PATCH", CMS + "/c", ops, "application/json-patch+json")
    assert status == 422 and "test operation" in err["message"]
    current = call(kube, "GET", CMS + "/c")[1]["metadata"]["resourceVersion"]
    ops[0]["value"] = current
    status, obj = call(kube, "PATCH", CMS + "/c", ops, "application/json-patch+json")
    assert status == 200 and obj["metadata"]["finalizers"] == ["x"]
    status, obj = call(kube, "PUT", CMS + "/c", {**cm("c"), "data": {"k": "4"}})  # no rv: unconditional
    assert status == 200 and obj["data"] == {"k": "4"}


def test_label_and_field_selectors(kube: KubeEmulator) -> None:
    for name, labels in (("a", {"app": "x", "tier": "1"}), ("b", {"app": "y"}), ("c", {})):
        call(kube, "POST", CMS, cm(name, labels))

    def names(query: str) -> list[str]:
        return [o["metadata"]["name"] for o in call(kube, "GET", CMS + "?" + query)[1]["items"]]

    assert names("labelSelector=app%3Dx") == ["a"]
    assert names("labelSelector=app") == ["a", "b"]
    assert names("labelSelector=!app") == ["c"]
    assert names("labelSelector=app+in+(x,y),tier!%3D2") == ["a", "b"]
    assert names("labelSelector=app+notin+(x)") == ["b", "c"]
    assert names("fieldSelector=metadata.name%3Db") == ["b"]


def test_finalizers_and_owner_garbage_collection(kube: KubeEmulator) -> None:
    owner = call(kube, "POST", RLJOBS, rljob())[1]
    ref = {"apiVersion": "rl.hybridflow.dev/v1alpha1", "kind": "RLJob", "name": "demo",
           "uid": owner["metadata"]["uid"], "controller": True}
    call(kube, "POST", CMS, cm("child", ownerReferences=[ref]))
    call(kube, "POST", CMS, cm("held", ownerReferences=[ref], finalizers=["keep"]))
    call(kube, "POST", CMS, cm("unrelated"))
    assert call(kube, "DELETE", RLJOBS + "/demo")[0] == 200
    assert call(kube, "GET", RLJOBS + "/demo")[0] == 404
    assert call(kube, "GET", CMS + "/child")[0] == 404
    held = call(kube, "GET", CMS + "/held")[1]
    assert held["metadata"]["deletionTimestamp"]  # waits for its finalizer
    call(kube, "PATCH", CMS + "/held", {"metadata": {"finalizers": None}}, "application/merge-patch+json")
    assert call(kube, "GET", CMS + "/held")[0] == 404
    assert call(kube, "GET", CMS + "/unrelated")[0] == 200


def test_dependent_created_after_its_owner_is_gone_is_collected(kube: KubeEmulator) -> None:
    """A controller racing its owner's deletion: the GC deletes a child whose owners no longer exist."""
    owner = call(kube, "POST", RLJOBS, rljob())[1]
    ref = {"apiVersion": "rl.hybridflow.dev/v1alpha1", "kind": "RLJob", "name": "demo",
           "uid": owner["metadata"]["uid"], "controller": True}
    assert call(kube, "DELETE", RLJOBS + "/demo")[0] == 200
    status, created = call(kube, "POST", CMS, cm("late-child", ownerReferences=[ref]))
    assert status == 201 and created["metadata"]["name"] == "late-child"
    assert call(kube, "GET", CMS + "/late-child")[0] == 404
    assert call(kube, "POST", CMS, cm("ownerless"))[0] == 201
    assert call(kube, "GET", CMS + "/ownerless")[0] == 200
    # an owner of the same name but another uid (deleted and created again) is not the owner
    again = call(kube, "POST", RLJOBS, rljob())[1]
    assert call(kube, "POST", CMS, cm("stale-owner", ownerReferences=[ref]))[0] == 201
    assert call(kube, "GET", CMS + "/stale-owner")[0] == 404
    live = {**ref, "uid": again["metadata"]["uid"]}
    assert call(kube, "POST", CMS, cm("owned", ownerReferences=[live]))[0] == 201
    assert call(kube, "GET", CMS + "/owned")[0] == 200


def test_crd_cel_rules_refuse_what_they_say(kube: KubeEmulator) -> None:
    """The CRD's x-kubernetes-validations run on create (the API server's wording), reading what each rule reads."""
    status, err = call(kube, "POST", RLJOBS, rljob("Bad_Name"))
    assert status == 422 and "must be a DNS-1035 label" in err["message"]
    status, err = call(kube, "POST", RLJOBS, rljob("both", queueName="a", scheduling={"scheduler": "kueue", "queue": "a"}))
    assert status == 422 and "queueName: is the deprecated form of spec.scheduling" in err["message"]
    status, err = call(kube, "POST", RLJOBS, rljob("long-" + "x" * 60))
    assert status == 422 and "too long" in err["message"]
    assert call(kube, "POST", RLJOBS, rljob("fine", queueName="a"))[0] == 201


def test_cel_rules_ratchet_on_unchanged_subtrees(kube: KubeEmulator) -> None:
    """As the API server's validation ratcheting: an update re-checks the rules of what changed only."""
    assert call(kube, "POST", RLJOBS, rljob("old", queueName="a"))[0] == 201
    with kube.store.lock:  # stored before a (hypothetical) rule existed: both fields set
        stored = next(o for (_, p, _, n), o in kube.store.objects.items() if p == "rljobs" and n == "old")
        stored["spec"]["scheduling"] = {"scheduler": "kueue", "queue": "a"}
    kube.patch_status("rl.hybridflow.dev/v1alpha1", "rljobs", "old", {"phase": "Running"})  # spec unchanged: fine
    status, err = call(kube, "PATCH", RLJOBS + "/old", {"spec": {"suspend": True}},
                       "application/merge-patch+json")
    assert status == 422 and "queueName: is the deprecated form" in err["message"]  # spec changed: checked


def test_cel_activation_converts_only_the_paths_a_rule_reads() -> None:
    from tests.support.kube_schema import _program, cel_activation

    obj = {"metadata": {"name": "ab", "labels": {"x": "y"}},
           "spec": {"runPolicy": {"backoffLimit": 3, "other": 1}, "config": {"big": list(range(100))}}}
    rule = ("size(self.metadata.name) + (has(self.spec.runPolicy) && has(self.spec.runPolicy.backoffLimit) ? "
            "self.spec.runPolicy.backoffLimit : 3) < 10")
    activation = cel_activation(rule, {"self": obj, "unused": obj})
    assert set(activation) == {"self"}
    assert set(activation["self"]) == {"metadata", "spec"} and set(activation["self"]["spec"]) == {"runPolicy"}
    assert set(activation["self"]["metadata"]) == {"name"}
    assert bool(_program(rule).evaluate(activation)) is True
    # a method call is not a field; a bare use keeps everything
    assert set(cel_activation("self.metadata.name.matches('^a')", {"self": obj})["self"]["metadata"]) == {"name"}
    assert set(cel_activation("size(self) == 2", {"self": obj})["self"]) == {"metadata", "spec"}


def read_watch(kube: KubeEmulator, query: str, out: list[dict[str, Any]],
               connected: threading.Event | None = None) -> None:
    with urllib.request.urlopen(kube.url + CMS + "?watch=true&" + query, timeout=10) as resp:
        if connected is not None:
            connected.set()  # the server has answered with headers: its watch has begun
        for line in resp:
            out.append(json.loads(line))


def test_watch_from_resource_version_does_not_replay(kube: KubeEmulator) -> None:
    call(kube, "POST", CMS, cm("old"))
    listed = call(kube, "GET", CMS)[1]
    rv = listed["metadata"]["resourceVersion"]
    events: list[dict[str, Any]] = []
    full: list[dict[str, Any]] = []
    ready = [threading.Event(), threading.Event()]
    watchers = [threading.Thread(target=read_watch, args=(kube, f"resourceVersion={rv}&timeoutSeconds=2", events,
                                                          ready[0])),
                threading.Thread(target=read_watch, args=(kube, "timeoutSeconds=2&labelSelector=w", full, ready[1]))]
    for w in watchers:
        w.start()
    # A watch without resourceVersion starts from "now": the writes must come after it began (seen on a loaded box).
    assert all(r.wait(5) for r in ready)
    time.sleep(0.05)
    call(kube, "POST", CMS, cm("new", {"w": "1"}))
    call(kube, "DELETE", CMS + "/new")
    for w in watchers:
        w.join(5)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "new"), ("DELETED", "new")]
    assert int(events[1]["object"]["metadata"]["resourceVersion"]) > int(events[0]["object"]["metadata"]["resourceVersion"])
    assert [e["type"] for e in full] == ["ADDED", "DELETED"]  # the selector hid "old"


def test_events_in_both_groups_and_crd_install_over_http(kube: KubeEmulator) -> None:
    ev = {"metadata": {"generateName": "demo."}, "involvedObject": {"kind": "RLJob", "name": "demo"},
          "reason": "Invalid", "message": "bad", "type": "Warning"}
    assert call(kube, "POST", "/api/v1/namespaces/default/events", ev)[0] == 201
    new_ev = {"metadata": {"name": "e1"}, "regarding": {"kind": "RLJob", "name": "demo"}, "note": "x",
              "reason": "R", "type": "Normal", "eventTime": "2026-01-01T00:00:00.000000Z",
              "reportingController": "c", "reportingInstance": "i", "action": "A"}
    assert call(kube, "POST", "/apis/events.k8s.io/v1/namespaces/default/events", new_ev)[0] == 201
    found = call(kube, "GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Ddemo")[1]
    assert [e["reason"] for e in found["items"]] == ["Invalid"]
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "widgets", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                      "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]}}
    assert call(kube, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)[0] == 201
    widgets = "/apis/example.com/v1/namespaces/default/widgets"
    assert call(kube, "POST", widgets, {"metadata": {"name": "w"}, "spec": {"size": "big"}})[0] == 422
    assert call(kube, "POST", widgets, {"metadata": {"name": "w"}, "spec": {"size": 3}})[0] == 201


@pytest.mark.skipif(not (KUBERAY_DIR / "ray.io_rayjobs.yaml").exists(), reason="KubeRay CRDs (../shared/kuberay) absent")
def test_rayjob_schema_from_kuberay(kube: KubeEmulator) -> None:
    bad = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "r"},
           "spec": {"entrypoint": "python x.py", "shutdownAfterJobFinishes": "yes"}}
    status, err = call(kube, "POST", RAYJOBS, bad)
    assert status == 422 and "shutdownAfterJobFinishes" in err["message"]
    ok = {**bad, "spec": {"entrypoint": "python x.py", "shutdownAfterJobFinishes": True}}
    assert call(kube, "POST", RAYJOBS, ok)[0] == 201
    kube.patch_status("ray.io/v1", "rayjobs", "r", {"jobDeploymentStatus": "Running"})
    assert kube.get("ray.io/v1", "rayjobs", "r")["status"]["jobDeploymentStatus"] == "Running"


def test_table_output_from_printer_columns(kube: KubeEmulator) -> None:
    """`kubectl get` asks for a Table; the emulator builds it from the CRD's additionalPrinterColumns."""
    kube.create("rl.hybridflow.dev/v1alpha1", "rljobs", rljob("t"), "default")
    kube.patch_status("rl.hybridflow.dev/v1alpha1", "rljobs", "t", {"phase": "Running", "attempt": 2,
                                                                     "progress": {"step": 7}})
    req = urllib.request.Request(kube.url + RLJOBS, headers={
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        table = json.loads(resp.read())
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Phase", "Step", "Total", "Reward",
                                                              "Attempt", "Version", "Staleness", "Age"]
    assert [c["priority"] for c in table["columnDefinitions"]] == [0, 0, 0, 0, 0, 0, 1, 1, 0]  # -o wide only
    (row,) = table["rows"]
    assert row["cells"][:8] == ["t", "Running", 7, None, None, 2, None, None] and row["cells"][8].endswith("s")
    assert call(kube, "GET", RLJOBS)[1]["kind"] == "RLJobList"  # plain JSON without the Accept header
