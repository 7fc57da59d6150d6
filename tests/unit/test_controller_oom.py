"""A worker killed for memory becomes an error naming the settings to lower (issue 17)."""

from __future__ import annotations

from typing import Any

import pytest

ray_exceptions = pytest.importorskip("ray.exceptions")

from hybridflow.controller.oom import (  # noqa: E402
    WorkerOutOfMemoryError,
    build_oom_advice,
    get_or_explain_oom,
    is_memory_kill,
)

RAY_OOM = (
    "Task was killed due to the node running low on memory.\n"
    "Memory on the node (IP: 10.0.0.5) where the task was running was 21.20GB / 22.00GB (0.96)"
)


def actor_error(message: str) -> Exception:
    return ray_exceptions.RayActorError(actor_id=None, error_msg=message)


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (ray_exceptions.OutOfMemoryError(RAY_OOM), True),
        (actor_error("The actor died unexpectedly. 1 worker(s) were killed due to the node running low on memory"), True),
        (actor_error("The actor died unexpectedly before finishing this task."), False),
        (ray_exceptions.ActorDiedError(), False),
        (RuntimeError("node running low on memory"), False),  # not Ray's: left as it is
    ],
)
def test_is_memory_kill(err: Exception, expected: bool) -> None:
    assert is_memory_kill(err) is expected


@pytest.mark.parametrize(
    ("method", "settings"),
    [
        ("update_actor", ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                          "actor_rollout_ref.actor.use_dynamic_bsz=true",
                          "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                          "actor_rollout_ref.model.enable_gradient_checkpointing=true"]),
        ("compute_log_prob", ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                              "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"]),
        ("compute_ref_log_prob", ["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"]),
        ("update_critic", ["critic.ppo_micro_batch_size_per_gpu", "critic.ppo_max_token_len_per_gpu"]),
        ("generate_sequences", ["actor_rollout_ref.rollout.gpu_memory_utilization"]),
        ("init_model", ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"]),
    ],
)
def test_advice_names_the_settings_of_the_phase(method: str, settings: list[str]) -> None:
    message = build_oom_advice(method, "actor", RAY_OOM)
    assert message.startswith(f"a worker of the actor group was killed for memory during {method}")
    for setting in settings:
        assert setting in message
    assert "spec.resources.memory" in message
    assert message.endswith("(Ray: Task was killed due to the node running low on memory.)")


def test_get_turns_a_memory_kill_into_the_advice_and_keeps_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    original = ray_exceptions.OutOfMemoryError(RAY_OOM)

    def killed(refs: Any, timeout: float | None = None) -> Any:
        raise original

    monkeypatch.setattr(ray, "get", killed)
    with pytest.raises(WorkerOutOfMemoryError, match="lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") as info:
        get_or_explain_oom(["ref"], "update_actor", "actor")
    assert info.value.__cause__ is original and info.value.method == "update_actor"


def test_get_leaves_other_errors_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def fails(refs: Any, timeout: float | None = None) -> Any:
        raise ray_exceptions.GetTimeoutError("timed out")

    monkeypatch.setattr(ray, "get", fails)
    with pytest.raises(ray_exceptions.GetTimeoutError):
        get_or_explain_oom(["ref"], "update_actor", "actor")


def test_troubleshooting_quotes_the_message_as_produced() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text()
    assert build_oom_advice("update_actor", "actor", RAY_OOM) in doc
