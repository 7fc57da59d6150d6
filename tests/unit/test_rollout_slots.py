"""Tensor-parallel server replicas: which pool slots a replica spans, how many replicas there are, and the
vLLM-CPU core lists of its ranks (hybridflow.workers.rollout_service, hybridflow.workers.cpu_slots)."""

from __future__ import annotations

import pytest

from hybridflow.config import load_config
from hybridflow.workers.cpu_slots import omp_bind_mask, omp_bind_setting
from hybridflow.workers.rollout_service import replica_count, replica_slots

BASE = ["actor_rollout_ref.model.path=/m", "data.train_files=/d/train.parquet", "actor_rollout_ref.rollout.mode=async"]


@pytest.mark.parametrize(
    ("rank", "tp", "world", "slots"),
    [
        (0, 1, 4, [0]),
        (3, 1, 4, [3]),
        (0, 2, 4, [0, 1]),
        (1, 2, 4, [2, 3]),
        (1, 4, 8, [4, 5, 6, 7]),
        (0, 2, 2, [0, 1]),
    ],
)
def test_a_replica_spans_tp_consecutive_slots(rank: int, tp: int, world: int, slots: list[int]) -> None:
    assert replica_slots(rank, tp, world) == slots


def test_a_tp_that_does_not_divide_the_pool_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="tensor_model_parallel_size=4 does not divide the rollout pool's 6 slots"):
        replica_slots(0, 4, 6)


def test_a_replica_beyond_the_pool_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="replica 2 would need slots 4..5 of a rollout pool of 4 .* set "
                                         "actor_rollout_ref.rollout.replicas to at most 2, or leave it null"):
        replica_slots(2, 2, 4)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (["trainer.n_gpus_per_node=8", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
          "actor_rollout_ref.rollout.replicas=5"],
         "actor_rollout_ref.rollout.replicas: 5 replicas x tensor_model_parallel_size 2 need 10 slots of the rollout "
         "pool, which has 8 (trainer.nnodes x trainer.n_gpus_per_node); set it to at most 4, leave it null"),
        (["trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.replicas=3"],
         "3 replicas x tensor_model_parallel_size 1 need 3 slots of the rollout pool, which has 2"),
    ],
)
def test_more_replicas_than_the_pool_holds_are_refused_with_the_fix(overrides: list[str], problem: str) -> None:
    from hybridflow.config import ConfigError

    with pytest.raises(ConfigError) as info:
        load_config(None, [*BASE, *overrides]).validate_for_run()
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_replicas_that_fill_the_pool_are_accepted() -> None:
    load_config(None, [*BASE, "trainer.n_gpus_per_node=8", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                       "actor_rollout_ref.rollout.replicas=4"]).validate_for_run()


@pytest.mark.parametrize(
    ("overrides", "world", "count"),
    [
        (["trainer.device=cuda", "trainer.n_gpus_per_node=8"], 8, 8),
        (["trainer.device=cuda", "trainer.n_gpus_per_node=8", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"], 8, 4),
        (["trainer.device=cuda", "trainer.n_gpus_per_node=4", "trainer.nnodes=2",
          "actor_rollout_ref.rollout.tensor_model_parallel_size=4"], 8, 2),
        (["trainer.device=cuda", "trainer.n_gpus_per_node=8", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
          "actor_rollout_ref.rollout.replicas=3"], 8, 3),  # fewer than the pool holds: the other slots stay idle
        (["trainer.device=cpu", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"], 2, 1),
        (["trainer.device=cpu", "trainer.n_gpus_per_node=4", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"], 4, 1),
    ],
    ids=["gpu-tp1", "gpu-tp2", "gpu-tp4-two-nodes", "gpu-explicit", "cpu-tp2", "cpu-tp2-of-4"],
)
def test_replicas_are_one_per_tensor_parallel_group_on_gpu_and_one_on_cpu(overrides: list[str], world: int, count: int) -> None:
    cfg = load_config(None, [*BASE, *overrides])
    assert replica_count(cfg, world) == count


@pytest.mark.parametrize(
    ("n_cpus", "cores", "tp", "mask"),
    [
        (2, None, 1, "0-1"),
        (1, None, 1, "0"),
        (2, None, 2, "0|1"),
        (8, None, 2, "0-3|4-7"),
        (8, 4, 2, "4-5|6-7"),  # split placement: the last cores, the trainer keeps the first
        (8, 3, 2, "5|6-7"),
        (8, 1, 1, "7"),
        (6, None, 4, "0|1-2|3|4-5"),
    ],
)
def test_each_rank_gets_its_own_core_list(n_cpus: int, cores: int | None, tp: int, mask: str) -> None:
    assert omp_bind_mask(n_cpus, cores, tp) == mask


def test_more_ranks_than_cores_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="the replica has 1 core\\(s\\); lower tensor_model_parallel_size to at most 1"):
        omp_bind_mask(8, 1, 2)


@pytest.mark.parametrize(("user", "tp", "setting"), [
    (None, 2, "0-1|2-3"), ("", 2, "0-1|2-3"), ("0|3", 2, "0|3"), ("auto", 2, "auto"), ("nobind", 4, "nobind"),
    ("1-2", 1, "1-2"),
])
def test_a_users_core_lists_win_when_there_is_one_per_rank(user: str | None, tp: int, setting: str) -> None:
    assert omp_bind_setting(user, 4, None, tp) == setting


def test_a_users_core_lists_that_do_not_match_the_ranks_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError) as info:
        omp_bind_setting("0-3", 4, None, 2)
    message = str(info.value)
    assert "VLLM_CPU_OMP_THREADS_BIND='0-3' has 1 core list(s)" in message
    assert "tensor_model_parallel_size=2 runs 2 vLLM-CPU rank(s)" in message
    assert "(e.g. '0-1|2-3' on this machine), or unset it" in message
