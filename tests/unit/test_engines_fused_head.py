"""verl's kernel/memory keys: the fused log-prob head, entropy checkpointing and torch.compile equal the plain path.

References: log_softmax / softmax of the materialised logits (one shot), the plain engine path, and
for memory the live tensor bytes of the logits path.
"""

from __future__ import annotations

import logging
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from hybridflow.algorithms import torch_functional
from hybridflow.algorithms.torch_functional import (
    CompiledOrEager,
    entropy_checkpointed,
    entropy_from_logits,
    entropy_rows,
    logprobs_from_logits,
)
from hybridflow.engines import fused_head
from hybridflow.engines.actor import LogProbKernels, PPOActor
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.engines.fused_head import fused_linear_log_probs
from hybridflow.models.tiny import build_tiny_model
from hybridflow.protocol import DataProto

TEMPERATURE = 0.7


def plain(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: torch.Tensor | None = None,
          temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies from the whole logits tensor, one shot."""
    log_p = torch.log_softmax(torch.nn.functional.linear(hidden, weight, bias) / temperature, dim=-1)
    return log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(log_p.exp() * log_p).sum(-1)


# several chunks with a ragged last one; a single chunk
@pytest.mark.parametrize(("with_bias", "chunk_rows"), [(True, 5), (False, 64)])
def test_fused_log_probs_entropy_and_gradients_equal_the_logits_path(with_bias: bool, chunk_rows: int) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 9, 16, generator=gen).requires_grad_()
    weight = torch.randn(101, 16, generator=gen).requires_grad_()
    bias = torch.randn(101, generator=gen).requires_grad_() if with_bias else None
    labels = torch.randint(0, 101, (3, 9), generator=gen)
    g_lp, g_ent = torch.randn(3, 9, generator=gen), torch.randn(3, 9, generator=gen)
    params = [hidden, weight, *([bias] if with_bias else [])]

    lp, ent = fused_linear_log_probs(hidden, weight, labels, bias=bias, temperature=TEMPERATURE, with_entropy=True,
                                     chunk_rows=chunk_rows)
    grads = torch.autograd.grad((lp * g_lp).sum() + (ent * g_ent).sum(), params)
    ref_lp, ref_ent = plain(hidden, weight, labels, bias, TEMPERATURE)
    ref_grads = torch.autograd.grad((ref_lp * g_lp).sum() + (ref_ent * g_ent).sum(), params, retain_graph=True)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)

    # log-probs alone (no entropy asked): the same log-probs and their gradient
    lp_only, none = fused_linear_log_probs(hidden, weight, labels, bias=bias, temperature=TEMPERATURE,
                                           chunk_rows=chunk_rows)
    assert none is None
    (g_w,) = torch.autograd.grad((lp_only * g_lp).sum(), [weight])
    torch.testing.assert_close(g_w, torch.autograd.grad((ref_lp * g_lp).sum(), [weight])[0], atol=1e-5, rtol=1e-5)


class LiveBytes(TorchDispatchMode):
    """Peak bytes of tensor storages created while active (views and in-place results of older tensors excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in inputs or key in self.live or storage.nbytes() == 0:
                continue
            self.live[key] = storage.nbytes()
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
            weakref.finalize(storage, self._free, key)
        return out


def test_fused_head_peak_memory_is_a_fraction_of_the_logits_path() -> None:
    """~50k vocabulary, 256 response tokens: forward alone, and forward + backward (log-prob and entropy terms)."""
    n_tokens, hidden_size, vocab = 256, 16, 50257
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n_tokens, hidden_size, generator=gen).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, generator=gen) * 0.05).requires_grad_()
    labels = torch.randint(0, vocab, (n_tokens,), generator=gen)

    def logits_path() -> tuple[torch.Tensor, torch.Tensor]:
        logits = hidden @ weight.t()
        return logprobs_from_logits(logits, labels), entropy_from_logits(logits)

    def fused_path() -> tuple[torch.Tensor, torch.Tensor | None]:
        return fused_linear_log_probs(hidden, weight, labels, with_entropy=True)

    peaks: dict[tuple[str, bool], float] = {}
    for name, fn in (("logits", logits_path), ("fused", fused_path)):
        for train in (False, True):
            meter = LiveBytes()
            with torch.set_grad_enabled(train), meter:
                lp, ent = fn()
                if train:
                    (lp.sum() + 0.01 * ent.sum()).backward()  # type: ignore[union-attr]
            hidden.grad = weight.grad = None
            peaks[(name, train)] = meter.peak / 2**20
    logits_mib = n_tokens * vocab * 4 / 2**20
    print(f"\npeak MiB for {n_tokens} tokens x {vocab} vocab (fp32 logits alone: {logits_mib:.1f} MiB): "
          + ", ".join(f"{name} {'fwd+bwd' if train else 'fwd'} {mib:.1f}" for (name, train), mib in peaks.items()))
    assert peaks[("logits", False)] >= logits_mib  # the reference really holds the logits
    assert peaks[("fused", False)] < 0.4 * peaks[("logits", False)]
    assert peaks[("fused", True)] < 0.3 * peaks[("logits", True)]


def test_entropy_checkpointing_keeps_no_softmax_and_gives_the_same_values_and_gradients() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = (torch.randn(12, 300, generator=gen) * 3).requires_grad_()
    weights = torch.randn(12, generator=gen)
    saved: list[int] = []

    def run(fn: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            ent = fn(logits)
        (grad,) = torch.autograd.grad((ent * weights).sum(), [logits])
        return ent, grad, sum(saved)

    entropy_fn = lambda z: entropy_from_logits(z, chunk_rows=5)  # noqa: E731 - chunked, as in the actor
    plain_ent, plain_grad, plain_saved = run(entropy_fn)
    ckpt_ent, ckpt_grad, ckpt_saved = run(lambda z: entropy_checkpointed(z, entropy_fn))
    torch.testing.assert_close(ckpt_ent, plain_ent, atol=0, rtol=0)
    torch.testing.assert_close(ckpt_grad, plain_grad, atol=1e-6, rtol=1e-6)
    assert plain_saved >= 2 * 12 * 300  # the input and the softmax of every chunk are kept for backward
    assert ckpt_saved <= 12 * 300  # only the input (kept anyway by the log-prob)
    with torch.no_grad():  # no autograd: computed as is
        torch.testing.assert_close(entropy_checkpointed(logits, entropy_fn), plain_ent.detach())


def test_torch_compile_equals_eager_values_and_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    # aot_eager: dynamo + AOTAutograd, as inductor, without its C++ build (~25 s here; checked by hand equal to 1e-6)
    monkeypatch.setattr(torch_functional, "COMPILE_BACKEND", "aot_eager")
    compiled = CompiledOrEager(entropy_rows, "the entropy")
    gen = torch.Generator().manual_seed(3)
    for rows in (7, 13):  # dynamic shapes: no recompilation per chunk size
        logits = (torch.randn(rows, 50, generator=gen) * 2).requires_grad_()
        got = entropy_from_logits(logits, chunk_rows=5, rows_fn=compiled)
        want = entropy_from_logits(logits)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        (g1,) = torch.autograd.grad(got.sum(), [logits])
        (g2,) = torch.autograd.grad(want.sum(), [logits])
        torch.testing.assert_close(g1, g2, atol=1e-6, rtol=1e-6)
    assert compiled.failure is None


def test_a_failing_compilation_falls_back_with_a_clear_message(caplog: pytest.LogCaptureFixture) -> None:
    def broken_backend(gm: Any, example_inputs: Any) -> Any:
        raise RuntimeError("no C++ compiler found")

    compiled = CompiledOrEager(entropy_rows, "the entropy from logits", backend=broken_backend)
    logits = torch.randn(4, 20)
    with caplog.at_level(logging.WARNING):
        torch.testing.assert_close(entropy_from_logits(logits, rows_fn=compiled), entropy_from_logits(logits))
        entropy_from_logits(logits, rows_fn=compiled)  # warned once, eager from now on
    assert compiled.failure is not None and "no C++ compiler found" in compiled.failure
    (record,) = [r for r in caplog.records if "use_torch_compile" in r.getMessage()]
    assert "torch.compile of the entropy from logits failed" in record.getMessage()
    assert "without compilation" in record.getMessage() and "use_torch_compile=false" in record.getMessage()


# ----------------------------------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_model(Path(tmp_path_factory.mktemp("tiny")) / "m", seed=0))


def batch(vocab: int, rows: int = 4, prompt: int = 6, resp: int = 5) -> DataProto:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, prompt + resp), generator=gen)
    mask = torch.ones(rows, prompt + resp, dtype=torch.long)
    for i in range(rows):
        mask[i, : i % 3] = 0  # left padding of uneven length
    rmask = torch.ones(rows, resp, dtype=torch.long)
    rmask[0, 3:] = 0
    return DataProto.from_dict(
        tensors={
            "input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
            "responses": ids[:, prompt:].clone(), "response_mask": rmask,
            "advantages": torch.randn(rows, resp, generator=gen),
        },
        meta_info={"temperature": TEMPERATURE},
    )


def run_actor(model_dir: str, model_config: dict[str, Any] | None = None, **kernels: bool) -> dict[str, Any]:
    """Log-probs and entropies, then one on-policy update with an entropy bonus: its gradients and metrics."""
    engine = FSDPEngine(model_dir, model_config=model_config, optim_config={"lr": 1e-3, "weight_decay": 0.0},
                        total_steps=2)
    actor = PPOActor(engine, {"entropy_coeff": 0.05, "ppo_epochs": 1}, kernels=LogProbKernels(**kernels))
    data = batch(engine.hf_config.vocab_size)
    lp, ent = actor.compute_log_prob(data, micro_batch_size=3, calculate_entropy=True)
    grads: dict[str, torch.Tensor] = {}
    step = engine.optimizer_step

    def capture_then_step() -> float:
        grads.update({n: p.grad.clone() for n, p in engine.module.named_parameters() if p.grad is not None})
        return step()

    engine.optimizer_step = capture_then_step  # type: ignore[method-assign]
    metrics = actor.update_policy(data, mini_batch_size=len(data), micro_batch_size=2)
    b = data.batch
    logits = engine.forward(b["input_ids"], b["attention_mask"], b["position_ids"])  # the plain forward, untouched
    return {"log_probs": lp, "entropy": ent, "grads": grads, "metrics": metrics, "fused": engine.fused_head is not None,
            "vocab": logits.shape[-1] == engine.hf_config.vocab_size}


@pytest.fixture(scope="module")
def plain_run(model_dir: str) -> dict[str, Any]:
    return run_actor(model_dir)


@pytest.mark.parametrize(("model_config", "kernels"), [
    ({"use_fused_kernels": True, "fused_kernel_options": {"chunk_size": 3}}, {}),  # several chunks per micro-batch
    (None, {"entropy_checkpointing": True}),
], ids=["fused_head", "entropy_checkpointing"])
def test_engine_log_probs_and_gradients_equal_the_plain_path(
    model_dir: str, plain_run: dict[str, Any], model_config: dict[str, Any] | None, kernels: dict[str, bool]
) -> None:
    run = run_actor(model_dir, model_config, **kernels)
    assert run["fused"] == (model_config is not None) and not plain_run["fused"] and run["vocab"]
    torch.testing.assert_close(run["log_probs"], plain_run["log_probs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(run["entropy"], plain_run["entropy"], atol=1e-5, rtol=1e-5)
    assert run["grads"].keys() == plain_run["grads"].keys() and len(run["grads"]) > 10
    for name, grad in plain_run["grads"].items():
        torch.testing.assert_close(run["grads"][name], grad, atol=1e-6, rtol=1e-4)
    for key in ("actor/grad_norm", "actor/entropy", "actor/pg_loss"):
        assert run["metrics"][key] == pytest.approx(plain_run["metrics"][key], rel=1e-5, abs=1e-7)


def test_fused_head_refuses_a_model_that_transforms_its_logits(model_dir: str) -> None:
    with pytest.raises(ValueError, match=r"final_logit_softcapping=30.0.*set use_fused_kernels=false"):
        FSDPEngine(model_dir, model_config={"use_fused_kernels": True,
                                            "override_config": {"final_logit_softcapping": 30.0}})


def test_use_liger_is_refused_on_cpu_and_without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    module = torch.nn.Linear(2, 2)
    assert fused_head.apply_liger(module, {"use_liger": False}, torch.device("cpu")) is False
    with pytest.raises(ValueError, match="CUDA GPUs only.*set use_liger=false"):
        fused_head.apply_liger(module, {"use_liger": True}, torch.device("cpu"))
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # not installed
    with pytest.raises(ImportError, match=r"needs the liger-kernel package .*pip install liger-kernel"):
        fused_head.apply_liger(module, {"use_liger": True}, torch.device("cuda"))
