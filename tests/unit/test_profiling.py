"""verl's profiler keys with tool=torch: the config (verl's layout and defaults, npu refused), which steps and ranks
are traced, and real torch.profiler traces of one tiny actor step in-process, on disk and on S3 (the other tools:
test_profiler_tools)."""

from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow import storage
from hybridflow.config import ConfigError, load_config
from hybridflow.models.tiny import build_tiny_model
from hybridflow.profiling import StepProfiler, WorkerProfiler, role_profile, step_windows, window_label
from hybridflow.protocol import DataProto
from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker

BASE = ["trainer.n_gpus_per_node=2", "trainer.device=cpu"]
ACTOR = "actor_rollout_ref.actor.profiler"


def _cfg(*overrides: str) -> Any:
    return load_config(None, [*BASE, *overrides])


def _problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _cfg(*overrides)
    return info.value.problems


def test_verl_profiler_keys_parse_with_verls_layout() -> None:
    cfg = _cfg("global_profiler.tool=torch", "global_profiler.steps=[1,2,5]", f"{ACTOR}.enable=True",
               f"{ACTOR}.ranks=[0,1]", f"{ACTOR}.tool_config.torch.contents=[cpu,shapes]",
               f"{ACTOR}.tool_config.torch.discrete=True", f"{ACTOR}.tool_config.torch.step_start=0",
               "critic.profiler.enable=True", "critic.profiler.all_ranks=True",
               "global_profiler.global_tool_config.torch_memory.stack_depth=16")
    actor = role_profile(cfg, "actor")
    assert actor.chooses(1) and not actor.chooses(2) and actor.discrete and actor.contents == ("cpu", "shapes")
    assert role_profile(cfg, "critic").chooses(1) and not role_profile(cfg, "ref").enabled
    rollout = role_profile(cfg, "rollout")  # verl: the rollout's unset profiler fields are the actor's
    assert rollout.enabled and rollout.ranks == (0, 1) and rollout.discrete
    assert actor.root == f"{cfg.trainer.default_local_dir}/profile"  # beside the checkpoints
    notes = " ".join(cfg.verl_notes)
    assert "step_start=0" in notes and "torch_memory.stack_depth=16 (torch records whole stacks)" in notes


@pytest.mark.parametrize("where", ["global_profiler.tool", f"{ACTOR}.tool"])
def test_the_npu_tool_is_refused_naming_what_to_use(where: str) -> None:
    (problem,) = _problems(f"{where}=npu", "global_profiler.steps=[1]", f"{ACTOR}.enable=True", f"{ACTOR}.all_ranks=True")
    assert problem.startswith(f"{where}: verl's npu profiler (Ascend NPUs) is not supported")
    assert "use global_profiler.tool=nsys, torch_memory or torch" in problem


@pytest.mark.parametrize(("overrides", "expected"), [
    ([f"{ACTOR}.enable=True", f"{ACTOR}.all_ranks=True", "global_profiler.steps=[1]"], "no tool is set"),
    ([f"{ACTOR}.enable=True", f"{ACTOR}.all_ranks=True", "global_profiler.tool=torch"], "steps is empty"),
    ([f"{ACTOR}.enable=True", "global_profiler.tool=torch", "global_profiler.steps=[1]"], "no rank chosen"),
    ([f"{ACTOR}.enable=True", f"{ACTOR}.ranks=[2]", "global_profiler.tool=torch", "global_profiler.steps=[1]"],
     "[2] not among the 2 ranks"),
    (["global_profiler.tool=torch", "global_profiler.steps=[1]"], "nothing would be profiled"),
    ([f"{ACTOR}.tool_config.torch.step_end=3"], "mini-batch window of the torch profiler"),
    (["reward_model.profiler.enable=True", "global_profiler.tool=torch", "global_profiler.steps=[1]"],
     "reward_model.profiler: no rank chosen"),
])
def test_settings_that_would_profile_nothing_or_what_is_not_built_say_what_to_set(
    overrides: list[str], expected: str
) -> None:
    assert any(expected in p for p in _problems(*overrides)), _problems(*overrides)


def test_server_replicas_are_profiled_only_when_the_rollout_asks_with_the_torch_tool() -> None:
    """rollout.mode=async: the replicas are not the actor's processes, so the rollout section stands alone; vLLM's
    torch profiler records them (SGLang's and the other tools are refused)."""
    server = ["actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.name=vllm", "global_profiler.steps=[1]"]
    actor_only = _cfg(*server, "global_profiler.tool=torch", f"{ACTOR}.enable=True", f"{ACTOR}.all_ranks=True")
    assert role_profile(actor_only, "actor").enabled and not role_profile(actor_only, "rollout").enabled
    rollout = "actor_rollout_ref.rollout.profiler"
    replicas = _cfg(*server, "global_profiler.tool=torch", f"{rollout}.enable=True", f"{rollout}.ranks=[1]")
    assert [WorkerProfiler(replicas, ("rollout",), r, f"rollout_replica{r}").active for r in (0, 1)] == [False, True]
    memory = _cfg(*server, "trainer.device=cuda", "global_profiler.tool=torch_memory")  # rank 0 of trainer groups
    assert WorkerProfiler(memory, ("actor",), 0, "actor").active
    (problem,) = _problems(*server, "global_profiler.tool=torch", f"{rollout}.enable=True", f"{rollout}.all_ranks=True",
                           "actor_rollout_ref.rollout.name=sglang")
    assert "profiling SGLang server replicas is not built in HybridFlow yet; use rollout.name=vllm" in problem
    problems = _problems(*server, "trainer.device=cuda", "global_profiler.tool=nsys", f"{rollout}.enable=True",
                         f"{rollout}.all_ranks=True")
    assert any("server replicas are profiled with tool=torch (vLLM's torch profiler) only, not nsys" in p
               for p in problems), problems


def test_step_windows_and_the_driver_start_and_stop_around_them() -> None:
    assert step_windows([5, 1, 2], continuous=False) == [(1, 1), (2, 2), (5, 5)]
    assert step_windows([5, 1, 2, 3], continuous=True) == [(1, 3), (5, 5)]
    assert window_label((1, 3)) == "global_step_1-3" and window_label((5, 5)) == "global_step_5"

    class Group:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def start_profile(self, label: str) -> None:
            self.calls.append(f"start {label}")

        def stop_profile(self) -> list[list[str]]:
            self.calls.append("stop")
            return [[f"trace{len(self.calls)}"]]

    cfg = _cfg("global_profiler.tool=torch", "global_profiler.steps=[2,3,5]", "global_profiler.profile_continuous_steps=true",
               f"{ACTOR}.enable=True", f"{ACTOR}.all_ranks=True")
    group = Group()
    driver = StepProfiler(cfg, [group, None], log=lambda _: None)
    written = []
    for step in range(3, 7):  # resumed at step 3: the window 2-3 starts mid-way
        driver.before_step(step)
        written += driver.after_step(step)
    assert group.calls == ["start global_step_2-3", "stop", "start global_step_5", "stop"]
    assert written == ["trace2", "trace4"]

    class Gone(Group):
        def stop_profile(self) -> list[list[str]]:
            raise RuntimeError("actor died")

    logged: list[str] = []
    ending = StepProfiler(cfg, [Gone()], log=logged.append)
    ending.before_step(5)
    ending.close()  # fit()'s finally: never raises over the error ending the run
    assert logged == ["profiler: the running trace could not be written: RuntimeError: actor died"]


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> ActorRolloutRefWorker:
    return actor_worker(tmp_path_factory.mktemp("prof"))


def actor_worker(root: Path) -> ActorRolloutRefWorker:
    """An actor worker in this process (rank 0 of 1), its checkpoints under `root`."""
    model = build_tiny_model(root / "model", seed=0, layers=1)
    cfg = load_config(None, [
        "trainer.n_gpus_per_node=1", "trainer.device=cpu", f"trainer.default_local_dir={root / 'ckpt'}",
        f"actor_rollout_ref.model.path={model}", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "global_profiler.tool=torch", "global_profiler.steps=[1]", f"{ACTOR}.enable=True", f"{ACTOR}.all_ranks=True",
    ])
    w = ActorRolloutRefWorker(cfg, role="actor")
    w.init_model()
    return w


def _batch(vocab: int, rows: int = 4, prompt: int = 5, resp: int = 4) -> DataProto:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, prompt + resp), generator=gen)
    mask = torch.ones(rows, prompt + resp, dtype=torch.long)
    return DataProto.from_dict(tensors={
        "input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
        "responses": ids[:, prompt:].clone(), "response_mask": torch.ones(rows, resp, dtype=torch.long),
        "advantages": torch.randn(rows, resp, generator=gen),
    }, meta_info={"temperature": 1.0})


def _event_names(uri: str) -> set[str]:
    trace = json.loads(gzip.decompress(storage.read_bytes(uri)))
    return {event.get("name", "") for event in trace["traceEvents"]}


def _step(worker: ActorRolloutRefWorker) -> None:
    data = _batch(worker.actor.engine.hf_config.vocab_size)
    data = data.union(worker.compute_log_prob(data).select(batch_keys=["old_log_probs"]))
    worker.update_actor(data)


def test_a_continuous_trace_of_one_step_lands_beside_the_checkpoints(worker: ActorRolloutRefWorker) -> None:
    worker.start_profile("global_step_1")
    _step(worker)
    (uri,) = worker.stop_profile()
    assert uri == f"{worker.config.trainer.default_local_dir}/profile/global_step_1/actor_rank0.json.gz"
    names = _event_names(uri)
    assert {"actor.compute_log_prob", "actor.update_actor"} <= names  # each worker call a region of the trace
    assert any(n.startswith("aten::") for n in names)  # the torch operators inside them
    _step(worker)  # outside a profiled window nothing is traced
    assert worker.stop_profile() == []


def test_discrete_traces_per_call_on_s3_and_an_unchosen_rank_writes_none(
    worker: ActorRolloutRefWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.s3 import make_bucket, moto_s3, s3_env

    with moto_s3() as server:
        for key, value in s3_env(server.url).items():
            monkeypatch.setenv(key, value)
        bucket = f"prof-{uuid.uuid4().hex[:8]}"
        make_bucket(server.url, bucket)
        cfg = worker.config.model_copy(deep=True)
        cfg.trainer.default_local_dir = f"s3://{bucket}/proj/exp"
        cfg.actor_rollout_ref.actor.profiler.tool_config = {"torch": {"discrete": True, "contents": ["cpu"]}}
        worker.profiler = WorkerProfiler(cfg, ("actor",), rank=0, name="actor")
        worker.start_profile("global_step_3")
        _step(worker)
        written = worker.stop_profile()
        root = f"s3://{bucket}/proj/exp/profile/global_step_3"
        assert written == [f"{root}/actor_compute_log_prob_rank0.json.gz", f"{root}/actor_update_actor_rank0.json.gz"]
        assert "actor.update_actor" in _event_names(written[1])
        assert "actor.update_actor" not in _event_names(written[0])  # one call per trace
    cfg.actor_rollout_ref.actor.profiler.all_ranks = False
    cfg.actor_rollout_ref.actor.profiler.ranks = [1]
    assert not WorkerProfiler(cfg, ("actor",), rank=0, name="actor").active

