"""The toy task's lookup tool: returns the value the sample hides behind its key.

Each sample of `hybridflow.data.toy`'s lookup task passes `tools_kwargs.lookup.create_kwargs =
{"table": {key: value}, "key": key}`; the model can only learn the value by calling `lookup`.
"""

from __future__ import annotations

from typing import Any

from hybridflow.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolResponse


class LookupTool(BaseTool):
    """`lookup(key?)`: the value stored under `key` (default: the key the prompt asks about)."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict[str, Any]] = {}

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

    async def create(self, instance_id: str | None = None, table: dict[str, str] | None = None,
                     key: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Hold this sample's table."""
        instance_id, response = await super().create(instance_id)
        self._instances[instance_id] = {"table": dict(table or {}), "key": key}
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict[str, Any]]:
        """The value, or an error text naming the known keys."""
        state = self._instances.get(instance_id, {"table": {}, "key": None})
        key = parameters.get("key") or state["key"]
        if key not in state["table"]:
            return ToolResponse(text=f"error: no key {key!r}; known keys: {sorted(state['table'])}"), 0.0, {}
        return ToolResponse(text=str(state["table"][key])), 0.0, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the sample's table."""
        self._instances.pop(instance_id, None)
