"""verl's GSM8K example tool: the model submits an answer, the tool says whether it is right.

The sample's `tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth` holds the answer; `execute`
scores the submitted one with the built-in GSM8K scorer and `calc_reward` returns the last score.
"""

from __future__ import annotations

from typing import Any

from hybridflow.rewards.gsm8k import compute_score
from hybridflow.tools.base import OpenAIFunctionToolSchema, StatefulTool, ToolResponse


class Gsm8kTool(StatefulTool):
    """`calc_gsm8k_reward(answer)`: 1.0 when the answer equals the ground truth, else 0.0."""

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The default schema (verl's example's name and parameter)."""
        return OpenAIFunctionToolSchema.model_validate({
            "type": "function",
            "function": {
                "name": "calc_gsm8k_reward",
                "description": "Check an answer to the math problem: returns whether it is correct.",
                "parameters": {"type": "object", "properties": {
                    "answer": {"type": "string", "description": "The final numeric answer."}}, "required": ["answer"]},
            },
        })

    def start_state(self, ground_truth: Any = None, **kwargs: Any) -> dict[str, Any]:
        """Remember the sample's ground truth for this trajectory."""
        return {"ground_truth": ground_truth, "reward": 0.0}

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Score `parameters["answer"]` (GSM8K's '#### <number>' form is added when missing)."""
        state = self.instances.get(instance_id)
        if state is None:
            return ToolResponse(text="error: the tool instance is gone; call create first"), 0.0, {}
        answer = str(parameters.get("answer", "")).strip()
        if not answer.startswith("#### "):
            answer = "#### " + answer
        score = float(compute_score(answer, str(state["ground_truth"]), method="flexible"))
        penalty = 0.0 if score > state["reward"] else -0.05  # verl's example: no credit for repeating
        state["reward"] = max(state["reward"], score)
        return ToolResponse(text=f"Current parsed answer={answer[5:]!r} reward={score}"), penalty, {"score": score}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The best score any call of this trajectory got."""
        return float(self.instances.get(instance_id, {}).get("reward", 0.0))
