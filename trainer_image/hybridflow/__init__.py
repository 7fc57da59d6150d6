"""HybridFlow: a single-controller RL post-training trainer for LLMs (verl-compatible config)."""

__version__ = "0.1.0"
