"""SGLang adapter logic without SGLang: config translation, output parsing, weight push, memory release."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest
import torch

from hybridflow.config import load_config
from hybridflow.protocol import DataProto
from hybridflow.rollout.sglang_rollout import (
    INSTALL_HINT,
    SGLangRollout,
    engine_kwargs,
    parse_output,
    sampling_params,
)
from hybridflow.rollout.token_io import pack_responses, prompt_token_lists, resolve_sampling

EOS, PAD = 2, 0


class StandInEngine:
    """Behaves like `sglang.Engine` for the calls the adapter makes: each new token = last + bias.

    `bias` is the sum of the pushed "w" tensor, so a weight update visibly changes the outputs;
    the stop token is emitted when reached and (like SGLang) reported in finish_reason.
    """

    def __init__(self, drop_stop_token: bool = False) -> None:
        self.bias = 1
        self.calls: list[str] = []
        self.seen_prompts: list[list[int]] = []
        self.drop_stop_token = drop_stop_token

    def generate(self, input_ids: list[list[int]], sampling_params: dict[str, Any], return_logprob: bool) -> Any:
        self.calls.append("generate")
        self.seen_prompts = input_ids
        results = []
        for ids in input_ids:
            out: list[int] = []
            last, finish = ids[-1], {"type": "length", "length": sampling_params["max_new_tokens"]}
            for _ in range(sampling_params["max_new_tokens"]):
                last = (last + self.bias) % 10
                out.append(last)
                if last in sampling_params["stop_token_ids"]:
                    finish = {"type": "stop", "matched": last}
                    break
            kept = out[:-1] if self.drop_stop_token and finish["type"] == "stop" else out
            meta: dict[str, Any] = {"finish_reason": finish}
            if return_logprob:
                meta["output_token_logprobs"] = [(-0.1 * (k + 1), t, None) for k, t in enumerate(out)]
            results.append({"output_ids": kept, "meta_info": meta})
        return results

    def update_weights_from_tensor(self, named_tensors: list[tuple[str, torch.Tensor]], flush_cache: bool) -> None:
        self.calls.append(f"update(flush={flush_cache})")
        self.bias = int(dict(named_tensors)["w"].sum())

    def release_memory_occupation(self) -> None:
        self.calls.append("release")

    def resume_memory_occupation(self) -> None:
        self.calls.append("resume")


def rollout_cfg(*overrides: str) -> Any:
    return load_config(None, ["actor_rollout_ref.rollout.name=sglang", *overrides]).actor_rollout_ref.rollout


def prompts(rows: list[list[int]], width: int = 5, **meta: Any) -> DataProto:
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):  # left padding, as the dataset produces
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos},
        non_tensors={"uid": np.array([f"p{i}" for i in range(len(rows))], dtype=object)},
        meta_info=meta,
    )


def make(engine: StandInEngine, *overrides: str, resp: int = 4) -> SGLangRollout:
    return SGLangRollout(
        "unused", config=rollout_cfg(*overrides), response_length=resp, engine=engine, eos_token_id=EOS, pad_token_id=PAD
    )


def test_engine_kwargs_follow_rollout_config() -> None:
    cfg = rollout_cfg(
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.enable_prefix_caching=false",
        "actor_rollout_ref.rollout.free_cache_engine=true",
        "actor_rollout_ref.rollout.max_num_seqs=64",
        "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton",
    )
    kw = engine_kwargs("/m", cfg, max_model_len=96)
    assert kw["model_path"] == "/m" and kw["tp_size"] == 2 and kw["mem_fraction_static"] == 0.4
    assert kw["disable_cuda_graph"] is True and kw["disable_radix_cache"] is True
    assert kw["enable_memory_saver"] is True and kw["max_running_requests"] == 64
    assert kw["context_length"] == 96 and kw["attention_backend"] == "triton" and kw["dtype"] == "bfloat16"
    assert "context_length" not in engine_kwargs("/m", rollout_cfg())


def test_sampling_translation_greedy_and_sampled() -> None:
    cfg = rollout_cfg("actor_rollout_ref.rollout.top_k=0", "actor_rollout_ref.rollout.top_p=0.9")
    sampled = resolve_sampling(cfg, 7, {"temperature": 0.7}, {})
    sp = sampling_params(sampled, [EOS], ignore_eos=False)
    assert sp["temperature"] == 0.7 and sp["top_p"] == 0.9 and sp["top_k"] == -1 and sp["max_new_tokens"] == 7
    # meta_info wins over keyword overrides; temperature 0 means greedy whatever do_sample says
    greedy = resolve_sampling(cfg, 7, {"temperature": 0.7}, {"temperature": 0.0, "response_length": 3})
    sp = sampling_params(greedy, [EOS, 5], ignore_eos=False)
    assert (sp["temperature"], sp["top_p"], sp["top_k"], sp["max_new_tokens"]) == (0.0, 1.0, -1, 3)
    assert sp["stop_token_ids"] == [EOS, 5] and sp["ignore_eos"] is False
    # ignore_eos: no stop tokens either (they would still end the response)
    sp = sampling_params(greedy, [EOS, 5], ignore_eos=True)
    assert sp["stop_token_ids"] == [] and sp["ignore_eos"] is True


def test_parse_output_restores_a_dropped_stop_token_and_reads_logprobs() -> None:
    out = {"output_ids": [5, 6], "meta_info": {"finish_reason": {"type": "stop", "matched": EOS},
                                               "output_token_logprobs": [(-1.0, 5, None), (-2.0, 6, None), (-3.0, EOS, None)]}}
    assert parse_output(out, True) == ([5, 6, EOS], [-1.0, -2.0, -3.0])
    # ids from the log-prob entries when output_ids is absent; no duplicate stop token
    out2 = {"meta_info": {"finish_reason": {"type": "stop", "matched": EOS},
                          "output_token_logprobs": [(-1.0, 5, None), (-3.0, EOS, None)]}}
    assert parse_output(out2, False) == ([5, EOS], None)
    with pytest.raises(ValueError, match="return_logprob=True"):
        parse_output({"output_ids": [1, 2], "meta_info": {}}, True)


def test_pack_responses_pads_and_masks() -> None:
    resp, mask, lps = pack_responses([[4, EOS], [], [1, 2, 3, 4, 5]], 4, PAD, [[-1.0, -2.0], [], [-1.0] * 5])
    assert resp.tolist() == [[4, EOS, PAD, PAD], [PAD] * 4, [1, 2, 3, 4]]
    assert mask.tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]
    assert lps is not None and lps[0].tolist() == [-1.0, -2.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="log-probs"):
        pack_responses([[1, 2]], 4, PAD, [[-1.0]])


@pytest.mark.parametrize("drop_stop_token", [False, True])
def test_generate_contract(drop_stop_token: bool) -> None:
    engine = StandInEngine(drop_stop_token=drop_stop_token)
    ro = make(engine, "actor_rollout_ref.rollout.calculate_log_probs=true")
    batch = prompts([[3, 4], [9, 8, 7, 6, 5], [1]])
    out = ro.generate(batch)
    assert engine.seen_prompts == [[3, 4], [9, 8, 7, 6, 5], [1]]  # padding stripped through the mask
    b = out.batch
    # 4 -> 5 6 7 8 (length); 5 -> 6 7 8 9; 1 -> 2 (EOS, stop)
    assert b["responses"].tolist() == [[5, 6, 7, 8], [6, 7, 8, 9], [EOS, PAD, PAD, PAD]]
    assert b["response_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert torch.allclose(b["rollout_log_probs"][2], torch.tensor([-0.1, 0.0, 0.0, 0.0]))
    assert b["input_ids"].shape == (3, 9) and torch.equal(b["attention_mask"][:, 5:], b["response_mask"])
    assert list(out.non_tensor_batch["uid"]) == ["p0", "p1", "p2"]
    assert "rollout_log_probs" not in ro.generate(batch, calculate_log_probs=False).batch


def test_weight_update_changes_outputs_and_memory_is_released_between_phases() -> None:
    engine = StandInEngine()
    ro = make(engine, "actor_rollout_ref.rollout.free_cache_engine=true", resp=2)
    batch = prompts([[3]])
    assert ro.generate(batch).batch["responses"].tolist() == [[4, 5]]
    ro.load_weights([("w", torch.tensor([1.0, 2.0]))])
    assert ro.generate(batch).batch["responses"].tolist() == [[6, 9]]
    # released after each rollout, resumed before a weight push, not released again before generate
    assert engine.calls == ["generate", "release", "resume", "update(flush=True)", "generate", "release"]


def test_without_free_cache_engine_memory_is_kept() -> None:
    engine = StandInEngine()
    ro = make(engine, "actor_rollout_ref.rollout.free_cache_engine=false", resp=2)
    ro.generate(prompts([[3]]))
    ro.load_weights([("w", torch.tensor([1.0]))])
    assert engine.calls == ["generate", "update(flush=True)"]


def test_missing_sglang_or_gpu_gives_actionable_errors() -> None:
    with pytest.raises(RuntimeError, match="rollout.name=vllm"):
        SGLangRollout("unused", rollout_cfg(), device="cpu", eos_token_id=EOS, pad_token_id=PAD)
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here; the missing-package message cannot be exercised")
    with pytest.raises(ImportError) as err:
        SGLangRollout("unused", rollout_cfg(), device="cuda", eos_token_id=EOS, pad_token_id=PAD)
    assert INSTALL_HINT in str(err.value) and "pip install" in str(err.value)


def test_prompt_token_lists_reads_the_mask() -> None:
    batch = prompts([[7, 8, 9], [4]], width=4)
    assert prompt_token_lists(batch) == [[7, 8, 9], [4]]
