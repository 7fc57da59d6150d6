"""docs/: the API reference is generated from api.py and current; docs cite real messages and files."""

from __future__ import annotations

import re
from pathlib import Path

from rljob_operator import api, apidoc

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def test_api_reference_is_current() -> None:
    assert (DOCS / "api.md").read_text() == apidoc.render(), (
        "docs/api.md is out of date with operator/rljob_operator/api.py: "
        "run `make docs`"
    )


def test_api_reference_covers_every_field() -> None:
    text = (DOCS / "api.md").read_text()
    for model in (api.RLJobSpec, api.RunPolicy, api.CheckpointSpec, api.SchedulingSpec, api.RLJobStatus, api.Progress):
        assert f"## {model.__name__}" in text
        for name, field in model.model_fields.items():
            assert f"| `{field.alias or name}` |" in text


def test_type_names() -> None:
    assert apidoc.type_name(api.Quantity) == "quantity (e.g. `4`, `500m`, `16Gi`)"
    assert apidoc.type_name(list[api.EnvVar]) == "list of [EnvVar](#envvar)"
    assert apidoc.type_name(dict[str, str]) == "map of string to string"
    assert apidoc.type_name(api.Phase).startswith("`Pending` \\| `Invalid`")


def test_docs_link_to_files_that_exist() -> None:
    for doc in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).resolve().exists(), f"{doc.name} links to missing {target}"


def _mutated_errors() -> set[str]:
    """Validation errors of the GPU example with the mistakes docs/troubleshooting.md quotes."""
    import copy

    import yaml

    from rljob_operator.validation import check_rljob

    base = yaml.safe_load((REPO / "examples" / "rljob_gsm8k_qwen.yaml").read_text())
    mistakes = [
        ("actor_rollout_ref.actor.ppo_mini_batch_size", 300),
        ("trainer.n_gpus_per_node", 32, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 16),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", 3),
        ("trainer.n_gpus_per_node", 32, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 8),
        ("trainer.nnodes", 2, "spec.checkpoint.uri", "/tmp/x"),
        ("spec.resources.gpuResourceName", "gpu"),
        ("spec.resources.sharedMemory", "64Gi", "spec.resources.memory", "64Gi"),
    ]
    errors: set[str] = set()
    for mistake in mistakes:
        doc = copy.deepcopy(base)
        for path, value in zip(mistake[::2], mistake[1::2], strict=True):
            node = doc if path.startswith("spec.") else doc["spec"]["config"]
            keys = path.removeprefix("spec.").split(".")
            node = node["spec"] if path.startswith("spec.") else node
            for key in keys[:-1]:
                node = node.setdefault(key, {})
            node[keys[-1]] = value
        errors.update(check_rljob(doc).errors)
    return errors


def test_troubleshooting_quotes_real_validation_messages() -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    quoted, fenced = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif fenced and line.strip().startswith("spec."):
            quoted.append(line.strip())
    assert len(quoted) >= 7
    produced = _mutated_errors()
    for line in quoted:
        assert line in produced, f"troubleshooting.md quotes a message validation.py does not produce:\n{line}"
