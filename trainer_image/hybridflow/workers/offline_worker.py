"""The Ray worker of the offline trainers (SFT, DPO): thin set-up and dispatch around `OfflineLearner`.

One group of `trainer.nnodes x trainer.n_gpus_per_node` processes, FSDP2 over all of them (gloo on CPU,
NCCL on GPU), a single process unsharded. Batches are split by data-parallel rank; each method returns
per-row statistics as a DataProto (the dispatcher concatenates them in row order) and, for updates, the
step's lr and gradient norm in `meta_info["metrics"]`. Checkpoints use the RL actor's files and layout
(`hybridflow.workers.ckpt_io`) under `<step>/actor`, so resume and export work the same way.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow._config.offline import OfflineConfig
from hybridflow.controller import Dispatch, Worker, register
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.engines.offline import OfflineLearner, build_objective
from hybridflow.protocol import DataProto
from hybridflow.workers.ckpt_io import load_engine_checkpoint, save_engine_checkpoint
from hybridflow.workers.cpu_slots import cpu_threads


class OfflineWorker(Worker):
    """The trained model (and, for DPO, its frozen reference) on one rank."""

    def __init__(self, config: OfflineConfig) -> None:
        super().__init__()
        self.config = config
        if config.trainer.device == "cpu":
            torch.set_num_threads(cpu_threads(config))  # duck-typed: reads trainer.* only
        self.learner: OfflineLearner | None = None

    def _engine(self, **kwargs: Any) -> FSDPEngine:
        cfg = self.config
        if not cfg.model.partial_pretrain:
            raise ValueError("model.partial_pretrain is not set; point it at a Hugging Face model folder")
        return FSDPEngine(
            cfg.model.partial_pretrain, device=cfg.trainer.device, model_config=cfg.model,
            fsdp_config=cfg.model.fsdp_config, seed=cfg.trainer.seed,
            cpu_mixed_precision=cfg.trainer.cpu_mixed_precision, **kwargs,
        )

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        """Load the model with its optimizer (schedule over `total_steps`) and, for DPO, the frozen reference."""
        if self.world_size > 1:
            self.init_distributed("nccl" if self.config.trainer.device == "cuda" else "gloo")
        engine = self._engine(optim_config=self.config.optim, total_steps=total_steps, grad_clip=self.config.optim.clip_grad)
        self.learner = OfflineLearner(engine, build_objective(self.config.recipe, self.config, self._engine))

    def _require(self) -> OfflineLearner:
        if self.learner is None:
            raise RuntimeError("call init_model on the offline worker group first")
        return self.learner

    @register(Dispatch.DP_COMPUTE_PROTO)
    def train_batch(self, data: DataProto) -> DataProto:
        """One optimizer step on this rank's rows: per-row statistics, and lr / grad_norm in meta_info."""
        stats, step = self._require().update(data, self.config.data.micro_batch_size_per_gpu)
        return DataProto.from_dict(stats, meta_info={"metrics": step})

    @register(Dispatch.DP_COMPUTE_PROTO)
    def eval_batch(self, data: DataProto) -> DataProto:
        """Per-row statistics of this rank's rows, without gradients."""
        return DataProto.from_dict(self._require().evaluate(data, self.config.data.micro_batch_size_per_gpu))

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, dir_uri: str) -> None:
        """Write the model, optimizer and schedule under `dir_uri`; all ranks take part."""
        save_engine_checkpoint(self._require().engine, dir_uri, self.config.trainer.checkpoint.save_contents)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, dir_uri: str) -> None:
        """Restore from `dir_uri` (any world size wrote it)."""
        contents = self.config.trainer.checkpoint.load_contents or self.config.trainer.checkpoint.save_contents
        load_engine_checkpoint(self._require().engine, dir_uri, contents)
