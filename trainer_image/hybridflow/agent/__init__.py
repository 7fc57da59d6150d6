"""Agent loops (verl's `AgentLoopBase` shape), the router over rollout replicas and the batch manager.

Ray-free and engine-agnostic: loops talk to an `AsyncServerClient`; `hybridflow.workers.rollout_service`
puts Ray replicas behind one. Importing this package registers `single_turn_agent` and `tool_agent`;
`OpenAIAgentLoop` is the base for agents written against the OpenAI client.
"""

from hybridflow.agent.base import (
    AgentLoopBase,
    AgentLoopOutput,
    AsyncServerClient,
    TokenOutput,
    get_agent_loop,
    register,
    registered_agent_loops,
)
from hybridflow.agent.loops import SingleTurnAgentLoop, ToolAgentLoop
from hybridflow.agent.openai_agent import OpenAIAgentLoop

__all__ = [
    "AgentLoopBase",
    "AgentLoopOutput",
    "AsyncServerClient",
    "OpenAIAgentLoop",
    "SingleTurnAgentLoop",
    "TokenOutput",
    "ToolAgentLoop",
    "get_agent_loop",
    "register",
    "registered_agent_loops",
]
