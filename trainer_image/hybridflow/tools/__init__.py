"""Tools for agent loops (verl's `BaseTool` shape): config loading, the code sandbox, GSM8K and toy tools."""

from hybridflow.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse"]
