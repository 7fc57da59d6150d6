"""An LLM-as-judge reward function: a generative reward model served by HybridFlow says whether each answer is right.

verl's GenRM signature: `reward_router_address` (host:port of the served model's endpoint, SGLang's `/generate`)
and `reward_model_tokenizer` come from the trainer; `async def`, so the trainer awaits many judgements at once.
Use it with a causal LM as reward model, on devices of its own:

    reward_model.enable=true reward_model.model.path=Qwen/Qwen2.5-7B-Instruct \\
    reward_model.enable_resource_pool=true reward_model.nnodes=1 reward_model.n_gpus_per_node=2 \\
    reward_model.rollout.name=vllm reward_model.rollout.response_length=8 reward_model.score_timeout_s=60 \\
    custom_reward_function.path=examples/llm_judge.py custom_reward_function.name=judge

The score is 1.0 when the judge's greedy reply starts with "yes", else 0.0; the row's `extra_info.question` (if
any) is shown to the judge with the reference answer.
"""

from __future__ import annotations

from typing import Any

PROMPT = (
    "Question: {question}\nReference answer: {reference}\nStudent answer: {answer}\n"
    "Is the student answer correct? Reply with yes or no."
)


async def judge(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None,
                reward_router_address: str, reward_model_tokenizer: Any, max_judge_tokens: int = 8) -> dict[str, float]:
    """Ask the served judge about one answer; score 1.0 for a reply starting with "yes"."""
    import aiohttp

    question = (extra_info or {}).get("question", "")
    messages = [{"role": "user", "content": PROMPT.format(question=question, reference=ground_truth,
                                                         answer=solution_str.strip())}]
    text = reward_model_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = reward_model_tokenizer(text, add_special_tokens=False)["input_ids"]
    request = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_judge_tokens, "temperature": 0}}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{reward_router_address}/generate", json=request) as answer:
            answer.raise_for_status()
            reply = (await answer.json())["text"]
    said_yes = reply.strip().lower().startswith("yes")
    return {"score": 1.0 if said_yes else 0.0, "judge_said_yes": float(said_yes)}
