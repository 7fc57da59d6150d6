"""verl's GSM8K example interaction: the user says whether the model's answer is right and asks for another
try when it is not; a right answer ends the trajectory. Turn score: 1.0 right, 0.0 wrong.

The sample's `extra_info.interaction_kwargs` carries `{name: gsm8k, ground_truth: "72"}`.
"""

from __future__ import annotations

from typing import Any

from hybridflow.interactions.base import BaseInteraction, last_assistant_text
from hybridflow.rewards.gsm8k import compute_score

CORRECT = "Your response is correct!"
WRONG = "Your response is incorrect! You need to reflect on your answer and try again."


class Gsm8kInteraction(BaseInteraction):
    """Scores the last assistant message against the instance's ground truth (GSM8K's flexible match)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id: str | None = None, ground_truth: Any = None, **kwargs: Any) -> str:
        """Remember the ground truth of this trajectory."""
        instance_id = await super().start_interaction(instance_id)
        self.instances[instance_id] = {"ground_truth": "" if ground_truth is None else str(ground_truth), "answer": ""}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """Right: end with CORRECT; wrong: WRONG, and the model gets another turn."""
        answer = last_assistant_text(messages)
        self.instances[instance_id]["answer"] = answer if answer.startswith("#### ") else "#### " + answer
        score = await self.calculate_score(instance_id)
        return (True, CORRECT, score, {}) if score == 1.0 else (False, WRONG, score, {})

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """1.0 when the last answer equals the ground truth."""
        state = self.instances[instance_id]
        return float(compute_score(state["answer"], state["ground_truth"], method="flexible"))

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Drop the trajectory's state."""
        self.instances.pop(instance_id, None)
