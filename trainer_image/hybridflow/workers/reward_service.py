"""A generative reward model (verl's GenRM) served for the custom reward function.

With `reward_model.enable=true`, what `reward_model.model.path` is decides how it scores:

- a classifier (`...ForSequenceClassification`, `...ForTokenClassification`): a forward pass on its FSDP worker
  group (`hybridflow.workers.reward_model_worker`); `reward_model.rollout` is not read, and start-up says so;
- a causal LM (`...ForCausalLM`): it is *served*, on rollout replicas of its own (`reward_model.rollout`: engine,
  tensor parallelism, memory, lengths) on a pool of its own (`enable_resource_pool`, `nnodes` x
  `n_gpus_per_node`), behind a router and an HTTP endpoint on the driver (SGLang's `/generate` and OpenAI's
  `/v1/chat/completions`, `hybridflow.agent.openai_server`). The custom reward function asks it for judgements:
  it receives `reward_router_address` (host:port), `reward_model_tokenizer` and `reward_model_path`, as in verl's
  reward loop (`hybridflow.rewards.custom`). The served model's weights are fixed: no update reaches them.

    served = plan_served_reward_model(cfg, custom)   # before Ray: checks, and the endpoint listens
    custom.serve_reward_model(served.address, ...)   # the reward managers are built with it
    served.start(pool)                               # after Ray: the replicas load the model and serve
    ...
    served.close()
"""

from __future__ import annotations

import logging
from typing import Any

from hybridflow.agent.manager import EventLoopThread

logger = logging.getLogger(__name__)

GENERATIVE_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def architectures(model_path: str) -> list[str]:
    """The `architectures` of a Hugging Face model folder's config (empty when it names none)."""
    from transformers import AutoConfig

    return list(getattr(AutoConfig.from_pretrained(model_path), "architectures", None) or [])


def is_generative(model_path: str, kinds: list[str] | None = None) -> bool:
    """Whether the model generates text (a causal LM), rather than scoring with a classification head; `kinds`:
    its `architectures`, when already read."""
    return any(a.endswith(GENERATIVE_SUFFIXES) for a in (architectures(model_path) if kinds is None else kinds))


def serving_config(cfg: Any) -> Any:
    """A trainer config whose rollout section serves the reward model: its path, `reward_model.rollout`'s serving
    settings, server mode, weights from the folder, and a pool of `reward_model.nnodes x n_gpus_per_node`."""
    rm = cfg.reward_model
    out = cfg.model_copy(deep=True)
    arr = out.actor_rollout_ref
    arr.model.path = rm.model.path
    arr.model.tokenizer_path = None
    arr.model.lora_rank = 0
    arr.rollout.profiler.enable = False  # the run's rollout profiler is about the policy's replicas
    prompt = rm.rollout.prompt_length or cfg.data.max_prompt_length + cfg.data.max_response_length
    arr.rollout = rm.rollout.model_copy(update={
        "mode": "async", "load_format": "auto", "free_cache_engine": False, "prompt_length": prompt,
        "response_length": rm.rollout.response_length or cfg.data.max_response_length,
    })
    out.async_training.mode = "sync"
    out.trainer.nnodes, out.trainer.n_gpus_per_node = rm.nnodes, rm.n_gpus_per_node
    out.trainer.placement = "split"  # on CPU: the replica binds its threads to its own slots' cores
    return out


class ServedRewardModel:
    """The reward model's endpoint (listening from construction) and replicas (from `start`)."""

    def __init__(self, cfg: Any) -> None:
        from transformers import AutoTokenizer

        from hybridflow.agent.openai_server import OpenAIServer

        self.config = serving_config(cfg)
        self.model_path = str(cfg.reward_model.model.path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.events = EventLoopThread()
        self.server = OpenAIServer(None, self.tokenizer,
                                   default_max_tokens=int(self.config.actor_rollout_ref.rollout.response_length))
        self.address = self.events.run(self.server.start()).removeprefix("http://")
        self.service: Any = None
        self.pool: Any = None

    def start(self, resource_pool: Any) -> None:
        """Start the replicas on `resource_pool` (Ray is up) and let the endpoint send requests to them."""
        from hybridflow.workers.rollout_service import RolloutService

        self.pool = resource_pool
        self.service = RolloutService(self.config, self.tokenizer, resource_pool, events=self.events)
        self.server.router = self.service.router
        ro = self.config.actor_rollout_ref.rollout
        logger.info("generative reward model %s: %d %s replica(s) behind http://%s (/generate, /v1/chat/completions)",
                    self.model_path, len(self.service.replicas), ro.name, self.address)

    def close(self) -> None:
        """Stop the endpoint, the replicas and the event loop."""
        self.events.run(self.server.stop())
        if self.service is not None:
            self.service.shutdown()  # closes the event loop it shares
            self.service = None
            self.pool.release()
        else:
            self.events.close()


def plan_served_reward_model(cfg: Any, custom: Any) -> ServedRewardModel | None:
    """The served reward model when `reward_model.model.path` is generative (else None: the classifier worker
    scores); ValueError when the run cannot use it as configured."""
    rm = cfg.reward_model
    if not rm.enable:
        return None
    path = str(rm.model.path)
    found = architectures(path)
    kinds = ", ".join(found) or "no architectures"
    if not is_generative(path, found):
        from hybridflow._config.rules import changed_fields

        changed = changed_fields(rm.rollout)
        if changed:
            logger.warning("reward_model.rollout (%s) has no effect: %s is a classifier (%s), scored by a forward pass "
                           "on its FSDP worker", ", ".join(changed), path, kinds)
        return None
    if custom is None or not custom.wants_reward_model():
        raise ValueError(
            f"reward_model.model.path={path} is a generative model ({kinds}): it scores through "
            "custom_reward_function, which calls it; set custom_reward_function.path/name to a function that takes "
            "reward_router_address (verl's GenRM signature: also reward_model_tokenizer, reward_model_path), or use "
            "a classifier reward model (...ForSequenceClassification)"
        )
    if not rm.enable_resource_pool:
        raise ValueError(
            f"reward_model.model.path={path} is a generative model ({kinds}), served on replicas of its own: set "
            "reward_model.enable_resource_pool=true with reward_model.nnodes and reward_model.n_gpus_per_node"
        )
    if rm.rollout.name not in ("vllm", "sglang"):
        raise ValueError(f"reward_model.rollout.name={rm.rollout.name}: a generative reward model is served by vllm "
                         "or sglang replicas; set reward_model.rollout.name=vllm (CPU: `make vllm`) or sglang (GPU)")
    if rm.profiler.enable:
        raise ValueError(
            f"reward_model.profiler.enable=true with a generative reward model ({path}): profiling its served "
            "replicas is not built in HybridFlow yet; remove it (a classifier reward model's workers can be profiled)"
        )
    served = ServedRewardModel(cfg)
    custom.serve_reward_model(served.address, served.model_path)
    return served
