"""LoRA end to end: GRPO with a peft adapter learns the toy task on 2 FSDP2 workers under Ray, the run exports
its final checkpoint (trainer.export), and the export reproduces the trainer's logits in transformers and in vLLM.

One training run (module fixture) feeds every test here: the learning judgement, what the checkpoint holds,
resuming it in a process of another world size, and the exported folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from hybridflow.protocol import DataProto
from tests.support.demo_run import mean, run_demo
from tests.support.ray_local import local_ray

pytestmark = [pytest.mark.ray, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]

EXAMPLE = REPO / "examples" / "tiny_grpo_lora.yaml"  # the run below is this example's, on the demo's data
_MODEL = yaml.safe_load(EXAMPLE.read_text())["actor_rollout_ref"]["model"]
#: The engine settings of the example's adapter, to rebuild the trainer's model in this process.
LORA = {"lora_rank": _MODEL["lora_rank"], "lora_alpha": _MODEL["lora_alpha"], "target_modules": _MODEL["target_modules"]}
STEPS = yaml.safe_load(EXAMPLE.read_text())["trainer"]["total_training_steps"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("lora")
    with local_ray(num_cpus=2):
        rows = run_demo(out, f"trainer.save_freq={STEPS}", example=EXAMPLE)  # run_demo turns saving off: back on
    root = out / "checkpoints"
    return {"rows": rows, "root": root, "model": out / "model", "actor": root / f"global_step_{STEPS}" / "actor",
            "export": root / "export" / f"global_step_{STEPS}"}


def test_lora_grpo_learns_the_toy_task_against_the_base_model_as_reference(run: dict[str, Any]) -> None:
    train = [r for r in run["rows"] if "critic/score/mean" in r]
    assert len(train) == STEPS
    first, last = mean([r["critic/score/mean"] for r in train[:3]]), mean([r["critic/score/mean"] for r in train[-5:]])
    assert first < 0.1, f"a random model should rarely be right, got {first:.2f}"
    assert last > first + 0.1, f"LoRA GRPO should learn to copy a letter: reward {first:.2f} -> {last:.2f}"
    val = [r for r in run["rows"] if "val-core/toy/copy/reward/mean@1" in r]
    assert val[-1]["val-core/toy/copy/reward/mean@1"] > val[0]["val-core/toy/copy/reward/mean@1"] + 0.3
    # Step 1: lora_B starts at zero, so the policy is the base model, which is the reference: KL 0 exactly.
    assert train[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert train[-1]["actor/kl_loss"] > 1e-3  # the adapter moved the policy off the base model
    # The colocated rollout samples from the merged weights the actor pushes: its log-probs are the actor's.
    assert max(r["training/rollout_probs_diff_max"] for r in train) < 1e-4


def test_the_checkpoint_holds_the_adapter_and_its_optimizer_state_and_resumes_on_another_world_size(
    run: dict[str, Any],
) -> None:
    from safetensors.torch import load_file

    from hybridflow.config import OptimConfig
    from hybridflow.engines.fsdp_engine import FSDPEngine
    from hybridflow.workers.ckpt_io import load_engine_checkpoint

    actor = run["actor"]
    assert sorted(os.listdir(actor)) == ["extra_state.pt", "huggingface", "lora_adapter", "optimizer.pt"]
    adapter = load_file(str(actor / "lora_adapter" / "adapter_model.safetensors"))
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    optim = torch.load(actor / "optimizer.pt", weights_only=False)
    assert set(optim["state"]) == {k.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default.")
                                   for k in adapter}, "optimizer state for the adapter only"
    # Written by 2 FSDP ranks, resumed by 1 process: adapter and optimizer state come back exactly.
    engine = FSDPEngine(str(run["model"]), model_config=LORA, optim_config=OptimConfig(lr=6e-3), seed=7)
    load_engine_checkpoint(engine, str(actor), ["model", "optimizer", "extra"])
    trained = engine.trainable_state_dict()
    assert all(torch.equal(trained[k.replace(".lora_A.", ".lora_A.default.").replace(".lora_B.", ".lora_B.default.")], v)
               for k, v in adapter.items())
    restored = engine.optimizer_state_dict()["state"]
    assert all(torch.equal(restored[k]["exp_avg"], optim["state"][k]["exp_avg"]) for k in optim["state"])


def _batch(tokenizer: Any) -> DataProto:
    enc = tokenizer(["copy a", "copy b", "copy d", "2+2="], padding=True, return_tensors="pt")
    pos = (enc["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
    return DataProto.from_dict(tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                                        "position_ids": pos})


def test_the_run_exports_a_folder_that_reproduces_the_trainers_logits(run: dict[str, Any]) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.config import OptimConfig
    from hybridflow.engines.fsdp_engine import FSDPEngine
    from hybridflow.progress import read_progress
    from hybridflow.workers.ckpt_io import load_engine_checkpoint

    record = read_progress(str(run["root"]))
    assert record is not None and record.export is not None
    assert (record.export.step, record.export.uri, record.export.lora) == (STEPS, str(run["export"]), True)
    files = set(os.listdir(run["export"]))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "lora_adapter"} <= files
    # the trainer's logits: its engine (peft model, unmerged) with the checkpoint's adapter
    engine = FSDPEngine(str(run["model"]), model_config=LORA, optim_config=OptimConfig(lr=1e-3))
    load_engine_checkpoint(engine, str(run["actor"]), ["model"])
    tokenizer = AutoTokenizer.from_pretrained(run["export"])
    b = _batch(tokenizer).batch
    with torch.no_grad():
        trainer_logits = engine.forward(b["input_ids"], b["attention_mask"], b["position_ids"])
        merged = AutoModelForCausalLM.from_pretrained(run["export"]).eval()
        export_logits = merged(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                               position_ids=b["position_ids"]).logits
        base = AutoModelForCausalLM.from_pretrained(run["model"])
        adapter = PeftModel.from_pretrained(base, str(run["export"] / "lora_adapter")).eval()
        adapter_logits = adapter(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                 position_ids=b["position_ids"]).logits
    real = b["attention_mask"].bool()
    diff = float((export_logits - trainer_logits).abs()[real].max())
    print(f"\nexported model vs trainer: max |logit diff| {diff:.2e}")
    assert diff < 1e-4
    assert float((adapter_logits - trainer_logits).abs()[real].max()) < 1e-4
    assert float((export_logits - base(input_ids=b["input_ids"]).logits).abs().max()) > 1e-2  # not the base model


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (CPU: `make vllm`)")
def test_vllm_serves_the_export_and_the_pushed_merged_weights_like_transformers(run: dict[str, Any], tmp_path: Path) -> None:
    """In a child process (vLLM changes torch's state): the export served as is, and the base model given the
    merged weights through VLLMRollout.load_weights (what the colocated and server-mode rollouts receive)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "vllm.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "trainer_image"), str(REPO)])}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.vllm_export_check", str(out), "--export", str(run["export"]),
         "--base", str(run["model"]), "--checkpoint", str(run["actor"])],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    model = AutoModelForCausalLM.from_pretrained(run["export"]).eval()
    for name in ("export", "pushed"):
        got = result[name]
        for prompt, tokens, logprobs in zip(got["prompts"], got["tokens"], got["logprobs"], strict=True):
            ids = torch.tensor([prompt + tokens])
            with torch.no_grad():
                lp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
            expected = lp.gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1)
            assert int(lp[0].argmax()) == tokens[0], f"{name}: vLLM's greedy token is not transformers' argmax"
            torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-4, rtol=0)
