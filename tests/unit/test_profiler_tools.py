"""verl's torch_memory and nsys profilers: the config (verl's keys, what is refused and why), which ranks record, the
Ray runtime env that starts a worker under nsys, and one tiny actor step recorded by each tool in-process.

The CUDA calls the tools make (torch.cuda.memory's history and snapshot, cudaProfilerStart/Stop, NVTX ranges) need
a GPU: here they are stand-ins that log each call, so the tests check when and with what the tools call them. The
real calls run in bench/gpu_smoke.py on a GPU; Ray starting a worker under nsys is in
tests/integration/test_workers_group.py.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hybridflow import storage
from hybridflow.config import ConfigError, load_config
from hybridflow.profiling import WorkerProfiler, nsight_runtime_env, nsys_dir
from hybridflow.trainer.main_ppo import profiler_tool_problem
from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker
from tests.unit.test_profiling import _step, actor_worker

GPU = ["trainer.n_gpus_per_node=2", "trainer.device=cuda"]
ACTOR = "actor_rollout_ref.actor.profiler"
NSYS = "global_profiler.global_tool_config.nsys"
MEMORY = "global_profiler.global_tool_config.torch_memory"


def _cfg(*overrides: str) -> Any:
    return load_config(None, [*GPU, *overrides])


def _problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _cfg(*overrides)
    return info.value.problems


# ------------------------------------------------------------------------------------------ config


def test_verls_torch_memory_line_is_accepted_and_its_unread_key_noted() -> None:
    """verl's examples/sglang_multiturn line: tool and settings, no role enabled (rank 0 of each group records)."""
    cfg = _cfg("global_profiler.tool=torch_memory", "global_profiler.save_path=./mem_snapshots", "global_profiler.steps=[2]",
               f"{MEMORY}.trace_alloc_max_entries=5000", f"{MEMORY}.stack_depth=64", f"{MEMORY}.context=alloc")
    memory = cfg.global_profiler.global_tool_config.torch_memory
    assert (memory.trace_alloc_max_entries, memory.context, memory.stacks) == (5000, "alloc", "all")
    assert "torch_memory.stack_depth=64 (torch records whole stacks)" in " ".join(cfg.verl_notes)
    assert WorkerProfiler(cfg, ("actor", "ref"), rank=0, name="actor_ref").active
    assert not WorkerProfiler(cfg, ("actor", "ref"), rank=1, name="actor_ref").active
    assert WorkerProfiler(cfg, ("critic",), rank=0, name="critic").active  # rank 0 of every trainer group
    enabled = _cfg("global_profiler.tool=torch_memory", "global_profiler.steps=[2]", f"{ACTOR}.enable=True",
                   f"{ACTOR}.ranks=[1]")
    assert [WorkerProfiler(enabled, ("actor",), rank=r, name="a").active for r in (0, 1)] == [False, True]
    assert not WorkerProfiler(enabled, ("critic",), rank=0, name="critic").active  # an enabled role chooses


def test_a_tool_without_steps_is_noted_as_profiling_nothing() -> None:
    """verl's sglang_multiturn line sets no steps: verl profiles nothing then, and so does HybridFlow, saying so."""
    cfg = _cfg("global_profiler.tool=torch_memory", "global_profiler.save_path=./mem_snapshots")
    assert ("global_profiler.tool=torch_memory without global_profiler.steps profiles nothing (as in verl); set e.g. "
            "global_profiler.steps=[1]") in cfg.verl_notes
    assert not WorkerProfiler(cfg, ("actor",), rank=0, name="actor").active
    assert not any("without global_profiler.steps" in n for n in _cfg("global_profiler.tool=torch_memory",
                                                                      "global_profiler.steps=[3]").verl_notes)


def test_verls_nsys_line_is_accepted_with_its_options() -> None:
    """verl's run_qwen2-7b_rm_seq_balance_nsys.sh, on 8 GPUs."""
    cfg = load_config(None, [
        "trainer.n_gpus_per_node=8", f"{ACTOR}.enable=True", f"{ACTOR}.ranks=[0,4]", f"{ACTOR}.all_ranks=False",
        "critic.profiler.enable=True", "critic.profiler.ranks=[0,4]", "global_profiler.profile_continuous_steps=True",
        "global_profiler.tool=nsys", "global_profiler.steps=[1,2,5]", f"{NSYS}.discrete=True",
    ])
    profiler = WorkerProfiler(cfg, ("actor", "rollout", "ref"), rank=4, name="actor_rollout_ref")
    assert profiler.active and not profiler.continuous and set(profiler.chosen) == {"actor", "rollout"}
    assert cfg.verl_notes == []


@pytest.mark.parametrize(("overrides", "expected"), [
    (["trainer.device=cpu", "global_profiler.tool=torch_memory", "global_profiler.steps=[1]"],
     "global_profiler.tool=torch_memory records CUDA activity and needs trainer.device=cuda; on CPU use "
     "global_profiler.tool=torch with <role>.profiler.tool_config.torch.contents=[memory]"),
    (["trainer.device=cpu", "global_profiler.tool=nsys", "global_profiler.steps=[1]", f"{ACTOR}.enable=True",
      f"{ACTOR}.all_ranks=True"], "global_profiler.tool=nsys records CUDA activity and needs trainer.device=cuda"),
    (["global_profiler.steps=[1]", f"{ACTOR}.enable=True", f"{ACTOR}.all_ranks=True", f"{ACTOR}.tool=nsys",
      "critic.profiler.enable=True", "critic.profiler.all_ranks=True", "critic.profiler.tool=torch"],
     "the enabled roles use different tools (nsys: actor_rollout_ref.actor; torch: critic)"),
    (["global_profiler.tool=nsys", "global_profiler.steps=[1]", f"{ACTOR}.enable=True", f"{ACTOR}.all_ranks=True",
      f"{NSYS}.worker_nsight_options.trace=null"], "worker_nsight_options: trace null; nsys takes no option"),
    ([f"{MEMORY}.trace_alloc_max_entries=0"], "trace_alloc_max_entries"),
    (["global_profiler.tool=nsys", "global_profiler.steps=[1]"], "nothing would be profiled"),
])
def test_settings_a_tool_cannot_run_with_say_what_to_set(overrides: list[str], expected: str) -> None:
    assert any(expected in p for p in _problems(*overrides)), _problems(*overrides)


def test_the_nsys_runtime_env_fills_verls_blanks_per_run(tmp_path: Any) -> None:
    base = ["global_profiler.tool=nsys", "global_profiler.steps=[1,2,5]", "critic.profiler.enable=True",
            "critic.profiler.ranks=[1]", f"global_profiler.save_path={tmp_path}"]
    env = nsight_runtime_env(_cfg(*base), ["critic"], "critic")
    assert env(0) is None  # a rank that records nothing runs without nsys
    options = env(1)["nsight"]
    assert options == {
        "trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph",
        "capture-range": "cudaProfilerApi", "kill": "none",
        "capture-range-end": "repeat-shutdown:3",  # one capture per window: [1], [2], [5]
        "o": f"{tmp_path}/nsys/critic_%p",
    }
    assert nsys_dir(str(tmp_path)) == f"{tmp_path}/nsys"
    continuous = nsight_runtime_env(_cfg(*base, "global_profiler.profile_continuous_steps=True"), ["critic"], "c")(1)
    assert continuous["nsight"]["capture-range-end"] == "repeat-shutdown:2"  # [1-2], [5]
    discrete = nsight_runtime_env(_cfg(*base, f"{NSYS}.discrete=True"), ["critic"], "critic")(1)
    assert discrete["nsight"]["capture-range-end"] == "repeat"  # one capture per call: as many as there are
    own = nsight_runtime_env(_cfg(*base, "global_profiler.save_path=s3://b/p", f"+{NSYS}.worker_nsight_options.t=cuda",
                                  f"{NSYS}.worker_nsight_options.capture-range-end=stop-shutdown",
                                  f"{NSYS}.worker_nsight_options.cuda-memory-usage=false"), ["critic"], "critic")(1)
    assert own["nsight"]["capture-range-end"] == "stop-shutdown" and own["nsight"]["t"] == "cuda"
    assert own["nsight"]["o"] == "critic_%p"  # not a local folder: nsys writes in Ray's logs/nsight
    assert own["nsight"]["cuda-memory-usage"] == "false"
    torch_run = _cfg("global_profiler.tool=torch", "global_profiler.steps=[1]", "critic.profiler.enable=True",
                     "critic.profiler.all_ranks=True")
    assert nsight_runtime_env(torch_run, ["critic"], "critic")(0) is None


def test_a_machine_without_nsys_is_refused_before_ray_starts(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg("global_profiler.tool=nsys", "global_profiler.steps=[1]", f"{ACTOR}.enable=True", f"{ACTOR}.all_ranks=True")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "no `nsys` on this machine's PATH" in profiler_tool_problem(cfg)
    (tmp_path / "nsys").write_text("#!/bin/sh\n")
    (tmp_path / "nsys").chmod(0o755)
    assert profiler_tool_problem(cfg) is None
    assert profiler_tool_problem(_cfg()) is None


# ------------------------------------------------------------------------- one step, each tool


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> ActorRolloutRefWorker:
    return actor_worker(tmp_path_factory.mktemp("tools"))


@pytest.fixture
def cuda_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Stand-ins for the CUDA calls the tools make, logging each (no GPU here)."""
    calls: list[Any] = []

    def record_history(enabled: str | None = "all", **kwargs: Any) -> None:
        calls.append(("history", enabled, kwargs))

    def dump_snapshot(path: str) -> None:
        calls.append(("dump",))
        with open(path, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [[{"action": "alloc", "size": 512}]]}, f)

    @contextlib.contextmanager
    def nvtx_range(name: str) -> Iterator[None]:
        calls.append(("nvtx", name))
        yield
        calls.append(("nvtx end", name))

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record_history)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump_snapshot)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append(("capture start",)))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append(("capture stop",)))
    monkeypatch.setattr(torch.cuda.nvtx, "range", nvtx_range)
    return calls


def _with_tool(worker: ActorRolloutRefWorker, tool: str, **settings: Any) -> Any:
    """The worker's config with `tool` (set in place of validation: the worker runs on CPU)."""
    cfg = worker.config.model_copy(deep=True)
    cfg.global_profiler.tool = tool
    for name, value in settings.items():
        setattr(cfg.global_profiler.global_tool_config.nsys if name == "discrete" else
                cfg.global_profiler.global_tool_config.torch_memory, name, value)
    return cfg


def test_torch_memory_records_the_window_and_writes_a_snapshot_beside_the_checkpoints(
    worker: ActorRolloutRefWorker, cuda_calls: list[Any]
) -> None:
    cfg = _with_tool(worker, "torch_memory", trace_alloc_max_entries=777, stacks="python",
                     kw_args={"skip_actions": ["free_requested"]})
    worker.profiler = WorkerProfiler(cfg, ("actor",), rank=0, name="actor")
    worker.start_profile("global_step_4")
    _step(worker)
    (uri,) = worker.stop_profile()
    assert uri == f"{cfg.trainer.default_local_dir}/profile/global_step_4/actor_rank0.pickle"
    assert pickle.loads(storage.read_bytes(uri))["device_traces"] == [[{"action": "alloc", "size": 512}]]
    assert cuda_calls == [  # recording starts with the window and stops after the snapshot
        ("history", "all", {"context": "all", "stacks": "python", "max_entries": 777,
                            "skip_actions": ["free_requested"]}),
        ("dump",),
        ("history", None, {}),
    ]
    _step(worker)  # outside a window: nothing
    assert worker.stop_profile() == [] and len(cuda_calls) == 3


@pytest.mark.parametrize("discrete", [False, True])
def test_nsys_captures_the_window_or_each_call_with_an_nvtx_range_per_call(
    worker: ActorRolloutRefWorker, cuda_calls: list[Any], discrete: bool
) -> None:
    cfg = _with_tool(worker, "nsys", discrete=discrete)
    worker.profiler = WorkerProfiler(cfg, ("actor",), rank=0, name="actor")
    worker.start_profile("global_step_1")
    _step(worker)
    assert worker.stop_profile() == []  # nsys writes its reports itself
    calls = [("nvtx", "actor.compute_log_prob"), ("nvtx end", "actor.compute_log_prob"),
             ("nvtx", "actor.update_actor"), ("nvtx end", "actor.update_actor")]
    if discrete:
        calls = [("capture start",), *calls[:2], ("capture stop",), ("capture start",), *calls[2:], ("capture stop",)]
    else:
        calls = [("capture start",), *calls, ("capture stop",)]
    assert cuda_calls == calls
    root = cfg.global_profiler.save_path or f"{cfg.trainer.default_local_dir}/profile"
    assert os.path.isdir(nsys_dir(str(root)))  # made before the capture: nsys writes the report there
