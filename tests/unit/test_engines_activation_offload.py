"""model.enable_activation_offload: saved activations go to host memory in the training step, with the same numbers.

The flag reaches the actor's and critic's engines (not the reference's: no backward); on CUDA the forward+backward
of each micro-batch runs under `torch.autograd.graph.save_on_cpu`, whose packed tensors are checked to be on the
host; on CPU the step is left alone (activations are in host memory already). Either way the loss, metrics and
gradients equal those of a run without the flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.config import load_config
from hybridflow.engines.actor import PPOActor
from hybridflow.engines.critic import PPOCritic
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.models.tiny import build_tiny_model
from hybridflow.protocol import DataProto

OPTIM = {"lr": 1e-3, "weight_decay": 0.0}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(Path(tmp_path_factory.mktemp("tiny")) / "m", seed=0))


class SpyOnCpu(torch.autograd.graph.save_on_cpu):
    """save_on_cpu that records what its pack hook returns: (device, host copy) per saved tensor."""

    packed: list[Any] = []

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
        super().__init__(pin_memory, device_type)
        pack = self.pack_hook

        def spy(tensor: torch.Tensor) -> Any:
            out = pack(tensor)
            SpyOnCpu.packed.append(out)
            return out

        self.pack_hook = spy


def batch(vocab: int, rows: int = 4, prompt: int = 6, resp: int = 5) -> DataProto:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, prompt + resp), generator=gen)
    mask = torch.ones(rows, prompt + resp, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    rmask = torch.ones(rows, resp, dtype=torch.long)
    rmask[0, 3:] = 0
    return DataProto.from_dict(tensors={
        "input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
        "responses": ids[:, prompt:].clone(), "response_mask": rmask,
        "advantages": torch.randn(rows, resp, generator=gen), "values": torch.randn(rows, resp, generator=gen),
        "returns": torch.randn(rows, resp, generator=gen),
    })


def one_update(model_dir: str, device: str, offload: bool, kind: str) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One actor (or critic) update of two micro-batches; its metrics and the gradients before the optimizer step."""
    overrides = [f"actor_rollout_ref.model.enable_activation_offload={str(offload).lower()}",
                 f"critic.model.enable_activation_offload={str(offload).lower()}", "actor_rollout_ref.model.path=x"]
    cfg = load_config(None, overrides)
    model_config = cfg.actor_rollout_ref.model if kind == "causal_lm" else cfg.critic.model
    engine = FSDPEngine(model_dir, kind=kind, device=device, model_config=model_config, optim_config=OPTIM,  # type: ignore[arg-type]
                        total_steps=2)
    assert engine.activation_offload is offload
    grads: dict[str, torch.Tensor] = {}
    step = engine.optimizer_step

    def capture_then_step() -> float:
        grads.update({n: p.grad.detach().cpu().clone() for n, p in engine.module.named_parameters() if p.grad is not None})
        return step()

    engine.optimizer_step = capture_then_step  # type: ignore[method-assign]
    data = batch(engine.hf_config.vocab_size)
    if kind == "causal_lm":
        metrics = PPOActor(engine, {"entropy_coeff": 0.05, "ppo_epochs": 1}).update_policy(data, len(data), 2)
    else:
        metrics = PPOCritic(engine, {"ppo_epochs": 1}).update_critic(data, len(data), 2)
    return metrics, grads


def test_the_flag_reaches_the_trained_engines_only(model_dir: str) -> None:
    cfg = load_config(None, ["actor_rollout_ref.model.enable_activation_offload=true"])
    assert FSDPEngine(model_dir, model_config=cfg.actor_rollout_ref.model, optim_config=OPTIM).activation_offload
    assert not FSDPEngine(model_dir, model_config=cfg.actor_rollout_ref.model).activation_offload  # the reference
    assert not FSDPEngine(model_dir, model_config=load_config(None, []).actor_rollout_ref.model,
                          optim_config=OPTIM).activation_offload


@pytest.mark.parametrize("kind", ["causal_lm", "value"])
@pytest.mark.parametrize("device", DEVICES)
def test_a_step_with_activation_offload_equals_one_without(
    model_dir: str, device: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", SpyOnCpu)
    SpyOnCpu.packed = []
    plain_metrics, plain_grads = one_update(model_dir, device, False, kind)
    assert SpyOnCpu.packed == []
    metrics, grads = one_update(model_dir, device, True, kind)
    if device == "cpu":
        assert SpyOnCpu.packed == []  # nothing to move: the step is left alone
    else:
        assert len(SpyOnCpu.packed) > 10  # every activation saved for backward went through the hook...
        assert all(host.device.type == "cpu" for _, host in SpyOnCpu.packed)  # ...into host memory
    assert metrics.keys() == plain_metrics.keys()
    for key, value in plain_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert grads.keys() == plain_grads.keys() and len(grads) > 10
    exact = device == "cpu"  # CUDA kernels may sum in another order from one run to the next
    for name, grad in plain_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=0 if exact else 1e-6, rtol=0 if exact else 1e-5)
