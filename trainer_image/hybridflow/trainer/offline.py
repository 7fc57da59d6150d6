"""The offline training loop shared by SFT and DPO: `OfflineTrainer.fit()` on one Ray worker group.

    resume -> (validate) -> [next batch -> update -> (validate) -> log -> (checkpoint)] x total steps

The driver holds the data loader and moves batches to the `OfflineWorker` group (FSDP2 over
`trainer.nnodes x trainer.n_gpus_per_node` processes); the recipe decides only the dataset, the loss and
how per-row statistics become metrics. The loop is the RL trainer's (`trainer.loop.StepLoop`), with verl's SFT
rule of validating and checkpointing the last step always. Checkpoints, resume, SIGTERM and the loggers (console, JSONL,
TensorBoard, W&B, Prometheus, the operator's progress record) are those of the RL trainer:
`<default_local_dir>/global_step_N/{actor/, trainer_state.json}`, committed atomically.

Command line (`fsdp_sft_trainer`, `fsdp_dpo_trainer`): `python -m MODULE [config.yaml] [key=value ...]`.
Exit codes: 0 done (also after a SIGTERM-triggered checkpoint), 2 invalid config or inputs, 1 failure.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from hybridflow._config.offline import OfflineConfig, OfflineRecipe, load_offline_config
from hybridflow.config import ConfigError
from hybridflow.trainer.loop import StepLoop

MODULES = {"sft": "hybridflow.trainer.fsdp_sft_trainer", "dpo": "hybridflow.trainer.fsdp_dpo_trainer"}


class StartupError(RuntimeError):
    """The run cannot start: its inputs (model, tokenizer, data) are unusable; the message says why."""


class OfflineTrainer(StepLoop):
    """Drive one SFT or DPO run over a prepared worker group and data loaders."""

    def __init__(
        self, config: OfflineConfig, workers: Any, train_loader: Any, val_loader: Any = None,
        log: Callable[[str], None] = print,
    ) -> None:
        from hybridflow.engines.offline import SUMMARIZERS

        self.config = config
        self.workers = workers
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.log = log
        self.summarize = SUMMARIZERS[config.recipe]
        self.total_training_steps = total_training_steps(config, len(train_loader))
        self._init_loop(config.trainer.default_local_dir, train_loader)

    def train_step(self) -> dict[str, float]:
        """One optimizer step over the next batch; verl-style `train/*`, `timing_s/*`, `perf/*` metrics."""
        from hybridflow.trainer.metrics import reduce_worker_metrics

        batch = self._next_batch()
        started = time.perf_counter()
        output = self.workers.train_batch(batch)
        seconds = time.perf_counter() - started
        step = reduce_worker_metrics(output.meta_info.get("metrics", {}))
        tokens = sum(float(t.sum()) for k, t in batch.batch.items() if k.endswith("attention_mask"))
        metrics = {f"train/{k}": v for k, v in {**self.summarize(output.batch), **step}.items()}
        metrics.update({
            "timing_s/step": seconds,
            "perf/total_num_tokens": tokens,
            "perf/time_per_step": seconds,
            "perf/throughput": tokens / max(seconds, 1e-9) / self.workers.world_size,
            "training/global_step": float(self.global_step),
            "training/epoch": float(self.train_loader.epoch),
        })
        return metrics

    def validate(self) -> dict[str, float]:
        """The objective's metrics over the whole validation set, as `val/*`."""
        from hybridflow.protocol import DataProto

        outputs = [self.workers.eval_batch(batch) for batch in self.val_loader]
        return {f"val/{k}": v for k, v in self.summarize(DataProto.concat(outputs).batch).items()}

    # ---- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self) -> str:
        """Write the model and trainer state of this step, commit it, then apply retention."""
        from hybridflow import checkpoint as ck

        step_uri = ck.step_dir(self.ckpt_root, self.global_step)
        self.workers.save_checkpoint(f"{step_uri}/actor")
        ck.save_trainer_state(step_uri, ck.TrainerState(
            global_step=self.global_step,
            dataloader=self.train_loader.state_dict(),
            rng=ck.capture_rng_state(),
            wandb_run_id=self.tracker.wandb_run_id if self.tracker else None,
        ))
        ck.commit_step(self.ckpt_root, self.global_step)
        if self.tracker is not None:
            self.tracker.checkpoint_saved(self.global_step, step_uri)
        ck.apply_retention(self.ckpt_root, self.config.trainer.max_ckpt_to_keep, log=self.log)
        return step_uri

    def _resume(self) -> Any:
        """Load the step trainer.resume_mode chooses; its trainer state, or None on a fresh start."""
        from hybridflow import checkpoint as ck

        trainer = self.config.trainer
        latest = ck.find_latest_committed(self.ckpt_root, log=self.log) if trainer.resume_mode == "auto" else None
        step_uri = ck.resolve_resume_path(trainer.resume_mode, trainer.resume_from_path, self.ckpt_root, latest)
        if step_uri is None:
            return None
        if trainer.resume_mode == "resume_path":
            ck.check_resumable(step_uri)
        state = ck.load_trainer_state(step_uri)
        self.workers.load_checkpoint(f"{step_uri}/actor")
        self.train_loader.load_state_dict(state.dataloader)
        ck.restore_rng_state(state.rng)
        self.global_step = state.global_step
        self.log(f"resumed from {step_uri} (global step {self.global_step})")
        return state

    # ---- helpers --------------------------------------------------------------------------------

    def _can_validate(self) -> bool:
        return self.val_loader is not None

    def _due(self, freq: int | None, last: bool) -> bool:
        """verl's SFT trainer rule: every `freq` steps (when > 0) and always at the last step."""
        return last or bool(freq and freq > 0 and self.global_step % freq == 0)


def total_training_steps(config: OfflineConfig, batches_per_epoch: int) -> int:
    """trainer.total_training_steps when set, else epochs x batches per epoch (verl's rule)."""
    if config.trainer.total_training_steps:
        return int(config.trainer.total_training_steps)
    return int(config.trainer.total_epochs) * batches_per_epoch


# ---- building the run -------------------------------------------------------------------------------


def load_tokenizer(config: OfflineConfig) -> Any:
    """The model's tokenizer, with data.chat_template in place of its own when set."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        config.model.partial_pretrain, trust_remote_code=config.model.trust_remote_code
    )
    if config.data.chat_template:
        tokenizer.chat_template = config.data.chat_template
    return tokenizer


def build_data(config: OfflineConfig, tokenizer: Any) -> tuple[Any, Any]:
    """Training loader (stateful, for exact resume) and validation loader (None without val_files)."""
    from hybridflow.data import StatefulDataLoader
    from hybridflow.data.preference import PreferenceDataset
    from hybridflow.data.sft_dataset import SFTDataset

    dataset: type[SFTDataset] | type[PreferenceDataset] = SFTDataset if config.recipe == "sft" else PreferenceDataset
    train = StatefulDataLoader.from_config(config, dataset.from_config(config.data, tokenizer, "train"))
    val = None
    if config.data.val_files:
        val_set = dataset.from_config(config.data, tokenizer, "val")
        # A few micro-batches per process per call: the whole set is scored, never all of it in one message.
        size = min(len(val_set), 8 * config.data.micro_batch_size_per_gpu * config.world_size)
        val = StatefulDataLoader(val_set, size, shuffle=False, drop_last=False)
    return train, val


def build_worker_group(config: OfflineConfig, total_steps: int) -> Any:
    """The `OfflineWorker` group: one process per slot of nnodes x n_gpus_per_node, models loaded."""
    from hybridflow.controller import RayClassWithInitArgs, RayWorkerGroup, ResourcePoolManager
    from hybridflow.workers.cpu_slots import cpu_share
    from hybridflow.workers.offline_worker import OfflineWorker

    on_gpu = config.trainer.device == "cuda"
    manager = ResourcePoolManager(
        {"global_pool": [config.trainer.n_gpus_per_node] * config.trainer.nnodes},
        {config.recipe: "global_pool"},
        use_gpu=on_gpu,
        cpus_per_process=1.0 if on_gpu else cpu_share(config),  # duck-typed: reads trainer.* only
        max_colocate_count=1,
    )
    group = RayWorkerGroup(
        manager.get_resource_pool(config.recipe), RayClassWithInitArgs(OfflineWorker, config=config),
        name_prefix=config.recipe,
    )
    try:
        group.init_model(total_steps)
    except Exception:
        shutdown(group)
        raise
    return group


def shutdown(group: Any) -> None:
    """Kill the group's actors and free its placement groups (a later run in this Ray can start)."""
    group.shutdown()
    group.resource_pool.release()


def run(config: OfflineConfig) -> int:
    """Build everything and train; returns the last completed global step."""
    from hybridflow.trainer.main_ppo import init_ray

    try:
        tokenizer = load_tokenizer(config)
        train_loader, val_loader = build_data(config, tokenizer)
    except (OSError, ValueError, KeyError) as exc:  # bad paths, unreadable or unusable rows, missing columns
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        raise StartupError(message) from exc
    init_ray(config)  # duck-typed: reads trainer.ray_init only
    group = build_worker_group(config, total_training_steps(config, len(train_loader)))
    try:
        return OfflineTrainer(config, group, train_loader, val_loader).fit()
    finally:
        shutdown(group)


def parse_command_line(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """The YAML path (the first argument without '=', or None) and the overrides after it."""
    args = list(argv)
    if args and "=" not in args[0] and not args[0].startswith(("~", "+")):
        return args[0], args[1:]
    return None, args


def main(argv: Sequence[str] | None, recipe: OfflineRecipe, doc: str | None = None) -> int:
    """CLI of an offline trainer: parse, validate, run; print problems and exit 2 on invalid input."""
    usage = f"usage: python -m {MODULES[recipe]} [config.yaml] [key=value ...]"
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("-h", "--help"):
        print(usage + "\n\n" + (doc or __doc__ or ""))
        return 0
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        print(f"error: started by torchrun; run `python -m {MODULES[recipe]}` once instead: it starts its own "
              "trainer.nnodes x trainer.n_gpus_per_node worker processes on Ray", file=sys.stderr)
        return 2
    try:
        path, overrides = parse_command_line(args)
        config = load_offline_config(path, overrides, recipe)
        config.validate_for_run()
    except ConfigError as exc:
        from hybridflow.trainer.main_ppo import print_config_problems

        print_config_problems(exc)
        return 2
    except FileNotFoundError as exc:
        print(f"{exc}; pass an existing YAML file. {usage}", file=sys.stderr)
        return 2
    from hybridflow.checkpoint import CheckpointError

    try:
        step = run(config)
    except (StartupError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"training finished at global step {step}; checkpoints under {config.trainer.default_local_dir}")
    return 0
