"""`BaseInteraction`: verl's interaction methods and signatures, so verl interaction classes port unchanged.

One interaction object serves every trajectory that names it; per-trajectory state is keyed by the instance
id `start_interaction` returns (the loop passes the trajectory's request id).
"""

from __future__ import annotations

import uuid
from typing import Any


class BaseInteraction:
    """Subclasses implement `generate_response`; the other methods have working defaults."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config or {})
        self.name: str = str(self.config.get("name", "interaction_agent"))

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Begin one trajectory's interaction (kwargs: the sample's `interaction_kwargs`); returns its id."""
        return instance_id or uuid.uuid4().hex

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """The user's reply to the conversation so far (the model's last turn is `messages[-1]`): returns
        (should_terminate_sequence, response_content, current_turn_score, additional_data)."""
        raise NotImplementedError(
            f"{type(self).__name__}.generate_response: an interaction must say what the user answers"
        )

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """A score for the interaction so far; 0 unless a subclass defines one."""
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Free the trajectory's state."""
        return None


def last_assistant_text(messages: list[dict[str, Any]]) -> str:
    """The content of the latest assistant message ('' when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""
