"""verl rollout keys read in issue 13: an explicit mode=async for single-turn generation, multi_stage_wake_up,
use_prefix_grouper. Each is either honoured, or accepted with a start-up note saying what happens here."""

from __future__ import annotations

import pytest

from hybridflow.config import ConfigError
from hybridflow.trainer.main_ppo import load_run_config

RUN = ["actor_rollout_ref.model.path=/m", "data.train_files=/d/train.parquet", "trainer.n_gpus_per_node=8"]
RO = "actor_rollout_ref.rollout"


def _run(*overrides: str) -> tuple[object, str]:
    cfg, notes = load_run_config([*RUN, *overrides])
    return cfg, " | ".join(notes)


def _problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_run_config([*RUN, *overrides])
    return info.value.problems


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_single_turn_async_with_tensor_parallel_stays_async(device: str) -> None:
    """Server replicas span tensor_model_parallel_size slots: a single-turn TP 2 line keeps verl's mode, no note."""
    cfg, notes = _run(f"{RO}.mode=async", f"{RO}.tensor_model_parallel_size=2", f"{RO}.name=vllm",
                      f"trainer.device={device}")
    assert (cfg.actor_rollout_ref.rollout.mode, cfg.actor_rollout_ref.rollout.tensor_model_parallel_size) == ("async", 2)
    assert "sync mode" not in notes


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_single_turn_async_on_a_server_engine_stays_async(name: str) -> None:
    cfg, notes = _run(f"{RO}.mode=async", f"{RO}.name={name}")
    assert (cfg.actor_rollout_ref.rollout.mode, cfg.actor_rollout_ref.rollout.name) == ("async", name)
    assert "sync mode" not in notes


def test_single_turn_async_on_hf_runs_in_sync_mode_with_a_note() -> None:
    cfg, notes = _run(f"{RO}.mode=async", f"{RO}.name=hf")
    assert (cfg.actor_rollout_ref.rollout.mode, cfg.actor_rollout_ref.rollout.name) == ("sync", "hf")
    assert "server replicas here are vLLM or SGLang engines (rollout.name=hf)" in notes


def test_async_that_server_mode_serves_is_kept() -> None:
    cfg, notes = _run(f"{RO}.mode=async", f"{RO}.tensor_model_parallel_size=1", f"{RO}.name=vllm")
    assert cfg.actor_rollout_ref.rollout.mode == "async"
    assert "sync mode" not in notes


@pytest.mark.parametrize(
    "needs_server",
    [
        [f"{RO}.multi_turn.enable=true"],
        [f"{RO}.multi_turn.tool_config_path=/tools.yaml"],
        [f"{RO}.agent.agent_loop_config_path=/agents.yaml"],
        ["async_training.mode=fully_async", "trainer.placement=split"],
    ],
)
def test_async_that_needs_server_mode_keeps_it_on_sglang_and_is_refused_on_hf(needs_server: list[str]) -> None:
    """Tools, agent loops and asynchronous training need server replicas: SGLang serves them; the hf rollout is no
    server, so there they are refused, not downgraded to sync mode."""
    cfg, _ = _run(f"{RO}.mode=async", f"{RO}.name=sglang", *needs_server)
    assert cfg.actor_rollout_ref.rollout.mode == "async"
    problems = _problems(f"{RO}.mode=async", f"{RO}.name=hf", *needs_server)
    assert any("the hf rollout is not a server" in p for p in problems)


@pytest.mark.parametrize(
    "needs_server",
    [
        [f"{RO}.multi_turn.enable=true"],
        [f"{RO}.agent.agent_loop_config_path=/agents.yaml"],
    ],
)
def test_async_that_needs_server_mode_runs_tensor_parallel_replicas(needs_server: list[str]) -> None:
    cfg, notes = _run(f"{RO}.mode=async", f"{RO}.tensor_model_parallel_size=2", f"{RO}.name=vllm", *needs_server)
    assert (cfg.actor_rollout_ref.rollout.mode, cfg.actor_rollout_ref.rollout.tensor_model_parallel_size) == ("async", 2)


def test_multi_stage_wake_up_is_accepted_with_a_note_and_typed() -> None:
    cfg, notes = _run(f"{RO}.multi_stage_wake_up=true")
    assert "actor_rollout_ref.rollout.multi_stage_wake_up=true (a peak-memory option" in notes
    assert "vLLM engine here always wakes in those stages" in notes
    (problem,) = _problems(f"{RO}.multi_stage_wake_up=3")
    assert problem.startswith("actor_rollout_ref.rollout.multi_stage_wake_up: this verl rollout-engine option")


def test_prefix_grouper_is_accepted_with_a_note_and_typed() -> None:
    _, notes = _run("actor_rollout_ref.actor.use_prefix_grouper=true")
    assert "use_prefix_grouper=true (a compute saver" in notes
    assert "same log-probs and gradients" in notes
    (problem,) = _problems("actor_rollout_ref.actor.use_prefix_grouper=maybe")
    assert "verl's shared-prefix forward (PrefixGrouper) with this value is not built in HybridFlow yet" in problem
    assert "set use_prefix_grouper to true or false" in problem


@pytest.mark.parametrize(("fmt", "read_as", "note"), [
    ("hermes", "hermes", ""), ("gpt-oss", "gpt-oss", ""), ("qwen3_coder", "qwen3_coder", ""),
    ("qwen", "hermes", "multi_turn.format=qwen is read as hermes: Qwen2.5's and Qwen3's chat templates write tool "
     "calls as Hermes"),
])
def test_verls_tool_call_formats_are_read(fmt: str, read_as: str, note: str) -> None:
    """verl's tool parsers are hermes, gpt-oss and qwen3_coder; its sglang multi-turn configs also say qwen, read
    as hermes with a note (never silently)."""
    cfg, notes = _run(f"{RO}.multi_turn.enable=true", f"{RO}.multi_turn.format={fmt}")
    assert cfg.actor_rollout_ref.rollout.multi_turn.format == read_as
    assert (note in notes) if note else "multi_turn.format" not in notes


def test_an_unknown_tool_call_format_is_refused_naming_the_choices() -> None:
    (problem,) = _problems(f"{RO}.multi_turn.enable=true", f"{RO}.multi_turn.format=pythonic")
    assert problem == (
        f"{RO}.multi_turn.format: this multi-turn tool-call format is not supported by HybridFlow; set "
        f"{RO}.multi_turn.format to one of hermes, gpt-oss, qwen3_coder (hermes: <tool_call>{{json}}</tool_call>, as "
        "Qwen2.5's and Qwen3's chat templates write; gpt-oss: Harmony; qwen3_coder: the XML calls of Qwen3-Coder and "
        "Qwen3.5), or qwen, read as hermes (got 'pythonic')"
    )
