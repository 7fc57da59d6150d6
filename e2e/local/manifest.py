"""The RLJob every end-to-end run applies: examples/tiny_grpo_rljob.yaml, made quick and pointed at its inputs.

One renderer for the local e2e test and the cluster scripts (`e2e/cluster/*.sh`), so they apply the
same job and cannot drift apart. The inputs (tiny model, toy tokenizer, copy-a-letter data) are the
ones `hybridflow.demo.prepare(dir)` writes; only their folder differs (a tmp dir here, `/home/ray/demo`
in the e2e image).

    python -m e2e.local.manifest NAME --inputs DIR --checkpoint-uri URI [--secret NAME] [--image IMAGE] \
        [key=value ...]           # prints the RLJob as JSON (valid YAML) for `kubectl apply -f -`
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hybridflow.config import apply_overrides

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_grpo_rljob.yaml"
#: The example made small and quick: one worker process, 16 prompts x 4 samples per step, no validation.
QUICK = (
    "trainer.n_gpus_per_node=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=0",
    "data.train_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
)


def input_overrides(inputs_dir: str) -> dict[str, str]:
    """Config keys naming the inputs `hybridflow.demo.prepare(inputs_dir)` writes (same layout)."""
    root = inputs_dir.rstrip("/")
    return {
        "actor_rollout_ref.model.path": f"{root}/model",
        "data.train_files": f"{root}/data/train.parquet",
        "data.val_files": f"{root}/data/test.parquet",
    }


def render_rljob(name: str, *, inputs_dir: str, checkpoint_uri: str, secret: str | None = None,
                 image: str | None = None, overrides: Iterable[str] = ()) -> dict[str, Any]:
    """The example RLJob as `name`: inputs under `inputs_dir`, QUICK, then `overrides`; checkpoints at the URI."""
    job: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"] = {"name": name}
    paths = [f"{key}={value}" for key, value in input_overrides(inputs_dir).items()]
    job["spec"]["config"] = apply_overrides(job["spec"]["config"], [*paths, *QUICK, *overrides])
    job["spec"]["checkpoint"] = {"uri": checkpoint_uri, **({"secretRef": {"name": secret}} if secret else {})}
    if image:
        job["spec"]["image"] = image
    return job


def render_secret(name: str, values: Mapping[str, str]) -> dict[str, Any]:
    """An Opaque Secret holding `values` (e.g. the AWS_* variables the trainer's storage reads)."""
    data = {key: base64.b64encode(value.encode()).decode() for key, value in values.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque", "data": data}


def dump(docs: Sequence[Mapping[str, Any]]) -> str:
    """Documents as JSON joined by `---`: valid YAML with every key quoted, so kubectl's YAML 1.1 parser
    cannot turn verl's `rollout.n` into the boolean false."""
    return "\n---\n".join(json.dumps(doc, indent=1) for doc in docs) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the rendered RLJob (for the cluster scripts)."""
    parser = argparse.ArgumentParser(prog="python -m e2e.local.manifest", description=__doc__.splitlines()[0])
    parser.add_argument("name", help="metadata.name of the RLJob")
    parser.add_argument("--inputs", required=True, help="folder with model/ and data/ as demo.prepare writes them")
    parser.add_argument("--checkpoint-uri", required=True, help="spec.checkpoint.uri, e.g. s3://bucket/runs/NAME")
    parser.add_argument("--secret", help="spec.checkpoint.secretRef: Secret with the AWS_* variables")
    parser.add_argument("--image", help="spec.image (the trainer image with the inputs baked in)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="more trainer config overrides")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    job = render_rljob(args.name, inputs_dir=args.inputs, checkpoint_uri=args.checkpoint_uri, secret=args.secret,
                       image=args.image, overrides=args.overrides)
    sys.stdout.write(dump([job]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
