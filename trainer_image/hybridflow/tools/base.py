"""Tools an agent loop can call, in verl's shape (`BaseTool` with create / execute / calc_reward / release).

A tool is described to the model by an OpenAI function schema (`OpenAIFunctionToolSchema`, rendered into
the prompt by the chat template) and instantiated per trajectory: `create()` returns an instance id,
`execute(instance_id, parameters)` returns `(ToolResponse, step_reward, metrics)`, `calc_reward` a final
reward for the instance and `release` frees it. Tools are async and never see Ray or an engine, so they
are testable on their own. Config comes from verl's tool-config YAML (see `hybridflow.tools.config`).
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter of a function, in JSON-schema terms (type, description, enum, ...)."""

    model_config = ConfigDict(extra="allow")

    type: str | list[str] = Field(description="JSON-schema type, e.g. string, integer, number, boolean.")
    description: str | None = Field(default=None, description="What the parameter means, for the model.")
    enum: list[Any] | None = Field(default=None, description="The allowed values, when the set is closed.")


class OpenAIFunctionParametersSchema(BaseModel):
    """The parameters object of a function schema."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(default="object", description="Always 'object' for function parameters.")
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    """A function the model may call: name, description, parameters."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, description="The name the model writes in its tool call.")
    description: str = Field(default="", description="What the function does, for the model.")
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = Field(default=False, description="OpenAI's strict mode flag (passed to the template).")


class OpenAIFunctionToolSchema(BaseModel):
    """An OpenAI-format tool: `{"type": "function", "function": {...}}`."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(default="function", description="Only 'function' tools exist.")
    function: OpenAIFunctionSchema


class ToolResponse(BaseModel):
    """What a tool returns to the model: text (images/videos are not supported here, multimodal input is not)."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = Field(default=None, description="The tool's output, shown to the model as the tool message.")


class BaseTool:
    """Base class of tools (verl's `BaseTool` methods and signatures), stateless unless a subclass keeps
    per-instance state keyed by the instance id."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None) -> None:
        self.config = dict(config or {})
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The schema shown to the model; subclasses without a configured schema override this."""
        raise ValueError(
            f"{type(self).__name__} has no tool_schema: give one in the tool config YAML "
            "(tools[].tool_schema, OpenAI function format)"
        )

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start an instance for one trajectory (kwargs: the sample's `create_kwargs`); returns its id."""
        return instance_id or uuid.uuid4().hex, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run one call with the model's arguments; returns (response, step reward, metrics)."""
        raise NotImplementedError(f"{type(self).__name__}.execute")

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """A reward for the instance (e.g. the last answer's score); 0 unless a tool defines one."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Free the instance's state."""
        return None


class StatefulTool(BaseTool):
    """A tool that keeps a dict of state per instance: `create` stores `start_state(**kwargs)`, `release`
    drops it; subclasses read `self.instances[instance_id]`."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        super().__init__(config, tool_schema)
        self.instances: dict[str, dict[str, Any]] = {}

    def start_state(self, **kwargs: Any) -> dict[str, Any]:
        """The state of a new instance from the sample's create_kwargs."""
        return dict(kwargs)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start an instance holding `start_state(**kwargs)`."""
        instance_id, response = await super().create(instance_id)
        self.instances[instance_id] = self.start_state(**kwargs)
        return instance_id, response

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the instance."""
        self.instances.pop(instance_id, None)
