"""`TeacherWorker`: the on-policy distillation teacher, a frozen FSDP2 model that scores the student's samples.

Placed in the global resource pool beside the actor, like the reference policy and the reward model; loaded
from `distillation.teacher_models.teacher_model.model_path`, sharded and micro-batched with the reference's
settings (`actor_rollout_ref.ref.*`). The trainer calls `compute_teacher_log_prob(batch)` after the student's
log-probs: the teacher's log-prob of every sampled response token, at temperature 1 (verl forces 1 for its
teacher too: the teacher scores tokens, it samples none).
"""

from __future__ import annotations

from typing import Any

from hybridflow.config import HybridFlowConfig
from hybridflow.controller import Dispatch, register
from hybridflow.engines.actor import PPOActor
from hybridflow.protocol import DataProto
from hybridflow.workers.fsdp_workers import _DistributedWorker, log_prob_budget


def vocabulary_problem(teacher_vocab: int, student_vocab: int, teacher_key: str) -> str | None:
    """Why a teacher cannot score the student's tokens (a smaller vocabulary), or None when it can.

    A larger teacher embedding is fine (models pad their vocabulary); a smaller one cannot score ids past its end.
    """
    if teacher_vocab >= student_vocab:
        return None
    return (
        f"{teacher_key}: the teacher's vocabulary ({teacher_vocab} tokens) is smaller than the student's "
        f"({student_vocab}), so it cannot score the student's tokens; distil from a teacher with the student's "
        "tokenizer (the same model family)"
    )


def teacher_problem(config: HybridFlowConfig) -> str | None:
    """Why the configured teacher cannot score the student's tokens (unreadable, or another vocabulary), from the
    two model configs (no weights); None when it can. main_ppo asks before Ray starts, the worker again."""
    from transformers import AutoConfig

    distill, model = config.distillation, config.actor_rollout_ref.model
    remote = model.trust_remote_code
    try:
        teacher = AutoConfig.from_pretrained(distill.teacher.model_path, trust_remote_code=remote)
    except OSError as exc:
        return (
            f"{distill.teacher_path_key}: cannot read the teacher's config at {distill.teacher.model_path!r} ({exc}); "
            "point it at a Hugging Face folder or hub id"
        )
    student = AutoConfig.from_pretrained(model.path, trust_remote_code=remote)
    return vocabulary_problem(teacher.vocab_size, student.vocab_size, distill.teacher_path_key)


class TeacherWorker(_DistributedWorker):
    """The distillation teacher (forward only), sharded over the group's ranks."""

    def __init__(self, config: HybridFlowConfig | dict[str, Any]) -> None:
        super().__init__(config)
        self.teacher: PPOActor | None = None

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the teacher on every rank; refuse one whose vocabulary cannot cover the student's tokens."""
        self._setup_distributed()
        distill, arr = self.config.distillation, self.config.actor_rollout_ref
        path = distill.teacher.model_path
        if not path:
            raise ValueError(f"{distill.teacher_path_key} is not set; point it at the teacher's Hugging Face folder")
        problem = teacher_problem(self.config)
        if problem:
            raise ValueError(problem)
        engine = self._engine(
            path,
            model_config={"trust_remote_code": arr.model.trust_remote_code, "external_lib": arr.model.external_lib},
            fsdp_config=arr.ref.fsdp_config,
            seed=self.config.trainer.seed,
        )
        self.teacher = PPOActor(engine, arr.actor, seed=self.config.trainer.seed)

    @register(Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """`teacher_log_prob` (b, R): the teacher's log-probs of this rank's response tokens, at temperature 1."""
        if self.teacher is None:
            raise RuntimeError("call init_model on the teacher group first")
        data.meta_info["temperature"] = 1.0
        ref = self.config.actor_rollout_ref.ref
        log_probs, _ = self.teacher.compute_log_prob(
            data, ref.log_prob_micro_batch_size_per_gpu, max_token_len=log_prob_budget(ref)
        )
        return DataProto.from_dict(tensors={"teacher_log_prob": log_probs})
