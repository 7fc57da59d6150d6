"""The `distillation` config group: verl's keys, what is refused (with the fix) and the start-up notes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.config import ConfigError, load_config, parse_config
from hybridflow.trainer.main_ppo import load_run_config
from hybridflow.workers.teacher_worker import vocabulary_problem

RUN = ["actor_rollout_ref.model.path=/student", "data.train_files=/d/train.parquet"]
OPD = [
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=4",
    "distillation.enabled=true",
    "distillation.teacher_models.teacher_model.model_path=/teacher",
    "distillation.distillation_loss.loss_mode=k1",
    "distillation.distillation_loss.use_policy_gradient=true",
]

#: The distillation overrides of verl's examples/on_policy_distillation_trainer/run_qwen3_8b_fsdp.sh, minus the
#: separate teacher pool (distillation.nnodes, refused below).
VERL_RECIPE = [
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "actor_rollout_ref.rollout.n=1",
    "distillation.enabled=True",
    "distillation.n_gpus_per_node=4",
    "distillation.teacher_models.teacher_model.model_path=Qwen/Qwen3-32B",
    "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=2",
    "distillation.teacher_models.teacher_model.inference.name=vllm",
    "distillation.teacher_models.teacher_model.inference.gpu_memory_utilization=0.4",
    "distillation.distillation_loss.loss_mode=k1",
    "distillation.distillation_loss.topk=64",
    "distillation.distillation_loss.use_task_rewards=False",
    "distillation.distillation_loss.use_policy_gradient=True",
    "distillation.distillation_loss.loss_max_clamp=10.0",
    "distillation.distillation_loss.log_prob_min_clamp=-10.0",
]


def _problems(*overrides: str) -> list[str]:
    try:
        load_run_config([*RUN, *overrides])
    except ConfigError as exc:
        return exc.problems
    return []


def test_off_by_default_with_verls_defaults() -> None:
    d = load_config(None, []).distillation
    assert not d.enabled and d.nnodes == 0 and list(d.teacher_models) == ["teacher_model"]
    loss = d.distillation_loss
    assert (loss.loss_mode, loss.use_task_rewards, loss.use_policy_gradient) == ("k3", True, False)


def test_verls_recipe_runs_with_notes_for_what_has_no_effect() -> None:
    cfg, notes = load_run_config([*RUN, *VERL_RECIPE])
    assert cfg.distillation.teacher.model_path == "Qwen/Qwen3-32B"
    assert cfg.distillation.replaces_task_advantages
    (note,) = notes
    for key in ("distillation.n_gpus_per_node=4", "teacher_model.inference (", "distillation_loss.topk=64"):
        assert key in note


def test_a_valid_task_reward_mix() -> None:
    assert _problems(*OPD, "distillation.distillation_loss.distillation_loss_coef=0.5") == []


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["distillation.teacher_models.teacher_model.model_path=null"],
         "distillation.teacher_models.teacher_model.model_path: required when distillation.enabled is true; set it"),
        (["distillation.distillation_loss.use_policy_gradient=false"],
         "distillation.distillation_loss.use_policy_gradient: GKD on-policy distillation (use_policy_gradient=false"),
        (["distillation.nnodes=1"],
         "distillation.nnodes: a separate teacher resource pool (distillation.nnodes > 0, served teacher replicas) is "
         "not built in HybridFlow yet; remove distillation.nnodes"),
        (["+distillation.teacher_models.math.model_path=/t2"],
         "distillation.teacher_models: multi-teacher distillation (several teacher_models routed by teacher_key) is "
         "not built in HybridFlow yet; keep one entry, distillation.teacher_models.teacher_model (got teacher_model, math)"),
        (["distillation.distillation_loss.loss_mode=forward_kl_topk"],
         "distillation.distillation_loss.loss_mode: top-k distillation losses (the teacher's top-k log-probs per "
         "position) is not built in HybridFlow yet; use loss_mode=k1"),
        (["distillation.distillation_loss.clip_ratio_high=0.28"],
         "distillation.distillation_loss.clip_ratio_high: 0.28 differs from actor_rollout_ref.actor.clip_ratio_high=0.2"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
         "actor_rollout_ref.actor.policy_loss.loss_mode: distillation's per-token advantages need the vanilla PPO loss"),
        (["distillation.distillation_loss.use_task_rewards=false", "algorithm.use_kl_in_reward=true"],
         "algorithm.use_kl_in_reward: distillation.distillation_loss.use_task_rewards=false trains on the teacher's "
         "signal alone, so a KL penalty in the task reward has no effect; set use_kl_in_reward=false"),
        (["distillation.distillation_loss.use_task_rewards=false", "algorithm.adv_estimator=gae"],
         "critic.enable: distillation.distillation_loss.use_task_rewards=false trains on the teacher's signal alone, "
         "so the critic's values would train nothing; use a critic-free estimator"),
        (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n: grpo compares several responses per prompt"),
        (["distillation.distillation_loss.loss_mode=k3"],
         "distillation.distillation_loss.loss_mode: k3 as a per-token reward does not follow the reverse KL (only k1's "
         "policy gradient is the gradient of KL(student || teacher)); set loss_mode=k1"),
    ],
)
def test_refused_with_what_to_do(overrides: list[str], expected: str) -> None:
    found = _problems(*OPD, *overrides)
    assert any(p.startswith(expected) for p in found), found


def test_a_teacher_must_cover_the_students_vocabulary() -> None:
    assert vocabulary_problem(151936, 151936, "k") is None
    assert vocabulary_problem(152064, 151936, "k") is None  # a padded embedding is fine
    assert "k: the teacher's vocabulary (32000 tokens) is smaller than the student's (151936)" in str(
        vocabulary_problem(32000, 151936, "k")
    )


def test_the_examples_run_verls_pg_opd_recipe() -> None:
    """examples/tiny_distill.yaml and rljob_opd_gsm8k_qwen.yaml: k1, policy gradient, the teacher's signal alone."""
    import yaml

    examples = Path(__file__).resolve().parents[2] / "examples"
    tiny, _ = load_run_config([str(examples / "tiny_distill.yaml")])
    job = yaml.safe_load((examples / "rljob_opd_gsm8k_qwen.yaml").read_text())
    gpu = parse_config(job["spec"]["config"])
    for cfg in (tiny, gpu):
        loss = cfg.distillation.distillation_loss
        assert cfg.distillation.enabled and cfg.distillation.replaces_task_advantages
        assert (loss.loss_mode, loss.use_policy_gradient, loss.loss_max_clamp, loss.log_prob_min_clamp) == (
            "k1", True, 10.0, -10.0)
    student, teacher = gpu.actor_rollout_ref.model.path, gpu.distillation.teacher.model_path
    assert student.startswith("Qwen/Qwen2.5-") and teacher.startswith("Qwen/Qwen2.5-")  # one tokenizer
    assert gpu.actor_rollout_ref.actor.ppo_mini_batch_size == gpu.data.train_batch_size  # on-policy: D_t as verl's


def test_status_and_console_show_the_reverse_kl_to_the_teacher() -> None:
    from hybridflow.progress import summarize_metrics

    assert summarize_metrics({"actor/ppo_kl": 0.01, "actor/distillation/loss": 1.5})["kl"] == 1.5
    assert summarize_metrics({"actor/kl_loss": 0.2, "actor/distillation/loss": 1.5})["kl"] == 0.2  # the reference's


def test_the_teacher_is_checked_from_its_config_before_any_weight_loads(tmp_path: Path) -> None:
    from hybridflow.models.tiny import build_tiny_config
    from hybridflow.workers.teacher_worker import teacher_problem

    for name, vocab in (("student", 120), ("teacher", 120), ("small", 100)):
        build_tiny_config("qwen2", vocab_size=vocab).save_pretrained(tmp_path / name)

    def problem(teacher: str) -> str | None:
        cfg, _ = load_run_config([f"actor_rollout_ref.model.path={tmp_path / 'student'}", "data.train_files=/d",
                                  *OPD, f"distillation.teacher_models.teacher_model.model_path={teacher}"])
        return teacher_problem(cfg)

    assert problem(str(tmp_path / "teacher")) is None
    assert "vocabulary (100 tokens) is smaller than the student's (120)" in str(problem(str(tmp_path / "small")))
    missing = str(problem(str(tmp_path / "none")))
    assert missing.startswith("distillation.teacher_models.teacher_model.model_path: cannot read the teacher's config")
