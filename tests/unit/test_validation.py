"""Tests for RLJob semantic validation (operator/rljob_operator/validation.py)."""

from __future__ import annotations

import copy
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_operator import validation
from rljob_operator.validation import check_rljob, parse_quantity, validate_rljob

REPO = Path(__file__).resolve().parents[2]


def _base() -> dict[str, Any]:
    return {
        "apiVersion": "rl.hybridflow.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "demo"},
        "spec": {
            "config": {
                "algorithm": {"adv_estimator": "grpo"},
                "data": {"train_files": "s3://b/train.parquet", "train_batch_size": 64},
                "actor_rollout_ref": {
                    "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
                    "actor": {"ppo_mini_batch_size": 16, "ppo_micro_batch_size_per_gpu": 2},
                    "rollout": {"n": 4},
                },
                "trainer": {"nnodes": 1, "n_gpus_per_node": 8},
            },
            "checkpoint": {"uri": "s3://b/ckpt", "secretRef": {"name": "s3"}},
        },
    }


def _with(changes: dict[str, Any]) -> dict[str, Any]:
    """The base manifest with dotted-path changes applied (value None deletes the key)."""
    obj = _base()
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = obj
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return obj


def test_base_manifest_is_valid_without_warnings() -> None:
    report = check_rljob(_base())
    assert report.errors == [] and report.warnings == []


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"kind": "Job"}, "kind: 'Job' is not valid; use 'RLJob'"),
        ({"apiVersion": "v1"}, "apiVersion: 'v1' is not valid"),
        ({"metadata.name": None}, "metadata.name: required"),
        ({"metadata.name": "Demo_1"}, "metadata.name: 'Demo_1' must be a DNS-1035 label"),
        ({"metadata.name": "a" * 45}, "use a name of at most 44 characters"),
        ({"spec.resoures": {}}, "spec.resoures: unknown field"),
        ({"spec.config": None}, "spec.config: required"),
        ({"spec.config.trainer.nnode": 2}, "spec.config.trainer.nnode: unknown key; did you mean nnodes?"),
        ({"spec.config.actor_rollout_ref.model.path": None}, "spec.config.actor_rollout_ref.model.path: required"),
        ({"spec.config.algorithm.adv_estimator": "grpoo"}, "spec.config.algorithm.adv_estimator"),
        ({"spec.config.actor_rollout_ref.rollout.n": 1}, "spec.config."),
        ({"spec.resources.gpuResourceName": "gpu"}, "spec.resources.gpuResourceName: 'gpu' is not an extended"),
        ({"spec.config.trainer.n_gpus_per_node": 32}, "32 GPUs do not fit on one node"),
        ({"spec.resources.memory": "64GB"}, "spec.resources.memory: '64GB' is not a Kubernetes quantity"),
        ({"spec.resources.cpu": 1.5}, "quote fractions"),
        ({"spec.resources.cpu": "0"}, "spec.resources.cpu: must be positive"),
        ({"spec.resources.sharedMemory": "64Gi"}, "/dev/shm is memory-backed"),
        ({"spec.checkpoint.uri": "ftp://host/x"}, "uses an unsupported scheme"),
        ({"spec.checkpoint.uri": "s3:///prefix"}, "names no bucket; use s3://bucket/prefix"),
        (
            {"spec.checkpoint.uri": "file:///ckpt", "spec.config.trainer.nnodes": 2},
            "spec.checkpoint.uri: 'file:///ckpt' is a local path but the job spans 2 nodes",
        ),
        (
            {"spec.checkpoint.uri": None, "spec.config.trainer.nnodes": 2},
            "spec.config.trainer.default_local_dir: 'checkpoints/hybridflow/default' is a local path",
        ),
        ({"spec.pod.env": [{"name": "RLJOB_NAME", "value": "x"}]}, "RLJOB_NAME is set by the operator"),
        ({"spec.pod.env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "A is defined twice"),
        (
            {"spec.pod.env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
            "set value or valueFrom, not both",
        ),
        ({"spec.pod.envFrom": [{"prefix": "X_"}]}, "set exactly one of secretRef or configMapRef"),
        (
            {"spec.pod.tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
            "must be empty with operator Exists",
        ),
        ({"spec.pod.labels": {"rl.hybridflow.dev/rljob": "other"}}, "set by the operator"),
        ({"spec.queueName": "bad queue"}, "spec.queueName: 'bad queue' must be a LocalQueue name"),
        ({"spec.imagePullPolicy": "Sometimes"}, "use one of 'Always', 'IfNotPresent' or 'Never'"),
    ],
)
def test_each_problem_is_reported_with_its_path(changes: dict[str, Any], expected: str) -> None:
    errors = validate_rljob(_with(changes))
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"spec.checkpoint.secretRef": None}, "spec.checkpoint.secretRef: unset with 's3://b/ckpt'"),
        ({"spec.checkpoint.uri": "/data/ckpt"}, "is local to the pod"),
        (
            {"spec.config.trainer.device": "cpu", "spec.config.trainer.n_gpus_per_node": 4, "spec.resources.cpu": 2},
            "2 CPUs per worker for 4 trainer processes",
        ),
        ({"spec.config.trainer.device": "npu"}, "trainer.device is npu but pods request nvidia.com/gpu"),
    ],
)
def test_warnings_do_not_make_a_job_invalid(changes: dict[str, Any], expected: str) -> None:
    report = check_rljob(_with(changes))
    assert report.errors == []
    assert any(expected in w for w in report.warnings), report.warnings


def test_every_problem_is_reported_at_once() -> None:
    errors = validate_rljob(
        _with(
            {
                "spec.resources.memory": "lots",
                "spec.imagePullPolicy": "Sometimes",
                "spec.config.trainer.nnode": 2,
                "spec.config.algorithm.adv_estimator": "nope",
            }
        )
    )
    assert len(errors) == 4, errors
    # Schema errors elsewhere in the spec do not hide the trainer-config problems.
    assert any(e.startswith("spec.config.trainer.nnode") for e in errors)
    assert any(e.startswith("spec.config.algorithm.adv_estimator") for e in errors)


def test_semantic_problems_are_collected_together() -> None:
    errors = validate_rljob(
        _with(
            {
                "spec.resources.sharedMemory": "1Ti",
                "spec.pod.envFrom": [{}],
                "spec.queueName": "bad queue",
                "spec.config.data.train_files": None,
            }
        )
    )
    assert len(errors) == 4, errors


def test_non_mapping_documents_are_rejected() -> None:
    assert validate_rljob(["not", "a", "job"]) == ["<document>: expected a mapping (an RLJob object), got list"]


def test_config_accepts_verl_shorthands() -> None:
    """Interpolations and a single string for list fields are verl idioms the CRD must let through."""
    errors = validate_rljob(
        _with({"spec.config.actor_rollout_ref.rollout.prompt_length": "${data.max_prompt_length}",
               "spec.config.trainer.logger": "console"})  # fmt: skip
    )
    assert errors == []


@pytest.mark.parametrize(
    "text, expected",
    [("4", 4), (4, 4), ("500m", Decimal("0.5")), ("16Gi", 16 * 2**30), ("1e3", 1000), ("1.5", Decimal("1.5")), ("2Ei", 2 * 2**60),
     ("2k", 2000), ("64M", 64 * 10**6)],
)  # fmt: skip
def test_parse_quantity(text: Any, expected: Any) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["64GB", "", "Gi", "1.2.3", "-"])
def test_parse_quantity_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("rljob_*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(example: Path) -> None:
    for doc in yaml.safe_load_all(example.read_text()):
        assert validation.validate_rljob(doc) == []


def test_objects_from_the_api_server_validate() -> None:
    """Server-set metadata and a status with controller-private keys do not make a job invalid."""
    obj = _base()
    obj["metadata"].update({"uid": "u", "generation": 3, "resourceVersion": "42", "managedFields": [{}],
                            "creationTimestamp": "2026-01-01T00:00:00Z"})  # fmt: skip
    obj["status"] = {"phase": "Running", "kopf": {"progress": {}}}
    assert validate_rljob(obj) == []


# ------------------------------------------------------------------------------ issue 12: bad input


@pytest.mark.parametrize(
    "changes, expected",
    [
        # non-mapping trainer group: reported, not replaced by {}
        ({"spec.config.trainer": 3}, "spec.config.trainer: expected a mapping of keys to values (got 3); fix the value"),
        ({"spec.config.trainer": [1]}, "spec.config.trainer: expected a mapping of keys to values"),
        # trainer keys the operator decides: refused, naming the RLJob field to use
        ({"spec.config.trainer.resume_mode": "disable"},
         "spec.config.trainer.resume_mode: set by the operator: every attempt resumes from the latest committed "
         "checkpoint (resume_mode=auto); remove it"),
        ({"spec.config.trainer.resume_mode": "auto"}, "spec.config.trainer.resume_mode: set by the operator"),
        ({"spec.config.trainer.default_local_dir": "/x"},
         "spec.config.trainer.default_local_dir: set by the operator from spec.checkpoint.uri, which replaces it; "
         "remove it and keep spec.checkpoint.uri"),
        ({"spec.checkpoint.keep": 2, "spec.config.trainer.max_actor_ckpt_to_keep": 3},
         "spec.config.trainer.max_actor_ckpt_to_keep: set by the operator from spec.checkpoint.keep"),
        ({"spec.checkpoint.keep": 2, "spec.config.trainer.max_critic_ckpt_to_keep": 3},
         "spec.config.trainer.max_critic_ckpt_to_keep: set by the operator from spec.checkpoint.keep"),
        ({"spec.config.trainer.metrics_port": 9000},
         "spec.config.trainer.metrics_port: set by the operator through $HYBRIDFLOW_METRICS_PORT"),
        # names with a trailing newline or other whitespace
        ({"metadata.name": "demo\n"}, "metadata.name: 'demo\\n' must be a DNS-1035 label"),
        ({"metadata.name": "demo "}, "metadata.name: 'demo ' must be a DNS-1035 label"),
        ({"spec.queueName": "team-a\n"}, "spec.queueName: 'team-a\\n' must be a LocalQueue name"),
        ({"spec.resources.gpuResourceName": "nvidia.com/gpu\n"}, "is not an extended resource name"),
        ({"spec.pod.labels": {"team": "a\n"}}, "spec.pod.labels.team: 'a\\n' is not a valid label value"),
        # quantities: bounded, booleans are not numbers
        ({"spec.resources.cpu": "1e1000000"},
         "spec.resources.cpu: '1e1000000' is too large for a Kubernetes quantity; write e.g. 4, 500m, 16Gi"),
        ({"spec.resources.memory": "1e99"}, "spec.resources.memory: '1e99' is too large"),
        ({"spec.resources.memory": "9" * 5000}, "…(5002 chars) is too large for a Kubernetes quantity"),
        ({"spec.resources.cpu": True}, "spec.resources.cpu: expected a number, not true or false (got True)"),
        ({"spec.resources.cpu": "4\n"}, "spec.resources.cpu: '4\\n' is not a Kubernetes quantity"),
        ({"spec.checkpoint.keep": True}, "spec.checkpoint.keep: expected a number, not true or false"),
        # checkpoint URIs by scheme, with the fix
        ({"spec.checkpoint.uri": "s3:/b"}, "spec.checkpoint.uri: 's3:/b' is not a valid URI ('://' after the scheme); "
                                           "write e.g. s3://b"),
        ({"spec.checkpoint.uri": "file://"}, "spec.checkpoint.uri: 'file://' is not an absolute file URI"),
        ({"spec.checkpoint.uri": "ftp://x"}, "spec.checkpoint.uri: 'ftp://x' uses an unsupported scheme (ftp://)"),
        ({"spec.checkpoint.uri": " "}, "spec.checkpoint.uri: ' ' is blank"),
        ({"spec.config.data.train_files": [""]}, "spec.config.data.train_files[0]: '' is blank"),
        # RLJob typos and types in the project's wording, with a fix
        ({"spec.resourcs": {}}, "spec.resourcs: unknown field; did you mean resources?"),
        ({"spec.checkpoint.kep": 2}, "spec.checkpoint.kep: unknown field; did you mean keep?"),
        ({"spec.runPolicy.backofLimit": 2}, "spec.runPolicy.backofLimit: unknown field; did you mean backoffLimit?"),
        ({"spec.pod.tolerations": [{"keyy": "a"}]}, "spec.pod.tolerations[0].keyy: unknown field; did you mean key?"),
        ({"spex": {}}, "spex: unknown field; did you mean spec?"),
        ({"spec.runPolicy.backoffLimit": "many"}, "spec.runPolicy.backoffLimit: expected a whole number (got 'many'); "
                                                  "fix the value"),
        ({"spec.runPolicy.backoffLimit": -1}, "spec.runPolicy.backoffLimit: must be >= 0 (got -1); change the value"),
        ({"spec.suspend": "maybe"}, "spec.suspend: expected true or false (got 'maybe'); fix the value"),
        ({"spec.image": 5}, "spec.image: expected a string (got 5); fix the value"),
        ({"spec.image": ""}, "spec.image: must not be empty"),
        ({"spec.pod.nodeSelector": []}, "spec.pod.nodeSelector: expected a mapping of keys to values (got [])"),
        ({"spec.imagePullPolicy": "x" * 1000}, "…(1002 chars) is not valid; use one of 'Always'"),
        ({"metadata.name": "x" * 10_000}, "metadata.name: 'xxxx"),
    ],
)
def test_bad_input_is_refused_with_a_fix(changes: dict[str, Any], expected: str) -> None:
    errors = validate_rljob(_with(changes))
    assert any(expected in e for e in errors), errors
    assert all(len(e) < 1000 for e in errors), "long values are shortened in messages"


@pytest.mark.parametrize(
    "changes",
    [
        # what the operator only decides when the RLJob says so stays the config's otherwise
        {"spec.checkpoint.uri": None, "spec.config.trainer.default_local_dir": "s3://b/run"},
        {"spec.config.trainer.max_actor_ckpt_to_keep": 2},
        {"spec.checkpoint.uri": "gs://b/run"},
        {"spec.resources.memory": "7Ei", "spec.resources.cpu": "1e3"},
    ],
)
def test_what_the_operator_does_not_decide_is_accepted(changes: dict[str, Any]) -> None:
    assert validate_rljob(_with(changes)) == []


@pytest.mark.parametrize("text", ["4\n", " 4", "1e1000000", "1e99", "9" * 5000])
def test_parse_quantity_refuses_unbounded_or_padded_input(text: str) -> None:
    with pytest.raises(ValueError, match="Kubernetes quantity"):
        parse_quantity(text)


# spec.scheduling: (changes, the one error expected; None: valid).
SCHEDULING_CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "kueue with a LocalQueue": ({"spec.scheduling": {"scheduler": "kueue", "queue": "team-a"}}, None),
    "volcano without queue (Volcano's default queue)": ({"spec.scheduling": {"scheduler": "volcano"}}, None),
    "yunikorn with a hierarchical queue": ({"spec.scheduling": {"scheduler": "yunikorn", "queue": "root.a"}}, None),
    "kai with a queue": ({"spec.scheduling": {"scheduler": "kai-scheduler", "queue": "team-a"}}, None),
    "kueue without queue": ({"spec.scheduling": {"scheduler": "kueue"}},
                            "spec.scheduling.queue: required with scheduler kueue (it admits no job without one); "
                            "name a Kueue LocalQueue in the RLJob's namespace"),
    "kai without queue": ({"spec.scheduling": {"scheduler": "kai-scheduler"}},
                          "spec.scheduling.queue: required with scheduler kai-scheduler"),
    "queue for the default scheduler": ({"spec.scheduling": {"scheduler": "default", "queue": "q"}},
                                        "spec.scheduling.queue: has no effect with scheduler default; remove it"),
    "queue that is no label value": ({"spec.scheduling": {"scheduler": "kueue", "queue": "team a"}},
                                     "spec.scheduling.queue: 'team a' must be a Kueue LocalQueue"),
    "unknown scheduler": ({"spec.scheduling": {"scheduler": "slurm"}},
                          "spec.scheduling.scheduler: 'slurm' is not valid; use one of 'default', 'kueue'"),
    "no scheduler named": ({"spec.scheduling": {"queue": "q"}}, "spec.scheduling.scheduler"),
    "queueName and scheduling both": ({"spec.queueName": "a", "spec.scheduling": {"scheduler": "kueue", "queue": "a"}},
                                      "spec.queueName: is the deprecated form of spec.scheduling"),
    "a pod schedulerName KubeRay would override": (
        {"spec.scheduling": {"scheduler": "volcano"}, "spec.pod.schedulerName": "my-scheduler"},
        "spec.pod.schedulerName: KubeRay's volcano integration sets the pods' schedulerName to volcano"),
    "the same schedulerName is fine": (
        {"spec.scheduling": {"scheduler": "volcano"}, "spec.pod.schedulerName": "volcano"}, None),
    "a scheduling label set by hand": ({"spec.pod.labels": {"kai.scheduler/queue": "q"}},
                                       "spec.pod.labels.kai.scheduler/queue: set by the operator and KubeRay from "
                                       "spec.scheduling"),
    "a long priority class for volcano": (
        {"spec.scheduling": {"scheduler": "volcano"}, "spec.pod.priorityClassName": "p" * 64},
        "spec.pod.priorityClassName: 'ppp"),
}  # fmt: skip


@pytest.mark.parametrize("case", SCHEDULING_CASES)
def test_scheduling_is_checked(case: str) -> None:
    changes, expected = SCHEDULING_CASES[case]
    errors = validate_rljob(_with(changes))
    if expected is None:
        assert errors == []
    else:
        assert len(errors) == 1 and expected in errors[0], errors
