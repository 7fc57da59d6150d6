"""The single-controller RL loop: `RayPPOTrainer.fit()` reads like the algorithm, one phase per method.

    generate -> reward model (when enabled) -> reward -> old log-probs -> ref log-probs -> values -> advantages
    -> critic update -> actor update (pushes weights to the rollout) -> (validate) -> log -> (checkpoint)

The loop around the steps (resume, validation and checkpoint cadence, logging, SIGTERM) is `StepLoop`'s, shared
with the SFT and DPO trainer.

The worker groups do the heavy lifting in Ray actors; this class only moves `DataProto` batches between
them and applies the pure math in `batch_ops`. Supported estimators are whatever the algorithm
registry holds (GAE with a critic, GRPO, Dr.GRPO, RLOO, REINFORCE++, ReMax, ...), all called the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hybridflow import checkpoint as ck
from hybridflow.algorithms import filter_groups, get_kl_controller
from hybridflow.profiling import StepProfiler
from hybridflow.protocol import DataProto
from hybridflow.trainer import batch_ops
from hybridflow.trainer.loop import StepLoop
from hybridflow.trainer.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    reduce_worker_metrics,
    timed,
)

GEN_INPUT_KEYS = ["input_ids", "attention_mask", "position_ids"]


@dataclass
class WorkerGroups:
    """The groups the loop drives: actor(+rollout+ref), optionally a critic, a reward model and a split-off rollout."""

    actor_rollout: Any
    critic: Any = None
    rollout: Any = None  # split placement only; None when the rollout lives in the actor's processes
    reward_model: Any = None  # reward_model.enable only
    rollout_service: Any = None  # rollout.mode=async: replicas + router + agent loops (`RolloutService`)
    teacher: Any = None  # distillation.enabled: the frozen teacher (`TeacherWorker`)

    @property
    def world_size(self) -> int:
        """Number of actor processes (used to normalise throughput)."""
        return int(self.actor_rollout.world_size)

    def shutdown(self) -> None:
        """Kill every group's actors and free their placement groups (a later run in this Ray can start)."""
        if self.rollout_service is not None:
            self.rollout_service.shutdown()
        for group in (self.actor_rollout, self.critic, self.rollout, self.reward_model, self.teacher):
            if group is not None:
                group.shutdown()
                group.resource_pool.release()


def retained_steps(trainer_cfg: Any, with_critic: bool) -> int | None:
    """Checkpoints to keep: max_actor_ckpt_to_keep, or max_critic_ckpt_to_keep when a critic is saved
    and that is smaller (a step folder holds both, so they are kept or removed together); None: all."""
    limits = [trainer_cfg.max_actor_ckpt_to_keep, trainer_cfg.max_critic_ckpt_to_keep if with_critic else None]
    kept = [n for n in limits if n is not None and n > 0]
    return min(kept) if kept else None


def needs_old_log_prob_pass(config: Any) -> bool:
    """Whether a step needs the actor's log-probs of the batch before its update (verl's old_log_prob).

    Not when the update is on-policy, i.e. one PPO epoch over one mini-batch (ppo_mini_batch_size
    >= train_batch_size), and no KL-in-reward reads them: the actor then uses its own detached
    log-probs, the same loss and gradient (see `hybridflow.engines.actor`), and a step saves one
    forward pass over the batch. Online DPO's weights read them too.
    """
    actor = config.actor_rollout_ref.actor
    correction = config.algorithm.rollout_correction
    if correction.bypass_mode:  # the rollout's log-probs are pi_old (`use_rollout_log_probs`)
        return False
    if correction.enabled or config.async_training.enabled:  # decoupled: pi_old != pi_rollout, both needed
        return True
    on_policy = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size >= config.data.train_batch_size
    reads_them = (  # the optimal token baselines read sum_pi_squared, which the same pass computes
        config.algorithm.use_kl_in_reward or config.algorithm.adv_estimator == "online_dpo"
        or actor.calculate_sum_pi_squared
    )
    return not on_policy or bool(reads_them)


class RayPPOTrainer(StepLoop):
    """Drive one RL run over prepared worker groups, data loaders and reward functions."""

    def __init__(
        self,
        config: Any,
        tokenizer: Any,
        workers: WorkerGroups,
        train_dataloader: Any,
        reward_fn: Callable[..., Any],
        val_dataloader: Any = None,
        val_reward_fn: Callable[..., Any] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.workers = workers
        self.train_dataloader = train_dataloader
        self.val_dataloader = val_dataloader
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn or reward_fn
        self.log = log
        self.algo = config.algorithm
        self.use_critic = workers.critic is not None
        self.use_rm = workers.reward_model is not None
        self.use_reference = config.ref_enabled
        self.kl_ctrl = get_kl_controller(self.algo.kl_ctrl) if self.algo.use_kl_in_reward else None
        self.recompute_old_log_prob = needs_old_log_prob_pass(config)
        self.correction = config.algorithm.rollout_correction
        # Asynchronous training: batches come from the rollout stream, generated while the trainer updates
        self.streaming = config.async_training.enabled
        self.actor_version = 0  # actor updates the current weights have seen (the policy version)
        self._stream_state: tuple[dict[str, Any], list[DataProto]] | None = None
        self.total_training_steps = compute_total_training_steps(config, len(train_dataloader))
        self._profiler: StepProfiler | None = None
        self._init_loop(config.trainer.default_local_dir, train_dataloader)

    # ---- the loop -------------------------------------------------------------------------------

    def _start(self, state: Any) -> None:
        self.actor_version = self.global_step
        if self.streaming:
            self._start_stream()
        else:
            self._sync_rollout_weights()  # a separate rollout (split group, server replicas) starts with the actor's weights
        self._profiler = StepProfiler(self.config, self._groups(), log=self.log)  # global_profiler.steps (tool=torch)

    def _run_step(self) -> dict[str, float]:
        self._profiler.before_step(self.global_step)
        metrics = self.train_step()
        self._profiler.after_step(self.global_step)
        return metrics

    def _finish(self) -> None:
        if self._profiler is not None:
            self._profiler.close()  # a trace still running (the run stopped inside a profiled window) is written

    def _can_validate(self) -> bool:
        return self.val_dataloader is not None

    def train_step(self) -> dict[str, float]:
        """One RL iteration; returns the step's metrics (verl names)."""
        metrics: dict[str, float] = {}
        timings: dict[str, float] = {}
        with timed("step", timings):
            batch = self.rollout(metrics, timings)
            if self.config.trainer.balance_batch:
                batch, balance = batch_ops.balance_batch(batch, self.workers.world_size)
                metrics.update(balance)
            if self.recompute_old_log_prob:
                with timed("old_log_prob", timings):
                    batch = self.compute_old_log_probs(batch, metrics)
            elif self.correction.bypass_mode:
                batch = self.use_rollout_log_probs(batch)
            if self.recompute_old_log_prob and (self.correction.enabled or "rollout_log_probs" in batch.batch):
                batch = self.correct_rollout(batch, metrics)
            if self.use_reference:
                with timed("ref", timings):
                    batch = self.compute_ref_log_probs(batch)
            if self.workers.teacher is not None:
                with timed("teacher", timings):
                    batch = self.compute_teacher_log_probs(batch, metrics)
            if self.use_critic:
                with timed("values", timings):
                    batch = self.compute_values(batch)
            with timed("adv", timings):
                batch = self.compute_advantages(batch, metrics)
            if self.use_critic:
                with timed("update_critic", timings):
                    metrics.update(self.update_critic(batch))
            if self.global_step > self.config.trainer.critic_warmup:
                with timed("update_actor", timings):
                    metrics.update(self.update_actor(batch))
        metrics.update(compute_data_metrics(batch, self.use_critic))
        self._update_curriculum(batch)
        metrics.update(compute_timing_metrics(timings))
        metrics.update(compute_throughput_metrics(batch, timings["step"], self.workers.world_size))
        metrics["training/global_step"] = float(self.global_step)
        metrics["training/epoch"] = float(self._epoch())
        return metrics

    # ---- phases ---------------------------------------------------------------------------------

    def rollout(self, metrics: dict[str, float], timings: dict[str, float]) -> DataProto:
        """Generate and score a batch; with DAPO dynamic sampling, keep only informative groups.

        Dynamic sampling (Yu et al. 2025, arXiv 2503.14476, section 3.2) draws more prompt batches
        until `train_batch_size` groups have a non-zero reward spread, at most `max_num_gen_batches`.
        """
        filter_cfg = self.algo.filter_groups
        if not (filter_cfg and filter_cfg.enable):
            batch, _ = self._generate_and_score(metrics, timings)
            return batch
        wanted = self.config.data.train_batch_size
        kept: list[DataProto] = []
        kept_groups = 0
        num_gen_batches = 0
        while kept_groups < wanted:
            num_gen_batches += 1
            max_batches = filter_cfg.max_num_gen_batches
            if max_batches and max_batches > 0 and num_gen_batches > max_batches:
                raise RuntimeError(
                    f"dynamic sampling drew {max_batches} prompt batches and found only {kept_groups} of "
                    f"{wanted} groups whose '{filter_cfg.metric}' varies; the data is too easy or too hard for "
                    "the model. Raise algorithm.filter_groups.max_num_gen_batches (0 = unlimited), "
                    "increase actor_rollout_ref.rollout.n, or disable algorithm.filter_groups."
                )
            batch, extra = self._generate_and_score(metrics, timings)
            values = batch_ops.group_filter_metric(batch, filter_cfg.metric, extra)
            result = filter_groups(batch.non_tensor_batch["uid"], values, ignore=batch_ops.cut_rows(batch))
            if result.kept_uids:
                kept.append(batch.select_idxs(result.kept_mask))
                kept_groups += len(result.kept_uids)
        metrics["train/num_gen_batches"] = float(num_gen_batches)
        return batch_ops.truncate_groups(DataProto.concat(kept), wanted)

    def _generate_and_score(
        self, metrics: dict[str, float], timings: dict[str, float]
    ) -> tuple[DataProto, dict[str, list[Any]]]:
        if self.streaming:  # generated while earlier steps trained; "gen" is the time the trainer waited
            with timed("gen", timings):
                batch, stream_metrics = self.workers.rollout_service.take(
                    self.config.data.train_batch_size, self.actor_version
                )
            metrics.update(stream_metrics)
        else:
            batch = batch_ops.add_group_ids(self._next_batch())
            with timed("gen", timings):
                batch = self.generate(batch)
        metrics.update(batch.meta_info.pop("metrics", {}))  # server mode: turns, tool calls, aborted
        if self.use_rm:
            with timed("rm", timings):
                batch = self.compute_rm_scores(batch)
        with timed("reward", timings):
            extra = self.score(batch, metrics)
        return batch, extra

    def generate(self, batch: DataProto) -> DataProto:
        """Sample `rollout.n` responses per prompt (ReMax also a greedy baseline) and join them to the batch."""
        n = self.config.actor_rollout_ref.rollout.n
        gen_input = self._gen_input(batch)
        gen_input.meta_info.update({"do_sample": True, "global_step": self.global_step})
        if self.algo.adv_estimator == "remax":
            batch.batch["reward_baselines"] = self._greedy_baseline(batch, gen_input)
        output = self._rollout_group().generate_sequences(gen_input.repeat(n, interleave=True))
        batch.meta_info["metrics"] = output.meta_info.pop("metrics", {})
        batch = batch.repeat(n, interleave=True)
        for key in GEN_INPUT_KEYS:
            batch.batch.pop(key)
        batch = batch.union(output)
        batch.batch["response_mask"] = batch_ops.response_mask_of(batch)
        return batch

    def _gen_input(self, batch: DataProto) -> DataProto:
        """What the rollout reads: the prompt tensors and ids; agent loops also get every dataset field."""
        if self.workers.rollout_service is not None:
            return batch.select(batch_keys=GEN_INPUT_KEYS, non_tensor_batch_keys=list(batch.non_tensor_batch))
        return batch.select(batch_keys=GEN_INPUT_KEYS,
                            non_tensor_batch_keys=_present(batch, ["raw_prompt_ids", "multi_modal_data"]))

    def _greedy_baseline(self, batch: DataProto, gen_input: DataProto) -> torch.Tensor:
        """ReMax's baseline (Li et al. 2023): the reward of the greedy response to each prompt."""
        greedy_input = gen_input.select(deepcopy=True)
        greedy_input.meta_info.update({"do_sample": False})
        greedy = self._rollout_group().generate_sequences(greedy_input)
        greedy.meta_info.pop("metrics", None)
        scored = batch.select(batch_keys=[], non_tensor_batch_keys=list(batch.non_tensor_batch)).union(
            greedy.select(
                batch_keys=["responses", "prompts", "attention_mask"] + _present(greedy, ["response_mask"])
            )
        )
        if self.use_rm:
            greedy_rm = scored.union(greedy.select(batch_keys=["input_ids", "position_ids"]))
            scored = scored.union(self.workers.reward_model.compute_rm_score(greedy_rm))
        result = self.reward_fn(scored, return_dict=True)
        return result["reward_tensor"].sum(-1)

    def compute_rm_scores(self, batch: DataProto) -> DataProto:
        """The reward model's `rm_scores` (b, R) joined to the batch; the reward manager then returns them."""
        keys = ["input_ids", "attention_mask", "position_ids", "responses"] + _present(batch, ["response_mask"])
        rm_input = batch.select(batch_keys=keys, non_tensor_batch_keys=_present(batch, ["raw_prompt"]))
        return batch.union(self.workers.reward_model.compute_rm_score(rm_input))

    def score(self, batch: DataProto, metrics: dict[str, float] | None = None) -> dict[str, list[Any]]:
        """Reward-model, rule or custom scores into `token_level_scores` (and `token_level_rewards` without KL).

        The reward manager's counts (`reward/timeouts`, `reward/errors`) are added to ``metrics``: summed
        over the batches of a step when dynamic sampling draws several.
        """
        result = self.reward_fn(batch, return_dict=True)
        if metrics is not None:
            batch_ops.add_counts(metrics, result.get("reward_metrics", {}))
        batch.batch["token_level_scores"] = result["reward_tensor"]
        if not self.algo.use_kl_in_reward:
            batch.batch["token_level_rewards"] = result["reward_tensor"]
        extra = result.get("reward_extra_info", {})
        for key, values in extra.items():
            batch.non_tensor_batch[f"reward_extra/{key}"] = np.array(values, dtype=object)
        return extra

    def compute_old_log_probs(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        """Log-probs of the sampled responses under the current actor (the PPO ratio's denominator)."""
        output = self.workers.actor_rollout.compute_log_prob(batch)
        entropys = output.batch.pop("entropys", None)
        if entropys is not None:
            metrics["actor/entropy"] = float(
                (entropys * batch.batch["response_mask"]).sum()
                / batch.batch["response_mask"].sum().clamp(min=1)
            )
        return batch.union(output)

    def use_rollout_log_probs(self, batch: DataProto) -> DataProto:
        """Bypass mode: the engine's log-probs are pi_old, so the PPO ratio is taken against the policy that
        drew the samples (however many versions old) and no recomputation pass runs."""
        batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"].clone()
        return batch

    def correct_rollout(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        """Decoupled mode: importance weights pi_old / pi_rollout and rejection masks (algorithm.rollout_correction),
        and the `rollout_corr/*` diagnostics of how far the two policies are apart."""
        if "rollout_log_probs" not in batch.batch:
            raise KeyError(
                "algorithm.rollout_correction needs the rollout's log-probs, but the rollout returned none; set "
                "actor_rollout_ref.rollout.calculate_log_probs=true"
            )
        metrics.update(batch_ops.apply_rollout_correction(batch, self.correction))
        return batch

    def compute_ref_log_probs(self, batch: DataProto) -> DataProto:
        """Log-probs under the frozen reference policy (for the KL loss or KL-in-reward)."""
        return batch.union(self.workers.actor_rollout.compute_ref_log_prob(batch))

    def compute_teacher_log_probs(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        """On-policy distillation: the teacher's log-probs of the student's samples, and the per-token
        divergence they give (the advantage's distillation term, folded in by compute_advantages)."""
        if "old_log_probs" not in batch.batch:  # an on-policy update skipped that pass; D_t reads the student's
            batch = self.compute_old_log_probs(batch, metrics)
        batch = batch.union(self.workers.teacher.compute_teacher_log_prob(batch))
        metrics.update(batch_ops.apply_distillation(batch, self.config.distillation.distillation_loss))
        return batch

    def compute_values(self, batch: DataProto) -> DataProto:
        """Critic values per response token (PPO with GAE)."""
        return batch.union(self.workers.critic.compute_values(batch))

    def compute_advantages(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        """KL-shaped rewards if configured, then advantages/returns from the configured estimator."""
        if self.kl_ctrl is not None:
            metrics.update(batch_ops.apply_kl_in_reward(batch, self.kl_ctrl, self.algo.kl_penalty))
        if self.algo.adv_estimator == "online_dpo":
            metrics.update(batch_ops.online_dpo_metrics(batch, self.algo.dpo_beta))
        return batch_ops.compute_advantage(batch, self.algo)

    def update_critic(self, batch: DataProto) -> dict[str, float]:
        """One critic update (value loss); returns the worker's metrics."""
        output = self.workers.critic.update_critic(batch)
        return reduce_worker_metrics(output.meta_info.get("metrics", {}))

    def update_actor(self, batch: DataProto) -> dict[str, float]:
        """One actor update (policy loss), then push the new weights to the rollout engine."""
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
        output = self.workers.actor_rollout.update_actor(batch)
        self.actor_version = self.global_step
        if not self.streaming:
            self._sync_rollout_weights()
        elif self.global_step % self.config.async_training.trigger_parameter_sync_step == 0:
            self.workers.rollout_service.publish_weights(self.workers.actor_rollout, self.actor_version)
        return reduce_worker_metrics(output.meta_info.get("metrics", {}))

    def _start_stream(self) -> None:
        """Asynchronous training: the replicas get the actor's weights, then the stream starts producing (from
        the checkpoint's stream state on resume)."""
        service = self.workers.rollout_service
        service.update_weights(self.workers.actor_rollout, version=self.actor_version)
        service.start_stream(self.train_dataloader, self.actor_version, self._stream_state)

    def _sync_rollout_weights(self) -> None:
        """Ship the actor's weights to a rollout outside its processes: server replicas (mode=async) or the
        split-placement group. Colocated engines got them inside update_actor already."""
        if self.workers.rollout_service is not None:
            self.workers.rollout_service.update_weights(self.workers.actor_rollout)
        elif self.workers.rollout is not None:
            from hybridflow.workers.weight_sync import sync_weights

            sync_weights(self.workers.actor_rollout, self.workers.rollout)

    def validate(self) -> dict[str, float]:
        """Greedy (val_kwargs) generation on the whole validation set; mean score per data source.

        With trainer.log_val_generations=N, N (input, output, score) samples go to the loggers: the
        same prompts every validation (a fixed choice), so their answers can be followed over training.
        """
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        n = val_kwargs.n
        scores: dict[str, list[float]] = {}
        samples: list[tuple[str, str, float]] = []
        reward_counts: dict[str, float] = {}
        for batch in self.val_dataloader:
            gen_input = self._gen_input(batch)
            gen_input.meta_info.update({"do_sample": val_kwargs.do_sample, "validate": True})
            output = self._rollout_group().generate_sequences(gen_input.repeat(n, interleave=True))
            output.meta_info.pop("metrics", None)
            batch = batch.repeat(n, interleave=True)
            for key in GEN_INPUT_KEYS:
                batch.batch.pop(key)
            batch = batch.union(output)
            if self.use_rm:
                batch = self.compute_rm_scores(batch)
            scored = self.val_reward_fn(batch, return_dict=True)
            batch_ops.add_counts(reward_counts, scored.get("reward_metrics", {}))
            seq_scores = scored["reward_tensor"].sum(-1).tolist()
            for source, value in zip(batch.non_tensor_batch["data_source"], seq_scores, strict=True):
                scores.setdefault(str(source), []).append(value)
            if self.config.trainer.log_val_generations > 0:
                samples += zip(*batch_ops.decode_samples(batch, self.tokenizer), seq_scores, strict=True)
        if samples and self.tracker is not None:
            chosen = batch_ops.pick_samples(samples, self.config.trainer.log_val_generations)
            self.tracker.log_generations(chosen, step=self.global_step)
        metrics = {
            f"val-core/{source}/reward/mean@{n}": float(np.mean(values)) for source, values in scores.items()
        }
        metrics.update({f"val-aux/{key}": value for key, value in reward_counts.items()})
        return metrics

    # ---- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self) -> str:
        """Write actor/critic/trainer state for this step, commit it, then apply retention."""
        step_uri = ck.step_dir(self.ckpt_root, self.global_step)
        self.workers.actor_rollout.save_checkpoint(f"{step_uri}/actor")
        if self.use_critic:
            self.workers.critic.save_checkpoint(f"{step_uri}/critic")
        extra: dict[str, Any] = {"kl_ctrl": self.kl_ctrl.state_dict()} if self.kl_ctrl is not None else {}
        if self.streaming:  # quiesce the stream; keep what it handed out but did not train (exact resume)
            stream_state, queued = self.workers.rollout_service.snapshot()
            try:
                ck.save_rollout_queue(step_uri, queued)
            except BaseException:
                self.workers.rollout_service.release()
                raise
            extra["async"] = {**stream_state, "actor_version": self.actor_version}
        try:
            self._save_trainer_state(step_uri, extra)
        finally:
            if self.streaming:
                self.workers.rollout_service.release()
        if self.tracker is not None:
            self.tracker.checkpoint_saved(self.global_step, step_uri)  # progress record, Prometheus
        ck.apply_retention(self.ckpt_root, retained_steps(self.config.trainer, self.use_critic), log=self.log)
        return step_uri

    def _save_trainer_state(self, step_uri: str, extra: dict[str, Any]) -> None:
        state = ck.TrainerState(
            global_step=self.global_step,
            dataloader=self.train_dataloader.state_dict(),
            rng=ck.capture_rng_state(),
            wandb_run_id=self.tracker.wandb_run_id if self.tracker else None,
            extra=extra,
        )
        ck.save_trainer_state(step_uri, state)
        ck.commit_step(self.ckpt_root, self.global_step)

    def _resume(self) -> ck.TrainerState | None:
        """Load the step chosen by trainer.resume_mode; return its trainer state, or None on a fresh start."""
        trainer_cfg = self.config.trainer
        latest = None
        if trainer_cfg.resume_mode == "auto":
            latest = ck.find_latest_committed(self.ckpt_root, log=self.log)
        step_uri = ck.resolve_resume_path(
            trainer_cfg.resume_mode, trainer_cfg.resume_from_path, self.ckpt_root, latest
        )
        if step_uri is None:
            return None
        if trainer_cfg.resume_mode == "resume_path":
            ck.check_resumable(step_uri)
        state = ck.load_trainer_state(step_uri)
        self.workers.actor_rollout.load_checkpoint(f"{step_uri}/actor")
        if self.use_critic:
            self.workers.critic.load_checkpoint(f"{step_uri}/critic")
        self.train_dataloader.load_state_dict(state.dataloader)
        ck.restore_rng_state(state.rng)
        if self.kl_ctrl is not None and "kl_ctrl" in state.extra:
            self.kl_ctrl.load_state_dict(state.extra["kl_ctrl"])
        if self.streaming and "async" in state.extra:
            stream_state = dict(state.extra["async"])
            stream_state.pop("actor_version", None)
            self._stream_state = (stream_state, ck.load_rollout_queue(step_uri))
        self.global_step = state.global_step
        self.log(f"resumed from {step_uri} (global step {self.global_step})")
        return state

    # ---- helpers --------------------------------------------------------------------------------

    def _groups(self) -> list[Any]:
        """The worker groups the step profiler drives (start_profile / stop_profile), server replicas included."""
        w = self.workers
        return [g for g in (w.actor_rollout, w.critic, w.rollout, w.reward_model, w.rollout_service) if g is not None]

    def _update_curriculum(self, batch: DataProto) -> None:
        """verl's curriculum sampler (data.sampler with update(batch)) sees each step's scored batch."""
        update = getattr(self.train_dataloader, "update_sampler", None)
        if update is not None and not self.streaming:
            update(batch)

    def _rollout_group(self) -> Any:
        if self.workers.rollout_service is not None:
            return self.workers.rollout_service
        return self.workers.rollout if self.workers.rollout is not None else self.workers.actor_rollout

    def _epoch(self) -> int:
        if self.streaming and self.workers.rollout_service.stream is not None:
            return int(self.workers.rollout_service.stream.epoch)
        state = self.train_dataloader.state_dict()
        return int(state.get("epoch", 0)) if isinstance(state, dict) else 0


def _present(batch: DataProto, keys: list[str]) -> list[str]:
    return [k for k in keys if k in batch.non_tensor_batch or k in batch.batch]


def compute_total_training_steps(config: Any, batches_per_epoch: int) -> int:
    """trainer.total_training_steps when set, else epochs x batches per epoch (verl's rule)."""
    if config.trainer.total_training_steps:
        return int(config.trainer.total_training_steps)
    return int(config.trainer.total_epochs) * batches_per_epoch
