"""verl's own main_ppo command lines (../shared/verl-compat): each is accepted, or refused as a feature not here.

The corpus holds the 171 `python -m verl.trainer.main_ppo` invocations of verl's examples, recipes and
docs. Each line goes through `main_ppo.load_run_config`, the path the CLI takes before Ray starts (parse,
validate, the checks a run needs; no model, data or Ray), with its `--config-name` typed as a user would.
A refused line passes only when every problem names a verl feature from hybridflow._config.verl_features
(never a bare "unknown key"). Run with `-s` to see the counts (issue 13).
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from hybridflow._config import verl_features
from hybridflow.config import ConfigError
from hybridflow.trainer.main_ppo import load_run_config

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "verl-compat" / "main_ppo_invocations.jsonl"

#: Lines verl itself cannot run as written (a doc fragment or a typo), each with the one problem we expect.
BROKEN_IN_VERL = {
    "examples/ppo_trainer/run_deepseek7b_llm_pfppo.sh": "' ': missing '='",  # a stray quoted blank argument
    "docs/start/multinode.rst#block0": "'...': missing '='",  # "..." elides the rest in the doc
    "docs/sglang_multiturn/interaction_system.rst#block0": "cannot read the config file",  # a literal "\\"
    "docs/amd_tutorial/amd_build_dockerfile_page.rst#block1": "(got 'Flase')",  # typo of False
    # 16 ranks get 4 responses each per mini-batch, less than the micro-batch of 16: verl asserts this too.
    "docs/workers/sglang_worker.rst#block1": "ppo_micro_batch_size_per_gpu: 16 does not divide the 4 responses",
    # Relies on verl's placeholder defaults (~/models/deepseek-llm-7b-chat, ~/data/rlhf/gsm8k); HybridFlow
    # requires model.path and data.train_files to be set.
    "docs/advance/grafana_prometheus.md#block0": "actor_rollout_ref.model.path: required to run",
    # GRPO with rollout.n=1: every group holds one response, so every advantage is 0; verl runs it and learns
    # nothing, HybridFlow refuses it (it was refused for its LoRA keys before LoRA was built).
    "examples/tuning/0.5b/qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh": "grpo compares several responses per prompt",
    # rollout.n stays verl's default 1 on 8 GPUs: 32 x 1 / 8 = 4 responses per rank per mini-batch, fewer than the
    # micro-batch of 8, which verl asserts too (they were refused for algorithm.rollout_correction before it landed).
    "examples/rollout_correction/run_with_rollout_corr.sh": "ppo_micro_batch_size_per_gpu: 8 does not divide the 4",
    "examples/rollout_correction/run_with_rollout_corr_multi_rs.sh": "ppo_micro_batch_size_per_gpu: 8 does not divide the 4",
    # Ulysses size 4 on 2 GPUs: verl's data-parallel size world // sp is 0, so its (dp, sp) device mesh cannot be
    # built (and ppo_mini_batch_size //= 0); they were refused for Ulysses before it landed.
    "recipe/langgraph_agent/example/run_qwen2.5_3b.sh": "ulysses_sequence_parallel_size: 4 does not divide the 2 ranks",
    "recipe/langgraph_agent/example/run_gpt_oss_20b_bf16.sh": "ulysses_sequence_parallel_size: 4 does not divide the 2",
}

#: Accepted lines now; raise it when a feature lands, so that a regression fails.
ACCEPTED_FLOOR = 114


def _corpus() -> list[dict[str, Any]]:
    """The corpus lines (the test skips when ../shared is not checked out beside the repository)."""
    if not CORPUS.is_file():
        pytest.skip(f"no verl corpus at {CORPUS} (../shared/verl-compat beside the repository)")
    return [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]


def _argv(line: dict[str, Any]) -> list[str]:
    """The command line as a verl user types it: `--config-name NAME` (when not the default), then overrides."""
    name = line["config_name"]
    return [*(["--config-name", name] if name else []), *line["overrides"]]


def test_every_verl_command_line_is_accepted_or_refused_as_a_feature_not_supported_here() -> None:
    """100% accepted or clearly refused; the counts are printed (pytest -s) and accepted >= ACCEPTED_FLOOR."""
    lines = _corpus()
    accepted = 0
    by_feature: collections.Counter[str] = collections.Counter()
    only: collections.Counter[str] = collections.Counter()  # lines one feature alone keeps from running
    unclear: list[str] = []
    unclear_lines = 0
    broken: list[str] = []
    for line in lines:
        source = line["source"]
        try:
            load_run_config(_argv(line))
        except ConfigError as exc:
            features = [verl_features.feature_of(p) for p in exc.problems]
            if source in BROKEN_IN_VERL:
                assert any(BROKEN_IN_VERL[source] in p for p in exc.problems), (source, exc.problems)
                broken.append(source)
            elif all(features):
                names = {f.name for f in features if f is not None}
                by_feature.update(names)
                only.update(names if len(names) == 1 else ())
            else:
                unclear_lines += 1
                unclear += [f"{source}: {p}" for p, f in zip(exc.problems, features, strict=True) if f is None]
            continue
        assert source not in BROKEN_IN_VERL, f"{source} is accepted now: remove it from BROKEN_IN_VERL"
        accepted += 1
    refused = len(lines) - accepted - len(broken)
    print(f"\nverl corpus: {len(lines)} lines, {accepted} accepted, {refused - unclear_lines} refused as "
          f"not supported here, {len(broken)} broken in verl too, {unclear_lines} unclear")
    print("lines refused per feature (a line may name several): "
          + ", ".join(f"{name} {count}" for name, count in by_feature.most_common()))
    print("lines refused by that feature alone: " + ", ".join(f"{name} {count}" for name, count in only.most_common()))
    assert not unclear, "problems that name no verl feature (add it to verl_features or fix the line):\n" + "\n".join(unclear)
    assert accepted >= ACCEPTED_FLOOR, f"{accepted} lines accepted, fewer than the floor {ACCEPTED_FLOOR}"
