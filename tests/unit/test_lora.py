"""LoRA pieces in one process: verl's keys in the config, the merge against peft's own, the reference policy,
adapter files, and the messages for adapters or checkpoints that do not fit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridflow.config import ConfigError, OptimConfig, load_config
from hybridflow.engines import lora
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.models.tiny import build_tiny_model
from hybridflow.workers.ckpt_io import load_engine_checkpoint, save_engine_checkpoint

IDS = torch.tensor([[5, 9, 14, 3, 22, 7], [11, 4, 8, 19, 2, 6]])
MASK = torch.ones_like(IDS)
POS = torch.arange(6).expand(2, 6)
LORA = {"lora_rank": 4, "lora_alpha": 8, "target_modules": "all-linear"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("lora") / "model"))


def _stepped(model_dir: str, model_config: dict, seed: int = 0) -> FSDPEngine:
    """An engine after one optimizer step on a made-up loss (so lora_B is no longer zero)."""
    engine = FSDPEngine(model_dir, model_config=model_config, optim_config=OptimConfig(lr=1e-2), seed=seed)
    engine.forward(IDS, MASK, POS).logsumexp(-1).mean().backward()
    engine.optimizer_step()
    return engine


def test_verl_lora_keys_are_config_keys() -> None:
    cfg = load_config(None, ["actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.model.lora_alpha=32",
                             "actor_rollout_ref.model.target_modules=all-linear",
                             "actor_rollout_ref.model.exclude_modules=.*visual.*",
                             "actor_rollout_ref.model.lora_adapter_path=/saved/lora_adapter",
                             "actor_rollout_ref.rollout.layered_summon=true"])
    model = cfg.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules, model.exclude_modules) == (32, 32, "all-linear",
                                                                                                 ".*visual.*")
    assert model.lora_adapter_path == "/saved/lora_adapter" and lora.lora_enabled(model)
    assert any("layered_summon" in note for note in cfg.verl_notes)  # accepted: the result is the same here
    assert not lora.lora_enabled(load_config(None, []).actor_rollout_ref.model)
    with pytest.raises(ConfigError, match="critic.model.lora_rank: LoRA for the critic"):
        load_config(None, ["critic.model.lora_rank=8"])


def test_merged_weights_equal_peft_merge_and_the_reference_is_the_base_model(model_dir: str) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    engine = _stepped(model_dir, LORA)
    trainable, total = lora.trainable_parameter_count(engine.module)
    assert 0 < trainable < total / 5
    assert {id(p) for g in engine.optimizer.param_groups for p in g["params"]} == {
        id(p) for p in engine.module.parameters() if p.requires_grad}  # the frozen base has no optimizer state
    merged = engine.full_state_dict()
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    assert set(merged) == set(base.state_dict()), "merged weights carry the base model's names"
    with torch.no_grad():
        policy = engine.forward(IDS, MASK, POS)
        with engine.adapter_disabled():
            reference = engine.forward(IDS, MASK, POS)
        base_logits = base(input_ids=IDS).logits
        base.load_state_dict(merged)
        merged_logits = base(input_ids=IDS).logits
    torch.testing.assert_close(reference, base_logits, atol=0, rtol=0)  # adapter off: the base model, exactly
    assert float((policy - base_logits).abs().max()) > 1e-2
    torch.testing.assert_close(merged_logits, policy, atol=1e-5, rtol=0)
    # peft's own merge of the same adapter gives the same tensors
    tmp = Path(engine.model_path).parent / "adapter-check"
    lora.write_adapter_folder(str(tmp), lora.to_adapter_file(engine.trainable_state_dict()),
                              lora.adapter_config_dict(engine.module))
    reference_merge = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(tmp))
    theirs = reference_merge.merge_and_unload().state_dict()
    assert max(float((theirs[k] - v).abs().max()) for k, v in merged.items()) < 1e-6


def test_a_lora_checkpoint_resumes_exactly_and_refuses_the_wrong_settings(model_dir: str, tmp_path: Path) -> None:
    engine = _stepped(model_dir, LORA)
    ckpt = str(tmp_path / "actor")
    save_engine_checkpoint(engine, ckpt, ["model", "optimizer", "extra", "hf_model"])
    merged_file = tmp_path / "actor" / "huggingface" / "model.safetensors"
    assert merged_file.exists() and not (tmp_path / "actor" / "model.pt").exists()
    resumed = FSDPEngine(model_dir, model_config=LORA, optim_config=OptimConfig(lr=1e-2), seed=5)
    load_engine_checkpoint(resumed, ckpt, ["model", "optimizer", "extra"])
    with torch.no_grad():
        torch.testing.assert_close(resumed.forward(IDS, MASK, POS), engine.forward(IDS, MASK, POS), atol=0, rtol=0)
    assert resumed.lr_scheduler.state_dict() == engine.lr_scheduler.state_dict()
    # another rank: the adapter's shapes differ from this model's LoRA layers
    other = FSDPEngine(model_dir, model_config={**LORA, "lora_rank": 2}, optim_config=OptimConfig(lr=1e-2))
    with pytest.raises(ValueError, match=r"does not fit this model's LoRA layers: shapes differ .* Use the lora_rank"):
        load_engine_checkpoint(other, ckpt, ["model"])
    full = FSDPEngine(model_dir, optim_config=OptimConfig(lr=1e-2))
    with pytest.raises(ValueError, match="holds a LoRA adapter .* but this run trains all weights"):
        load_engine_checkpoint(full, ckpt, ["model"])
    full_ckpt = str(tmp_path / "full")
    save_engine_checkpoint(full, full_ckpt, ["model"])
    with pytest.raises(ValueError, match="holds full model weights .* but this run trains LoRA"):
        load_engine_checkpoint(resumed, full_ckpt, ["model"])


def test_starting_from_an_adapter_folder(model_dir: str, tmp_path: Path) -> None:
    trained = _stepped(model_dir, LORA)
    save_engine_checkpoint(trained, str(tmp_path / "actor"), ["model"])
    engine = FSDPEngine(model_dir, model_config={"lora_adapter_path": str(tmp_path / "actor" / lora.ADAPTER_DIR)},
                        optim_config=OptimConfig(lr=1e-2))
    assert engine.lora and sum(p.numel() for p in engine.module.parameters() if p.requires_grad) > 0
    with torch.no_grad():
        torch.testing.assert_close(engine.forward(IDS, MASK, POS), trained.forward(IDS, MASK, POS), atol=0, rtol=0)
    with pytest.raises(FileNotFoundError, match="holds no adapter_config.json; point it at a peft adapter folder"):
        FSDPEngine(model_dir, model_config={"lora_adapter_path": str(tmp_path)}, optim_config=OptimConfig(lr=1e-2))


def test_an_adapter_that_cannot_be_merged_is_refused(model_dir: str) -> None:
    with pytest.raises(ValueError, match=r"LoRA on non-Linear layers \(Embedding\).*target Linear layers only"):
        FSDPEngine(model_dir, model_config={**LORA, "target_modules": ["q_proj", "embed_tokens"]},
                   optim_config=OptimConfig(lr=1e-2))
    with pytest.raises(ValueError, match=r"exclude_modules=\['q_proj'\] selects no layer for LoRA"):
        FSDPEngine(model_dir, model_config={**LORA, "target_modules": ["q_proj"], "exclude_modules": ["q_proj"]},
                   optim_config=OptimConfig(lr=1e-2))


def test_merge_is_pure_tensor_math() -> None:
    a, b, w = torch.randn(2, 3), torch.randn(4, 2), torch.randn(4, 3)
    state = {"base_model.model.x.base_layer.weight": w, "base_model.model.x.base_layer.bias": torch.ones(4),
             "base_model.model.x.lora_A.default.weight": a, "base_model.model.x.lora_B.default.weight": b,
             "base_model.model.norm.weight": torch.ones(3)}
    out = lora.merge_lora_state_dict(state, {"x": lora.LoraScale(0.5)})
    assert set(out) == {"x.weight", "x.bias", "norm.weight"}
    torch.testing.assert_close(out["x.weight"], w + 0.5 * b @ a)
    transposed = lora.merge_lora_state_dict({**state, "base_model.model.x.base_layer.weight": w.T},
                                            {"x": lora.LoraScale(0.5, fan_in_fan_out=True)})
    torch.testing.assert_close(transposed["x.weight"], (w + 0.5 * b @ a).T)
    assert lora.merge_lora_state_dict({}, {"x": lora.LoraScale(1.0)}) == {}  # ranks without the gather


def test_the_reference_worker_shares_the_actors_engine_and_builds_no_second_model(model_dir: str) -> None:
    from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker
    from tests.support.tiny_workers import tiny_worker_config

    lora_keys = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
                 "actor_rollout_ref.actor.use_kl_loss=true", "trainer.n_gpus_per_node=1"]
    worker = ActorRolloutRefWorker(tiny_worker_config(model_dir, *lora_keys), role="actor_ref")
    worker.init_model()
    assert worker.ref is not None and worker.actor is not None and worker.ref.engine is worker.actor.engine
    with pytest.raises(ValueError, match="the reference must live in the actor's worker"):
        ActorRolloutRefWorker(tiny_worker_config(model_dir, *lora_keys), role="ref").init_model()
