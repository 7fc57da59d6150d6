"""CPU runs: how many cores each worker process gets (its Ray slot and its torch threads).

Used by the driver to size the resource pools and by each worker to set its thread count, so the two
always agree. Torch-free: the driver imports it before Ray starts.
"""

from __future__ import annotations

import os

from hybridflow.config import HybridFlowConfig


def cpu_share(cfg: HybridFlowConfig) -> float:
    """CPUs per worker slot on CPU: the processes of one node share trainer.ray_init.num_cpus.

    Fewer processes than cores give each slot several whole cores (its torch thread count, see
    `cpu_threads`); more processes than cores get fractions of one (Ray allows fractions below 1).
    """
    available = cfg.trainer.ray_init.num_cpus or os.cpu_count() or 1
    processes = cfg.trainer.n_gpus_per_node * (2 if cfg.trainer.placement == "split" else 1)
    rm = getattr(cfg, "reward_model", None)  # the SFT / DPO trainers' configs have none
    if rm is not None and rm.enable and rm.enable_resource_pool:  # the reward model's own pool, on these cores
        processes += rm.n_gpus_per_node
    if available >= processes:
        return float(available // processes)
    return max(available / processes, 0.01)


def cpu_threads(cfg: HybridFlowConfig) -> int:
    """torch threads of one CPU worker: its slot's whole cores (at least 1).

    The actor, the critic and the reward model colocated in a slot run their phases one after the
    other, so each may use all of the slot's cores.
    """
    return max(1, int(cpu_share(cfg)))


def omp_bind_mask(n_cpus: int, cores: int | None = None, tp: int = 1) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a vLLM-CPU engine: every core, or the last `cores` of the machine's
    `n_cpus` (a split-placement replica leaves the first ones to the trainer), cut into `tp` contiguous
    lists joined by `|`, one per tensor-parallel rank (vLLM-CPU's syntax: "0-1|2-3").

    vLLM-CPU pins each rank's OpenMP threads to its list, so the ranks of one replica must not share cores.
    """
    first = max(0, n_cpus - cores) if cores else 0
    count = n_cpus - first
    if count < tp:
        raise ValueError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} runs {tp} vLLM-CPU ranks, each on cores "
            f"of its own, but the replica has {count} core(s); lower tensor_model_parallel_size to at most "
            f"{count}, or give the rollout more cores (a larger machine, or trainer.placement=colocate)"
        )
    lists = []
    for rank in range(tp):
        lo = first + rank * count // tp
        hi = first + (rank + 1) * count // tp - 1
        lists.append(f"{lo}-{hi}" if hi > lo else str(lo))
    return "|".join(lists)


def omp_bind_setting(user: str | None, n_cpus: int, cores: int | None = None, tp: int = 1) -> str:
    """The VLLM_CPU_OMP_THREADS_BIND to run with: the user's value when set (vLLM's "auto" and "nobind" too),
    else `omp_bind_mask`. A user value needs one core list per tensor-parallel rank (vLLM asserts that deep in
    its worker start-up; the message here says which setting to change)."""
    if not user:
        return omp_bind_mask(n_cpus, cores, tp)
    lists = len(user.split("|"))
    if user not in ("auto", "nobind") and lists != tp:
        raise ValueError(
            f"VLLM_CPU_OMP_THREADS_BIND={user!r} has {lists} core list(s), but "
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} runs {tp} vLLM-CPU rank(s), one list each; "
            f"give {tp} list(s) separated by '|' (e.g. {omp_bind_mask(n_cpus, None, min(tp, n_cpus))!r} on this "
            "machine), or unset it"
        )
    return user
