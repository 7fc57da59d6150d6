"""The toy task's lookup tool: returns the value the sample hides behind its key.

Each sample of `hybridflow.data.toy`'s lookup task passes `tools_kwargs.lookup.create_kwargs =
{"table": {key: value}, "key": key}`; the model can only learn the value by calling `lookup`.
"""

from __future__ import annotations

from typing import Any

from hybridflow.tools.base import OpenAIFunctionToolSchema, StatefulTool, ToolResponse


class LookupTool(StatefulTool):
    """`lookup(key?)`: the value stored under `key` (default: the key the prompt asks about)."""

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """One optional string parameter, the key."""
        return OpenAIFunctionToolSchema.model_validate({
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Return the value stored under a key (default: the key in the question).",
                "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": []},
            },
        })

    def start_state(self, table: dict[str, str] | None = None, key: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Hold this sample's table."""
        return {"table": dict(table or {}), "key": key}

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
        """The value, or an error text naming the known keys."""
        state = self.instances.get(instance_id, {"table": {}, "key": None})
        key = parameters.get("key") or state["key"]
        if key not in state["table"]:
            return ToolResponse(text=f"error: no key {key!r}; known keys: {sorted(state['table'])}"), 0.0, {}
        return ToolResponse(text=str(state["table"][key])), 0.0, {}
