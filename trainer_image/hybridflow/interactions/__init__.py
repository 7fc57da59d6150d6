"""Interactions: simulated user turns in a multi-turn trajectory, in verl's shape (`BaseInteraction`).

After a model turn without tool calls, the `tool_agent` loop asks the sample's interaction for the next user
message (`generate_response`); the interaction may end the trajectory and scores every turn. Interactions are
listed in verl's interaction-config YAML (`actor_rollout_ref.rollout.multi_turn.interaction_config_path`) and
chosen per sample by `extra_info.interaction_kwargs.name`.
"""

from hybridflow.interactions.base import BaseInteraction
from hybridflow.interactions.config import InteractionConfigError, load_interactions

__all__ = ["BaseInteraction", "InteractionConfigError", "load_interactions"]
