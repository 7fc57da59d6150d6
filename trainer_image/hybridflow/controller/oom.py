"""A worker killed for memory, told as the settings to change (issue 17).

Ray's memory monitor kills the worker that uses most memory when the node runs low, and the caller
sees `ray.exceptions.OutOfMemoryError` ("... killed due to the node running low on memory"), or a
`RayActorError` whose message says so when the actor itself died. Neither names a setting. The
worker group turns both into `WorkerOutOfMemoryError`, whose message names the knobs of the phase
that was running (`build_oom_advice`), keeping Ray's text and traceback as the cause.
"""

from __future__ import annotations

from typing import Any

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"

_GRAD_CKPT = "actor_rollout_ref.model.enable_gradient_checkpointing=true"
_MORE_MEMORY = "or give the workers more memory (spec.resources.memory, or larger nodes)"

# What to lower for each worker-group method, most effective first. Activations of a micro-batch
# grow with its rows x tokens (docs/benchmarks.md, "Actor memory per micro-batch row").
_ADVICE: dict[str, list[str]] = {
    "update_actor": [
        f"lower {ACTOR}.ppo_micro_batch_size_per_gpu",
        f"or set {ACTOR}.use_dynamic_bsz=true with a smaller {ACTOR}.ppo_max_token_len_per_gpu",
        f"or set {_GRAD_CKPT}",
    ],
    "compute_log_prob": [
        f"lower {ROLLOUT}.log_prob_micro_batch_size_per_gpu",
        f"or set {ROLLOUT}.log_prob_use_dynamic_bsz=true with a smaller {ROLLOUT}.log_prob_max_token_len_per_gpu",
    ],
    "compute_ref_log_prob": [
        f"lower {REF}.log_prob_micro_batch_size_per_gpu",
        f"or set {REF}.log_prob_use_dynamic_bsz=true with a smaller {REF}.log_prob_max_token_len_per_gpu",
    ],
    "update_critic": [
        "lower critic.ppo_micro_batch_size_per_gpu",
        "or set critic.use_dynamic_bsz=true with a smaller critic.ppo_max_token_len_per_gpu",
        "or set critic.model.enable_gradient_checkpointing=true",
    ],
    "compute_values": [
        "lower critic.ppo_micro_batch_size_per_gpu",
        "or set critic.use_dynamic_bsz=true with a smaller critic.ppo_max_token_len_per_gpu",
    ],
    "generate_sequences": [
        f"lower {ROLLOUT}.gpu_memory_utilization (on CPU: the KV cache's share of RAM) or {ROLLOUT}.max_num_seqs",
        "or shorten data.max_prompt_length / data.max_response_length",
    ],
}
_DEFAULT_ADVICE = [
    f"lower {ACTOR}.ppo_micro_batch_size_per_gpu and {ROLLOUT}.log_prob_micro_batch_size_per_gpu",
    f"or set {ACTOR}.use_dynamic_bsz=true with a smaller {ACTOR}.ppo_max_token_len_per_gpu",
    f"or set {_GRAD_CKPT}",
]

_MEMORY_KILL_MARKERS = ("low on memory", "memory pressure", "memory monitor", "out of memory")


class WorkerOutOfMemoryError(RuntimeError):
    """A worker of a group was killed for memory while running `method`; the message says what to change."""

    def __init__(self, message: str, method: str) -> None:
        super().__init__(message)
        self.method = method


def is_memory_kill(err: BaseException) -> bool:
    """Whether `err` is Ray reporting a worker killed by its memory monitor."""
    from ray.exceptions import OutOfMemoryError, RayActorError

    if isinstance(err, OutOfMemoryError):
        return True
    if isinstance(err, RayActorError):
        text = str(err).lower()
        return any(marker in text for marker in _MEMORY_KILL_MARKERS)
    return False


def build_oom_advice(method: str, group: str, ray_message: str) -> str:
    """The user-facing message: which call died, what to lower for it, and Ray's own first line."""
    steps = [*_ADVICE.get(method, _DEFAULT_ADVICE), _MORE_MEMORY]
    first_line = next((line.strip() for line in ray_message.splitlines() if line.strip()), "")
    return (
        f"a worker of the {group} group was killed for memory during {method}: the node ran low on memory. "
        "To fit, "
        + "; ".join(steps)
        + f". (Ray: {first_line})"
    )


def get_or_explain_oom(refs: Any, method: str, group: str, timeout: float | None = None) -> Any:
    """`ray.get(refs)`, turning a worker killed for memory into `WorkerOutOfMemoryError`."""
    import ray

    try:
        return ray.get(refs, timeout=timeout)
    except Exception as err:
        if not is_memory_kill(err):
            raise
        raise WorkerOutOfMemoryError(build_oom_advice(method, group, str(err)), method) from err
