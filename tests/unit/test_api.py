"""Tests for the RLJob pydantic models (operator/rljob_operator/api.py)."""

import pytest
from pydantic import ValidationError

from rljob_operator import api
from rljob_operator.status import CONDITION_TYPES


def _job(**spec: object) -> dict:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "demo", "namespace": "ml", "uid": "u-1"},
        "spec": {"config": {"trainer": {"nnodes": 1}}, **spec},
    }


def test_defaults_are_filled() -> None:
    job = api.RLJob.model_validate(_job())
    assert job.spec.image is None  # the operator's default image applies (builders, settings)
    assert job.spec.image_pull_policy == "IfNotPresent"
    assert job.spec.resources.gpu_resource_name == "nvidia.com/gpu"
    assert job.spec.run_policy.backoff_limit == 3
    assert job.spec.suspend is False
    assert job.spec.queue_name is None
    assert job.spec.checkpoint.uri is None


def test_wire_format_is_camel_case_and_round_trips() -> None:
    raw = _job(
        queueName="team-a",
        runPolicy={"backoffLimit": 1, "stallTimeoutSeconds": 600},
        checkpoint={"uri": "s3://b/p", "secretRef": {"name": "s3-creds"}, "keep": 2},
        pod={"envFrom": [{"secretRef": {"name": "x"}}], "tolerations": [{"key": "gpu", "operator": "Exists"}]},
    )
    job = api.RLJob.model_validate(raw)
    dumped = job.model_dump(mode="json", exclude_none=True)
    assert dumped["spec"]["queueName"] == "team-a"
    assert dumped["spec"]["runPolicy"] == {"backoffLimit": 1, "stallTimeoutSeconds": 600}
    assert dumped["spec"]["checkpoint"]["secretRef"] == {"name": "s3-creds"}
    assert dumped["spec"]["pod"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert api.RLJob.model_validate(dumped) == job


@pytest.mark.parametrize(
    "spec, where",
    [
        ({"imagePullPolicy": "Sometimes"}, ("imagePullPolicy",)),
        ({"resoures": {}}, ("resoures",)),  # typo: extra fields are forbidden
        ({"resources": {"memory": "lots"}}, ("resources", "memory")),
        ({"runPolicy": {"backoffLimit": -1}}, ("runPolicy", "backoffLimit")),
        ({"checkpoint": {"keep": 0}}, ("checkpoint", "keep")),
        ({"pod": {"tolerations": [{"effect": "Sometimes"}]}}, ("pod", "tolerations", 0, "effect")),
    ],
)
def test_bad_spec_is_rejected_at_the_right_path(spec: dict, where: tuple) -> None:
    with pytest.raises(ValidationError) as err:
        api.RLJobSpec.model_validate({"config": {}, **spec})
    locs = [e["loc"][: len(where)] for e in err.value.errors()]
    assert where in locs


@pytest.mark.parametrize("value", [4, "500m", "16Gi", "1.5", "2e3", "64M"])
def test_quantities_accept_kubernetes_syntax(value: object) -> None:
    res = api.ResourcesSpec.model_validate({"cpu": value, "memory": value})
    assert res.cpu == value


def test_config_is_required() -> None:
    with pytest.raises(ValidationError, match="config"):
        api.RLJobSpec.model_validate({})


def test_status_dumps_with_kubernetes_names() -> None:
    status = api.RLJobStatus(
        phase=api.Phase.RUNNING,
        attempt=2,
        dashboard_url="http://demo-head:8265",
        progress=api.Progress(step=3, total_steps=10, percent=30.0),
        metrics=api.Metrics(reward_mean=0.5, throughput_tokens_per_second=100.0),
        conditions=[api.Condition(type=api.ConditionType.RUNNING, status="True", reason="RayJobRunning")],
    )
    out = status.model_dump(mode="json", exclude_none=True)
    assert out["phase"] == "Running"
    assert out["dashboardURL"] == "http://demo-head:8265"
    assert out["progress"] == {"step": 3, "totalSteps": 10, "percent": 30.0}
    assert out["metrics"]["throughputTokensPerSecond"] == 100.0
    assert out["conditions"][0] == {"type": "Running", "status": "True", "reason": "RayJobRunning"}
    assert api.RLJobStatus.model_validate(out) == status


def test_phase_and_condition_vocabulary() -> None:
    assert [p.value for p in api.Phase] == [
        "Pending", "Invalid", "Queued", "Suspended", "Starting", "Running", "Retrying", "Restarting", "SmokeRun",
        "Succeeded", "Failed",
    ]
    assert [c.value for c in api.ConditionType] == [
        "Validated", "SmokeRunPassed", "Suspended", "ClusterReady", "RolesReady", "Running", "Succeeded", "Failed",
        "SpecApplied",
    ]
    assert tuple(c.value for c in api.ConditionType) == CONDITION_TYPES  # the CRD's enum is what status writes


@pytest.mark.parametrize(
    "spec, where",
    [
        ({"runPolicy": {"backoffLimit": True}}, ("runPolicy", "backoffLimit")),
        ({"checkpoint": {"keep": False}}, ("checkpoint", "keep")),
        ({"resources": {"cpu": True}}, ("resources", "cpu")),
        ({"pod": {"tolerations": [{"tolerationSeconds": True}]}}, ("pod", "tolerations", 0, "tolerationSeconds")),
    ],
)
def test_booleans_are_not_numbers(spec: dict, where: tuple) -> None:
    """pydantic would read `true` as 1 (one CPU, one retry); the API refuses it like the trainer config."""
    with pytest.raises(ValidationError) as err:
        api.RLJobSpec.model_validate({"config": {}, **spec})
    assert [e["type"] for e in err.value.errors() if e["loc"][: len(where)] == where] == ["bool_as_number"]


@pytest.mark.parametrize("uri", ["s3:/b", "file://", "ftp://x", "", " ", "s3://", "/ckpt\n"])
def test_checkpoint_uri_is_checked_by_scheme(uri: str) -> None:
    with pytest.raises(ValidationError) as err:
        api.RLJobSpec.model_validate({"config": {}, "checkpoint": {"uri": uri}})
    assert [e["loc"] for e in err.value.errors()] == [("checkpoint", "uri")]


@pytest.mark.parametrize("uri", ["s3://b/run", "gs://b", "file:///tmp/ckpt", "/data/ckpt", "outputs/run"])
def test_checkpoint_uri_accepts_paths_and_supported_uris(uri: str) -> None:
    assert api.RLJobSpec.model_validate({"config": {}, "checkpoint": {"uri": uri}}).checkpoint.uri == uri
