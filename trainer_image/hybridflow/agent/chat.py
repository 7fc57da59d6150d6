"""Chat-template plumbing for agent loops: prompt ids, and the ids of a turn appended to a trajectory.

A trajectory's tokens are never re-rendered: each new tool or user turn is rendered once and its ids
appended. `turn_ids` renders a fixed two-message conversation with and without the new messages and
keeps the difference, so the ids are those the template would write in the middle of a conversation
(no BOS, no default system prompt), ending with the generation prompt of the next assistant turn.
`template_kwargs` (verl's `data.apply_chat_template_kwargs`, e.g. gpt-oss's `reasoning_effort`) go to every
`apply_chat_template` call, as the dataset passes them when it renders prompts.
"""

from __future__ import annotations

from typing import Any

_BASE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


def render_ids(tokenizer: Any, messages: list[dict[str, Any]], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Token ids of `messages` rendered with the chat template (the template writes any special tokens)."""
    text = tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=False,
        **(template_kwargs or {}),
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def turn_ids(tokenizer: Any, messages: list[dict[str, Any]], *,
             template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Ids of `messages` (tool results, user turns) as they continue a conversation, plus the next
    assistant turn's generation prompt."""
    extra = template_kwargs or {}
    base = tokenizer.apply_chat_template(_BASE, add_generation_prompt=False, tokenize=False, **extra)
    full = tokenizer.apply_chat_template(_BASE + list(messages), add_generation_prompt=True, tokenize=False, **extra)
    if not full.startswith(base):
        raise ValueError(
            "the chat template renders a conversation differently when messages are appended, so a turn cannot "
            "be added without re-tokenising the trajectory; use a model whose template appends turns (Qwen, "
            "Llama 3, SmolLM2 and the toy template do)"
        )
    return list(tokenizer(full[len(base):], add_special_tokens=False)["input_ids"])
