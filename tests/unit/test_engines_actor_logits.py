"""The actor's lean logits path (issue 17) equals the plain one: full-sequence head, slice, one-shot softmax."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridflow.algorithms import entropy_from_logits, logprobs_from_logits
from hybridflow.engines.actor import PPOActor, response_logits
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.models.tiny import build_tiny_model
from hybridflow.protocol import DataProto

P, R, TEMPERATURE = 7, 5, 0.7


def batch(vocab: int, rows: int = 6) -> DataProto:
    """Left-padded prompts (uneven lengths) and responses, as the trainer passes them."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, P + R), generator=gen)
    mask = torch.ones(rows, P + R, dtype=torch.long)
    for i in range(rows):
        mask[i, : i % 3] = 0  # i % 3 pad tokens on the left
    pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
    return DataProto.from_dict(tensors={
        "input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, P:].clone(),
        "response_mask": torch.ones(rows, R, dtype=torch.long),
        "advantages": torch.randn(rows, R, generator=gen),
    })


def plain_logits(engine: FSDPEngine, data: DataProto) -> torch.Tensor:
    """The path before issue 17: the head over every position, then the response slice, out of place."""
    b = data.batch
    out = engine.module(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                        position_ids=b["position_ids"], use_cache=False)
    return out.logits.float()[:, -R - 1 : -1, :] / TEMPERATURE


def plain_entropy(logits: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def plain_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> FSDPEngine:
    path = build_tiny_model(Path(tmp_path_factory.mktemp("tiny")) / "m", seed=0)
    return FSDPEngine(str(path), optim_config={"lr": 1e-3, "weight_decay": 0.0}, total_steps=4)


def test_log_probs_and_entropy_equal_the_plain_path(engine: FSDPEngine) -> None:
    data = batch(engine.hf_config.vocab_size)
    data.meta_info["temperature"] = TEMPERATURE
    log_probs, entropy = PPOActor(engine).compute_log_prob(data, micro_batch_size=4, calculate_entropy=True)
    with torch.no_grad():
        ref = plain_logits(engine, data)
    torch.testing.assert_close(log_probs, plain_logprobs(ref, data.batch["responses"]), atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, plain_entropy(ref), atol=1e-5, rtol=0)


def test_gradients_equal_the_plain_path(engine: FSDPEngine) -> None:
    assert engine.can_keep_logits  # the head really sees only the response positions
    data = batch(engine.hf_config.vocab_size)
    labels = data.batch["responses"]

    def grads(logits_fn: object, logprob_fn: object, entropy_fn: object) -> list[torch.Tensor]:
        engine.module.zero_grad(set_to_none=True)
        logits = logits_fn()  # type: ignore[operator]
        loss = -(logprob_fn(logits, labels) * data.batch["advantages"]).mean() - 0.1 * entropy_fn(logits).mean()  # type: ignore[operator]
        loss.backward()
        return [p.grad.clone() for p in engine.module.parameters()]

    lean = grads(lambda: response_logits(engine, data, TEMPERATURE), logprobs_from_logits,
                 lambda z: entropy_from_logits(z, chunk_rows=3))  # several chunks, a ragged last one
    plain = grads(lambda: plain_logits(engine, data), plain_logprobs, plain_entropy)
    engine.module.zero_grad(set_to_none=True)
    for a, b in zip(lean, plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_rows", [1, 4, 7, 1000])
def test_chunked_helpers_equal_one_shot(chunk_rows: int) -> None:
    gen = torch.Generator().manual_seed(1)
    logits, labels = torch.randn(3, 7, 50, generator=gen) * 4, torch.randint(0, 50, (3, 7), generator=gen)
    torch.testing.assert_close(entropy_from_logits(logits, chunk_rows=chunk_rows), plain_entropy(logits),
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(logprobs_from_logits(logits, labels), plain_logprobs(logits, labels), atol=1e-5, rtol=0)
    assert entropy_from_logits(torch.zeros(0, 50)).shape == (0,)
