"""`python -m hybridflow.model_merger` on a full fine-tuning checkpoint: sharded safetensors, tokenizer and generation
config that reproduce the trainer's logits, from a local folder and from S3 (moto) to S3; its error messages.

The LoRA path (adapter + merged model, written at the end of a real run) is tests/integration/test_lora.py.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow import storage
from hybridflow.config import OptimConfig
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.model_merger import main, merge
from hybridflow.models.tiny import build_tiny_model
from hybridflow.workers.ckpt_io import save_engine_checkpoint
from tests.support.s3 import MotoServer, make_bucket, moto_s3, s3_env

IDS = torch.tensor([[5, 9, 14, 3, 22, 7], [0, 0, 11, 4, 8, 19]])
MASK = (IDS != 0).long()
POS = (MASK.cumsum(dim=1) - 1).clamp(min=0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A full fine-tuning checkpoint after one optimizer step, and the engine's logits then."""
    from transformers import AutoConfig, AutoModelForCausalLM

    root = tmp_path_factory.mktemp("merger")
    model_dir = str(build_tiny_model(root / "model", arch="llama"))
    config = AutoConfig.from_pretrained(model_dir)
    config.tie_word_embeddings = True  # as SmolLM2's: one tensor under two names, saved once
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    engine = FSDPEngine(model_dir, optim_config=OptimConfig(lr=1e-2), seed=0)
    engine.forward(IDS, MASK, POS).logsumexp(-1).mean().backward()
    engine.optimizer_step()
    with torch.no_grad():
        logits = engine.forward(IDS, MASK, POS)
    actor = root / "global_step_1" / "actor"
    save_engine_checkpoint(engine, str(actor), ["model", "optimizer", "extra"])
    return {"model": model_dir, "actor": actor, "logits": logits, "root": root}


def _logits(folder: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(input_ids=IDS, attention_mask=MASK, position_ids=POS).logits


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs()[MASK.bool()].max())


def test_merge_writes_a_sharded_folder_that_reproduces_the_trainers_logits(trained: dict[str, Any], tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    target = tmp_path / "hf"
    assert main(["merge", "--backend", "fsdp", "--local_dir", str(trained["actor"]), "--target_dir", str(target),
                 "--max_shard_size", "60KB"]) == 0
    files = set(os.listdir(target))
    shards = sorted(f for f in files if f.startswith("model-") and f.endswith(".safetensors"))
    assert len(shards) > 1 and "model.safetensors.index.json" in files, files
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= files
    index = json.loads((target / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    diff = _diff(_logits(str(target)), trained["logits"])
    print(f"\nfull fine-tune export vs trainer: max |logit diff| {diff:.2e}")
    assert diff < 1e-5
    assert AutoTokenizer.from_pretrained(target).get_vocab() == AutoTokenizer.from_pretrained(trained["model"]).get_vocab()
    assert GenerationConfig.from_pretrained(target).to_dict() == GenerationConfig.from_pretrained(trained["model"]).to_dict()
    # verl's `test` operation: the merged checkpoint against a folder, equal to our own export, unequal to the base
    assert main(["test", "--backend", "fsdp", "--local_dir", str(trained["actor"]), "--test_hf_dir", str(target)]) == 0
    assert main(["test", "--backend", "fsdp", "--local_dir", str(trained["actor"]),
                 "--test_hf_dir", trained["model"]]) == 1
    assert "differences" in capsys.readouterr().err
    # a second export with other shards leaves no stale shard behind
    merge(str(trained["actor"]), str(target), max_shard_size="5GB")
    assert sorted(f for f in os.listdir(target) if f.endswith(".safetensors")) == ["model.safetensors"]


@pytest.fixture
def s3_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    server: MotoServer
    with moto_s3() as server:
        for key, value in s3_env(server.url).items():
            monkeypatch.setenv(key, value)
        bucket = f"merge-{uuid.uuid4().hex[:8]}"
        make_bucket(server.url, bucket)
        yield f"s3://{bucket}/run"


def test_merge_reads_a_checkpoint_from_s3_and_writes_the_folder_to_s3(trained: dict[str, Any], s3_root: str,
                                                                    tmp_path: Path) -> None:
    remote_actor = f"{s3_root}/global_step_1/actor"
    storage.upload_dir(str(trained["actor"]), remote_actor)
    target = f"{s3_root}/export/global_step_1"
    assert main(["merge", "--backend", "fsdp", "--local_dir", remote_actor, "--target_dir", target]) == 0
    local = tmp_path / "downloaded"
    files = storage.download_dir(target, str(local))
    assert {os.path.basename(f) for f in files} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert _diff(_logits(str(local)), trained["logits"]) < 1e-5


def test_bad_input_is_named_with_what_to_pass(trained: dict[str, Any], tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    def error(*args: str) -> str:
        assert main(["merge", "--backend", *args, "--target_dir", str(tmp_path / "out")]) == 2
        return capsys.readouterr().err

    assert "its checkpoints are --backend fsdp" in error("megatron", "--local_dir", str(trained["actor"]))
    assert "no such folder" in error("fsdp", "--local_dir", str(tmp_path / "nowhere"))
    assert "hf upload" in error("fsdp", "--local_dir", str(trained["actor"]), "--hf_upload_path", "me/model")
    # a checkpoint without huggingface/ (written before the trainer saved one): --hf_model_path fills in
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model.pt").write_bytes((trained["actor"] / "model.pt").read_bytes())
    assert "pass --hf_model_path" in error("fsdp", "--local_dir", str(bare))
    assert main(["merge", "--backend", "fsdp", "--local_dir", str(bare), "--hf_model_path", trained["model"],
                 "--target_dir", str(tmp_path / "ok")]) == 0
    assert _diff(_logits(str(tmp_path / "ok")), trained["logits"]) < 1e-5
