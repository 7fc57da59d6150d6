"""Ray worker classes around the FSDP engines and the rollout engine (thin: set-up and dispatch only).

- `ActorRolloutRefWorker(config, role)`: role is any of `actor_rollout_ref`, `actor_rollout`,
  `actor_ref`, `actor`, `rollout`, `ref`. With actor and rollout in one process (colocated, verl's
  hybrid engine) the rollout gets the actor's full weights after every `update_actor` and
  `load_checkpoint`. A `rollout`-only group (split placement) gets weights from
  `hybridflow.workers.weight_sync.sync_weights(actor_wg, rollout_wg)`, which the trainer calls after
  each update.
- `CriticWorker(config)`: value model (`AutoModelForTokenClassification`, 1 label).

Batches: `generate_sequences` expects one row per sample (the trainer repeats prompts n times,
interleaved, before calling) unless `prompts.meta_info["n"]` asks this worker to repeat them.
Checkpoints (`save_checkpoint(dir_uri)` / `load_checkpoint(dir_uri)`): full, world-size-independent
state dicts gathered collectively on all ranks; rank 0 writes `model.pt` (LoRA: `lora_adapter/`),
`optimizer.pt`, `extra_state.pt` (lr scheduler) and `huggingface/` (config, tokenizer) under `dir_uri`
through fsspec (see `hybridflow.workers.ckpt_io`).

LoRA (`model.lora_rank > 0`): the reference policy is the actor's own engine with the adapter disabled,
so a `ref` role next to the actor builds no second model; every weight the rollout receives (colocated,
split group, server replicas through `full_state_dict_rank0`) is the merged model under HF names.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.config import HybridFlowConfig, parse_config
from hybridflow.controller import Dispatch, Worker, register
from hybridflow.engines.actor import LogProbKernels, PPOActor
from hybridflow.engines.critic import PPOCritic
from hybridflow.engines.fsdp_engine import FSDPEngine
from hybridflow.engines.lora import lora_enabled
from hybridflow.engines.ulysses import own_rows, shared_rows
from hybridflow.profiling import WorkerProfiler, profiled
from hybridflow.protocol import DataProto
from hybridflow.workers.ckpt_io import load_engine_checkpoint, save_engine_checkpoint
from hybridflow.workers.cpu_slots import cpu_threads

ROLES = {
    "actor_rollout_ref": {"actor", "rollout", "ref"},
    "actor_rollout": {"actor", "rollout"},
    "actor_ref": {"actor", "ref"},
    "actor": {"actor"},
    "rollout": {"rollout"},
    "ref": {"ref"},
}


def as_config(config: HybridFlowConfig | dict[str, Any]) -> HybridFlowConfig:
    """Accept the parsed config or its plain-dict form (what crosses process boundaries)."""
    return config if isinstance(config, HybridFlowConfig) else parse_config(config)


def per_rank(total: int, world_size: int, what: str) -> int:
    """Rows per rank of a global batch size, with an actionable error when it does not divide."""
    if total % world_size != 0 or total < world_size:
        raise ValueError(
            f"{what}={total} (responses) does not split over {world_size} data-parallel ranks; "
            f"make it a multiple of {world_size} (trainer.nnodes x trainer.n_gpus_per_node)"
        )
    return total // world_size


def log_prob_budget(role: Any) -> int | None:
    """The token budget of a role's log-prob micro-batches (rollout or ref), or None for fixed-size ones.

    The config has already filled null settings from the actor's (see `hybridflow.config`).
    """
    return role.log_prob_max_token_len_per_gpu if role.log_prob_use_dynamic_bsz else None


def sp_budget(budget: int | None, engine: FSDPEngine) -> int | None:
    """A per-GPU token budget in whole-sequence tokens: with Ulysses each rank holds 1/sp of every row (verl: x sp)."""
    return None if budget is None else budget * engine.sequence_parallel_size


class _DistributedWorker(Worker):
    """Shared set-up: config, device, torch.distributed (gloo on CPU, NCCL on GPU)."""

    def __init__(self, config: HybridFlowConfig | dict[str, Any]) -> None:
        super().__init__()
        self.config = as_config(config)
        self.device = self.config.trainer.device
        if self.device == "cpu":
            # One thread per core of this worker's slot (not Ray's OMP_NUM_THREADS, which counts the
            # actor's colocated share of the slot): workers sharing few cores do not oversubscribe
            # them, and one worker on a whole machine uses every core. Set before any vLLM engine
            # starts (vLLM-CPU turns torch.set_num_threads into a no-op afterwards).
            torch.set_num_threads(cpu_threads(self.config))
        self.profiler: WorkerProfiler | None = None

    #: the worker's role, for classes whose instances hold one of several (ActorRolloutRefWorker)
    role: str = ""

    @classmethod
    def profile_target(cls, role: str = "") -> tuple[tuple[str, ...], str]:
        """(the sub-roles whose profiler sections a worker of this class and `role` reads, the name its files
        carry): the worker's own profiler and the driver's nsys runtime env both read it. None by default."""
        return (), cls.__name__

    @register(Dispatch.ONE_TO_ALL)
    def start_profile(self, label: str) -> None:
        """Start this rank's torch.profiler trace of a profiled step (`label`: global_step_N), if it is chosen."""
        if self.profiler is None:
            subroles, name = self.profile_target(self.role)
            self.profiler = WorkerProfiler(self.config, subroles, self.rank, name)
        self.profiler.start(label)

    @register(Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> list[str]:
        """End the profiled step: write this rank's trace(s); returns their URIs."""
        return self.profiler.stop() if self.profiler is not None else []

    def _engine(self, path: str, **kwargs: Any) -> FSDPEngine:
        """An FSDP engine on this worker's device, with the run's CPU mixed-precision choice."""
        return FSDPEngine(path, device=self.device, cpu_mixed_precision=self.config.trainer.cpu_mixed_precision,
                          **kwargs)

    def _setup_distributed(self) -> None:
        """Join the group's process group; called from init_model, never __init__ (see Worker)."""
        if self.world_size > 1:
            self.init_distributed("nccl" if self.device == "cuda" else "gloo")


class ActorRolloutRefWorker(_DistributedWorker):
    """Actor (FSDP2 + optimizer), rollout (HF generate) and reference policy, by role."""

    def __init__(self, config: HybridFlowConfig | dict[str, Any], role: str = "actor_rollout_ref") -> None:
        if role not in ROLES:
            raise ValueError(f"unknown worker role {role!r}; choose one of {sorted(ROLES)}")
        super().__init__(config)
        self.role = role
        self.roles = ROLES[role]
        self.actor: PPOActor | None = None
        self.ref: PPOActor | None = None
        self.rollout: Any = None
        self.rollout_tp: Any = None  # `RolloutTPGroup` when the rollout engine is sharded over this group's ranks

    @classmethod
    def profile_target(cls, role: str = "actor_rollout_ref") -> tuple[tuple[str, ...], str]:
        return tuple(sorted(ROLES[role])), role

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the engines of this worker's roles (loads the model folder on every rank)."""
        self._setup_distributed()
        arr = self.config.actor_rollout_ref
        path = arr.model.path
        if not path:
            raise ValueError("actor_rollout_ref.model.path is not set; point it at a Hugging Face model folder")
        seed = self.config.trainer.seed
        if "actor" in self.roles:
            actor_cfg = arr.actor
            total = actor_cfg.optim.total_training_steps
            engine = self._engine(
                path,
                model_config=arr.model,
                fsdp_config=actor_cfg.fsdp_config,
                optim_config=actor_cfg.optim,
                total_steps=total if total and total > 0 else None,
                grad_clip=actor_cfg.grad_clip,
                seed=seed,
                sequence_parallel_size=actor_cfg.ulysses_sequence_parallel_size,
                freeze_vision_tower=actor_cfg.freeze_vision_tower,
            )
            self.actor = PPOActor(engine, actor_cfg, seed=seed)
        if "ref" in self.roles:
            self.ref = self._build_ref(path, seed)
        if "rollout" in self.roles:
            self.rollout = self._build_rollout(path)
            if getattr(self.rollout, "sharded_over_ranks", False):  # GPU, sync mode: one engine over tp ranks
                from hybridflow.workers.rollout_tp import RolloutTPGroup

                self.rollout_tp = RolloutTPGroup(self.config.actor_rollout_ref.rollout.tensor_model_parallel_size)
            self._sync_rollout()

    def _build_ref(self, path: str, seed: int) -> PPOActor:
        """The reference policy: a frozen copy of the model, or with LoRA the actor's base model (adapter off)."""
        arr = self.config.actor_rollout_ref
        if self.actor is not None and self.actor.engine.lora:
            # no second copy of the weights; the reference's own kernel keys (use_torch_compile)
            return PPOActor(self.actor.engine, arr.actor, seed=seed, kernels=LogProbKernels.of(arr.ref))
        if lora_enabled(arr.model):
            raise ValueError(
                f"worker role {self.role!r}: with LoRA (actor_rollout_ref.model.lora_rank > 0) the reference policy is "
                "the actor's base model with the adapter disabled, so the reference must live in the actor's worker "
                "(role actor_ref or actor_rollout_ref), not in a group of its own"
            )
        engine = self._engine(path, model_config=arr.model, fsdp_config=arr.ref.fsdp_config,
                              sequence_parallel_size=arr.ref.ulysses_sequence_parallel_size or 1)
        return PPOActor(engine, arr.actor, seed=seed, kernels=LogProbKernels.of(arr.ref))

    def _build_rollout(self, path: str) -> Any:
        from hybridflow.engines.fsdp_engine import import_external_lib
        from hybridflow.rollout.registry import build_rollout_engine

        import_external_lib(self.config.actor_rollout_ref.model.external_lib)  # a rollout-only worker too

        device = "cuda" if self.device == "cuda" else "cpu"
        return build_rollout_engine(self.config, model_path=path, device=device)

    def _sync_rollout(self) -> None:
        """Colocated: push the actor's full weights into this process's rollout engine (a collective)."""
        if self.rollout is not None and self.actor is not None:
            self.rollout.load_weights(self.actor.engine.full_state_dict().items())

    def _temperature(self, data: DataProto) -> None:
        data.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)

    @register(Dispatch.DP_COMPUTE_PROTO)
    @profiled("rollout")
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for this rank's prompts; meta_info: do_sample, temperature, top_p, top_k, n, validate."""
        if self.rollout is None:
            raise RuntimeError(f"generate_sequences on a worker with role {self.role!r}, which has no rollout")
        from hybridflow.rollout.token_io import with_validation_sampling

        meta = with_validation_sampling(prompts.meta_info, self.config.actor_rollout_ref.rollout.val_kwargs)
        n = int(meta.get("n", 1))
        if n > 1:
            prompts = prompts.repeat(n, interleave=True)
        if self.rollout_tp is not None:  # the engine's ranks generate their group's prompts together
            return self.rollout_tp.generate(self.rollout, prompts)
        return self.rollout.generate(prompts)

    @register(Dispatch.DP_COMPUTE_PROTO)
    @profiled("actor")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """Old log-probs and entropies of the responses under the current actor."""
        if self.actor is None:
            raise RuntimeError(f"compute_log_prob on a worker with role {self.role!r}, which has no actor")
        self._temperature(data)
        rollout, engine = self.config.actor_rollout_ref.rollout, self.actor.engine
        data, sizes = shared_rows(engine.sp, data)  # Ulysses: the group's rows, each sequence split between them
        log_probs, entropys = self.actor.compute_log_prob(
            data,
            rollout.log_prob_micro_batch_size_per_gpu,
            calculate_entropy=True,
            max_token_len=sp_budget(log_prob_budget(rollout), engine),
        )
        tensors = {"old_log_probs": log_probs, "entropys": entropys}
        if self.config.actor_rollout_ref.actor.calculate_sum_pi_squared:  # the optimal token baselines read it
            tensors["sum_pi_squared"] = self.actor.compute_sum_pi_squared(
                data, rollout.log_prob_micro_batch_size_per_gpu, max_token_len=sp_budget(log_prob_budget(rollout), engine)
            )
        out = DataProto.from_dict(tensors=tensors, meta_info={"temperature": data.meta_info["temperature"]})
        return own_rows(engine.sp, out, sizes)

    @register(Dispatch.DP_COMPUTE_PROTO)
    @profiled("ref")
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Log-probs of the responses under the frozen reference policy."""
        if self.ref is None:
            raise RuntimeError(f"compute_ref_log_prob on a worker with role {self.role!r}, which has no ref")
        self._temperature(data)
        ref, engine = self.config.actor_rollout_ref.ref, self.ref.engine
        data, sizes = shared_rows(engine.sp, data)
        with engine.adapter_disabled():  # LoRA: the base model; otherwise the frozen copy as it is
            log_probs, _ = self.ref.compute_log_prob(
                data, ref.log_prob_micro_batch_size_per_gpu, max_token_len=sp_budget(log_prob_budget(ref), engine)
            )
        return own_rows(engine.sp, DataProto.from_dict(tensors={"ref_log_prob": log_probs}), sizes)

    @register(Dispatch.DP_COMPUTE_PROTO)
    @profiled("actor")
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO update on this rank's rows, then the colocated rollout gets the new weights."""
        if self.actor is None:
            raise RuntimeError(f"update_actor on a worker with role {self.role!r}, which has no actor")
        self._temperature(data)
        arr, engine = self.config.actor_rollout_ref, self.actor.engine
        data, _ = shared_rows(engine.sp, data)
        # Mini-batches split over the data-parallel ranks: world // ulysses size (verl's normalisation)
        mini = per_rank(arr.actor.ppo_mini_batch_size * arr.rollout.n, engine.data_parallel_size,
                        "actor.ppo_mini_batch_size x rollout.n")
        budget = sp_budget(arr.actor.ppo_max_token_len_per_gpu if arr.actor.use_dynamic_bsz else None, engine)
        metrics = self.actor.update_policy(data, mini, arr.actor.ppo_micro_batch_size_per_gpu, max_token_len=budget)
        self._sync_rollout()
        return DataProto(meta_info={"metrics": metrics})

    @register(Dispatch.ONE_TO_ALL)
    def full_state_dict_rank0(self) -> dict[str, torch.Tensor]:
        """The actor's full weights (LoRA: merged, HF names) on CPU at rank 0 ({} elsewhere); a collective, for
        split weight sync and the server-mode replicas."""
        if self.actor is None:
            raise RuntimeError(f"role {self.role!r} has no actor weights to export")
        return self.actor.engine.full_state_dict(rank0_only=True)

    @register(Dispatch.ONE_TO_ALL)
    def update_rollout_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load weights shipped through Ray's object store into this worker's rollout engine."""
        if self.rollout is None:
            raise RuntimeError(f"role {self.role!r} has no rollout engine to load weights into")
        self.rollout.load_weights(state_dict.items())

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, dir_uri: str) -> None:
        """Write the actor (model, optimizer, scheduler) under `dir_uri`; all ranks take part."""
        if self.actor is None:
            raise RuntimeError(f"save_checkpoint on a worker with role {self.role!r}, which has no actor")
        save_engine_checkpoint(self.actor.engine, dir_uri, self.config.actor_rollout_ref.actor.checkpoint.save_contents)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, dir_uri: str) -> None:
        """Restore the actor from `dir_uri` (any world size wrote it) and refresh the rollout."""
        if self.actor is None:
            raise RuntimeError(f"load_checkpoint on a worker with role {self.role!r}, which has no actor")
        load_engine_checkpoint(self.actor.engine, dir_uri, self.config.actor_rollout_ref.actor.checkpoint.load_contents)
        self._sync_rollout()


class CriticWorker(_DistributedWorker):
    """PPO critic: value model on FSDP2 with its own optimizer."""

    def __init__(self, config: HybridFlowConfig | dict[str, Any]) -> None:
        super().__init__(config)
        self.critic: PPOCritic | None = None

    @classmethod
    def profile_target(cls, role: str = "") -> tuple[tuple[str, ...], str]:
        return ("critic",), "critic"

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the value model (from critic.model.path, else the policy's) and its optimizer."""
        self._setup_distributed()
        c = self.config.critic
        path = c.model.path or self.config.actor_rollout_ref.model.path
        if not path:
            raise ValueError("critic.model.path and actor_rollout_ref.model.path are both unset; set one")
        total = c.optim.total_training_steps
        engine = self._engine(
            path,
            kind="value",
            model_config=c.model,
            fsdp_config=c.model.fsdp_config,
            optim_config=c.optim,
            total_steps=total if total and total > 0 else None,
            grad_clip=c.grad_clip,
            seed=self.config.trainer.seed,
            sequence_parallel_size=c.ulysses_sequence_parallel_size,
        )
        # null critic settings (loss_agg_mode, ppo_epochs, shuffle, ...) were filled from the actor's by the config
        self.critic = PPOCritic(engine, c, seed=self.config.trainer.seed)

    def _token_budget(self, forward_only: bool = False) -> int | None:
        """The critic's token budget with use_dynamic_bsz: the value forward's (forward_max_...) or training's."""
        c = self.config.critic
        if not c.use_dynamic_bsz:
            return None
        return c.forward_max_token_len_per_gpu if forward_only else c.ppo_max_token_len_per_gpu

    def _require(self) -> PPOCritic:
        if self.critic is None:
            raise RuntimeError("call init_model on the critic group first")
        return self.critic

    @register(Dispatch.DP_COMPUTE_PROTO)
    @profiled("critic")
    def compute_values(self, data: DataProto) -> DataProto:
        """Values (b, R) of the response positions."""
        critic = self._require()
        data, sizes = shared_rows(critic.engine.sp, data)  # Ulysses: the group's rows, as in the actor
        values = critic.compute_values(
            data, self.config.critic.ppo_micro_batch_size_per_gpu,
            max_token_len=sp_budget(self._token_budget(forward_only=True), critic.engine),
        )
        return own_rows(critic.engine.sp, DataProto.from_dict(tensors={"values": values}), sizes)

    @register(Dispatch.DP_COMPUTE_PROTO)
    @profiled("critic")
    def update_critic(self, data: DataProto) -> DataProto:
        """Clipped value-loss update on this rank's rows; metrics in meta_info."""
        n = self.config.actor_rollout_ref.rollout.n
        mini_prompts = self.config.critic.ppo_mini_batch_size
        critic = self._require()
        data, _ = shared_rows(critic.engine.sp, data)
        mini = per_rank(mini_prompts * n, critic.engine.data_parallel_size, "critic.ppo_mini_batch_size x rollout.n")
        metrics = critic.update_critic(
            data, mini, self.config.critic.ppo_micro_batch_size_per_gpu,
            max_token_len=sp_budget(self._token_budget(), critic.engine),
        )
        return DataProto(meta_info={"metrics": metrics})

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, dir_uri: str) -> None:
        """Write the critic under `dir_uri`; all ranks take part."""
        save_engine_checkpoint(self._require().engine, dir_uri, self.config.critic.checkpoint.save_contents)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, dir_uri: str) -> None:
        """Restore the critic from `dir_uri` (any world size wrote it)."""
        load_engine_checkpoint(self._require().engine, dir_uri, self.config.critic.checkpoint.load_contents)
