"""`RewardModelWorker`: the reward model on the FSDP2 engine (forward only), scoring generated responses.

Placed in the global resource pool beside the actor (verl's colocated reward model); the trainer calls
`compute_rm_score(batch)` after generation and before the reward manager, which then returns the
batch's `rm_scores` (see `hybridflow.engines.reward_model`).
"""

from __future__ import annotations

from typing import Any

from hybridflow.config import HybridFlowConfig
from hybridflow.controller import Dispatch, register
from hybridflow.engines.reward_model import RewardModelScorer, head_has_bias, reward_head_problem
from hybridflow.profiling import profiled
from hybridflow.protocol import DataProto
from hybridflow.workers.fsdp_workers import _DistributedWorker


class RewardModelWorker(_DistributedWorker):
    """A frozen 1-label reward model (`reward_model.model.path`), sharded over the group's ranks."""

    def __init__(self, config: HybridFlowConfig | dict[str, Any]) -> None:
        super().__init__(config)
        self.scorer: RewardModelScorer | None = None

    @classmethod
    def profile_target(cls, role: str = "") -> tuple[tuple[str, ...], str]:
        return ("reward_model",), "reward_model"

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the reward model (and, with input_tokenizer, both tokenizers) on every rank."""
        self._setup_distributed()
        rm = self.config.reward_model
        path = rm.model.path
        if not path:
            raise ValueError(
                "reward_model.model.path is not set; point it at a reward model folder (one-label classifier)"
            )
        problem = reward_head_problem(path)
        if problem:
            raise ValueError(problem)
        overrides: dict[str, Any] = {}
        if head_has_bias(path) is False:
            # A sequence-classification head has no bias; load it as a token classifier without one
            # rather than with a freshly initialised bias.
            overrides["token_classification_bias"] = False
        engine = self._engine(
            path,
            kind="value",
            model_config={
                "override_config": overrides,
                "trust_remote_code": rm.model.trust_remote_code,
                "external_lib": rm.model.external_lib,
            },
            fsdp_config=rm.model.fsdp_config,
            seed=self.config.trainer.seed,
        )
        input_tokenizer = tokenizer = None
        if rm.model.input_tokenizer:
            input_tokenizer, tokenizer = self._tokenizers(rm.model.input_tokenizer, path)
        self.scorer = RewardModelScorer(
            engine,
            micro_batch_size=rm.micro_batch_size_per_gpu,
            max_token_len=self._token_budget(),
            input_tokenizer=input_tokenizer,
            tokenizer=tokenizer,
            max_length=rm.max_length,
        )

    def _tokenizers(self, input_path: str, rm_path: str) -> tuple[Any, Any]:
        """The policy's tokenizer (decodes responses) and the reward model's (renders its chat template)."""
        from transformers import AutoTokenizer

        trust = self.config.reward_model.model.trust_remote_code
        source = AutoTokenizer.from_pretrained(input_path)
        target = AutoTokenizer.from_pretrained(rm_path, trust_remote_code=trust)
        if not getattr(target, "chat_template", None):
            raise ValueError(
                f"reward_model.model.path={rm_path}: its tokenizer has no chat template to render prompts and "
                "responses with; use a reward model that ships one, or set reward_model.model.input_tokenizer "
                "to null when it shares the policy's tokenizer"
            )
        return source, target

    def _token_budget(self) -> int | None:
        """Token budget per micro-batch with use_dynamic_bsz (null: the critic's, as verl defaults it)."""
        rm = self.config.reward_model
        if not rm.use_dynamic_bsz:
            return None
        return rm.forward_max_token_len_per_gpu  # null in the config means the critic's (filled there)

    @register(Dispatch.DP_COMPUTE_PROTO)
    @profiled("reward_model")
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """`rm_scores` (b, R) of this rank's responses: the score at each last valid response token."""
        if self.scorer is None:
            raise RuntimeError("call init_model on the reward model group first")
        return DataProto.from_dict(tensors={"rm_scores": self.scorer.compute_rm_score(data)})
