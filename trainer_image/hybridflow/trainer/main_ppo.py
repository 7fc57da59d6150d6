"""Entry point: `python -m hybridflow.trainer.main_ppo [config.yaml] key=value ...` (verl's CLI shape).

verl's `--config-name NAME [--config-path DIR]` works too: `ppo_trainer` is the defaults, verl's multi-turn
example names set the keys their YAMLs set, Megatron names are refused, other names are DIR/NAME.yaml
(docs/verl_compat.md).

Loads and validates the config, attaches to (or starts) Ray, builds the worker groups, data loaders and
reward functions, checks that every data source has a scorer, then runs `RayPPOTrainer.fit()`.
Exit codes: 0 done (also after a SIGTERM-triggered checkpoint), 2 invalid config or inputs, 1 failure.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridflow._config import verl_compat, verl_features
from hybridflow._config.verl_compat import resolve_config_name
from hybridflow.config import ConfigError, HybridFlowConfig, load_config
from hybridflow.workers.cpu_slots import cpu_share


class StartupError(RuntimeError):
    """The run cannot start: its inputs (model, tokenizer, data, reward) are unusable; the message says why."""


USAGE = (
    "usage: python -m hybridflow.trainer.main_ppo [config.yaml | --config-name NAME [--config-path DIR]] [key=value ...]"
)

_NAME_OPTIONS = {"--config-name": "name", "-cn": "name", "--config-path": "path", "-cp": "path"}


@dataclass(frozen=True)
class CommandLine:
    """main_ppo's arguments: the YAML to read (None: the defaults), the overrides in order, notes to print."""

    path: str | None
    overrides: list[str]
    notes: list[str] = field(default_factory=list)


def parse_command_line(argv: Sequence[str]) -> CommandLine:
    """Split the command line: a YAML path (first argument without '=') or verl's `--config-name` / `--config-path`,
    then overrides. ConfigError for a config name HybridFlow refuses or cannot find (see verl_compat)."""
    args, options = _take_name_options(list(argv))
    path = None
    if args and "=" not in args[0] and not args[0].startswith(("~", "+")):
        path = args.pop(0)
    if "name" not in options:
        if "path" in options:
            raise ConfigError(["--config-path: given without --config-name; add --config-name NAME (NAME.yaml in it)"])
        return CommandLine(path, args)
    if path is not None:
        raise ConfigError([f"{path}: a config file and --config-name {options['name']} both given; keep only one"])
    choice = resolve_config_name(options["name"], options.get("path"), os.path.isfile)
    return CommandLine(choice.path, [*choice.overrides, *args], [choice.note] if choice.note else [])


def _take_name_options(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """Remove Hydra's --config-name / --config-path (`--opt X` or `--opt=X`, `-cn`, `-cp`) from the arguments."""
    rest: list[str] = []
    options: dict[str, str] = {}
    items = iter(args)
    for arg in items:
        option, sep, value = arg.partition("=")
        if option not in _NAME_OPTIONS:
            rest.append(arg)
            continue
        if not sep:
            value = next(items, "")
        if not value:
            raise ConfigError([f"{option}: needs a value, e.g. {option} ppo_trainer"])
        options[_NAME_OPTIONS[option]] = value
    return rest, options


def parse_argv(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """The YAML path (None: the defaults) and overrides of a command line (see parse_command_line)."""
    line = parse_command_line(argv)
    return line.path, line.overrides


def load_run_config(argv: Sequence[str]) -> tuple[HybridFlowConfig, list[str]]:
    """The validated, runnable config of a command line and the verl-compatibility notes to print at start-up.

    The same path `main` takes before Ray starts: reads no model and no data, so tests check command lines with it.
    """
    line = parse_command_line(argv)
    cfg = load_config(line.path, line.overrides)
    cfg.validate_for_run()
    return cfg, [*line.notes, *cfg.verl_notes]


def init_ray(cfg: HybridFlowConfig) -> None:
    """Attach to RAY_ADDRESS / trainer.ray_init.address when given, else start a local Ray."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or cfg.trainer.ray_init.address
    runtime_env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}
    if address:
        ray.init(address=address, runtime_env=runtime_env)
    else:
        ray.init(num_cpus=cfg.trainer.ray_init.num_cpus, include_dashboard=False, runtime_env=runtime_env)


def actor_role(cfg: HybridFlowConfig) -> str:
    """The actor group's role: the rollout joins it when colocated in sync mode (server replicas are actors of
    their own), the reference only when something reads its log-probs (`ref_enabled`), so a run without KL or
    DPO keeps no second copy of the model."""
    in_process = cfg.trainer.placement != "split" and cfg.actor_rollout_ref.rollout.mode == "sync"
    parts = ["actor", *(["rollout"] if in_process else []), *(["ref"] if cfg.ref_enabled else [])]
    return "_".join(parts)


def build_worker_groups(cfg: HybridFlowConfig, tokenizer: Any = None, served_rm: Any = None) -> Any:
    """Create the actor(+rollout+ref) group, a critic group for GAE, a reward-model group when enabled (or the
    replicas of `served_rm`, a generative reward model), a distillation teacher group when enabled, and a rollout
    group when split; critic, reward model and teacher share the actor's slots (global pool), the reward model its
    own pool with reward_model.enable_resource_pool."""
    from hybridflow.controller import RayClassWithInitArgs, RayWorkerGroup, ResourcePoolManager
    from hybridflow.profiling import nsight_runtime_env
    from hybridflow.trainer.ray_trainer import WorkerGroups
    from hybridflow.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker
    from hybridflow.workers.reward_model_worker import RewardModelWorker

    nodes = [cfg.trainer.n_gpus_per_node] * cfg.trainer.nnodes
    split = cfg.trainer.placement == "split"
    server_mode = cfg.actor_rollout_ref.rollout.mode == "async"
    rm = cfg.reward_model
    own_rm_pool = rm.enable and rm.enable_resource_pool
    spec = {"global_pool": nodes, **({"rollout_pool": nodes} if split else {}),
            **({"reward_pool": [rm.n_gpus_per_node] * rm.nnodes} if own_rm_pool else {})}
    mapping = {"actor_rollout_ref": "global_pool", "critic": "global_pool",
               "reward_model": "reward_pool" if own_rm_pool else "global_pool", "teacher": "global_pool"}
    if split:
        mapping["rollout"] = "rollout_pool"
    on_gpu = cfg.trainer.device == "cuda"
    manager = ResourcePoolManager(
        spec,
        mapping,
        use_gpu=on_gpu,
        cpus_per_process=1.0 if on_gpu else cpu_share(cfg),
        # Each colocated group takes 1 / max_colocate_count of a slot: the actor, the critic, the reward model,
        # the distillation teacher.
        max_colocate_count=max(
            2,
            1 + int(cfg.critic_enabled) + int(rm.enable and not own_rm_pool) + int(server_mode)
            + int(cfg.distillation.enabled),
        ),
    )
    actor = RayWorkerGroup(
        manager.get_resource_pool("actor_rollout_ref"),
        RayClassWithInitArgs(ActorRolloutRefWorker, config=cfg, role=actor_role(cfg)),
        name_prefix="actor",
        runtime_env=nsight_runtime_env(cfg, *ActorRolloutRefWorker.profile_target(actor_role(cfg))),
    )
    actor.init_model()
    rollout = None
    service = None
    if server_mode:
        from hybridflow.workers.rollout_service import RolloutService

        service = RolloutService(cfg, tokenizer, manager.get_resource_pool("rollout" if split else "actor_rollout_ref"))
    elif split:
        rollout = RayWorkerGroup(
            manager.get_resource_pool("rollout"),
            RayClassWithInitArgs(ActorRolloutRefWorker, config=cfg, role="rollout"),
            name_prefix="rollout",
            runtime_env=nsight_runtime_env(cfg, *ActorRolloutRefWorker.profile_target("rollout")),
        )
        rollout.init_model()
    critic = None
    if cfg.critic_enabled:
        critic = RayWorkerGroup(
            manager.get_resource_pool("critic"),
            RayClassWithInitArgs(CriticWorker, config=cfg),
            name_prefix="critic",
            runtime_env=nsight_runtime_env(cfg, *CriticWorker.profile_target()),
        )
        critic.init_model()
    reward_model = None
    if served_rm is not None:
        served_rm.start(manager.get_resource_pool("reward_model"))
    elif cfg.reward_model.enable:
        reward_model = RayWorkerGroup(
            manager.get_resource_pool("reward_model"),
            RayClassWithInitArgs(RewardModelWorker, config=cfg),
            name_prefix="rm",
            runtime_env=nsight_runtime_env(cfg, *RewardModelWorker.profile_target()),
        )
        reward_model.init_model()
    teacher = None
    if cfg.distillation.enabled:
        from hybridflow.workers.teacher_worker import TeacherWorker

        teacher = RayWorkerGroup(
            manager.get_resource_pool("teacher"), RayClassWithInitArgs(TeacherWorker, config=cfg), name_prefix="teacher"
        )
        teacher.init_model()
    return WorkerGroups(
        actor_rollout=actor, critic=critic, rollout=rollout, reward_model=reward_model, rollout_service=service,
        teacher=teacher,
    )


def build_data(cfg: HybridFlowConfig, tokenizer: Any, processor: Any = None) -> tuple[Any, Any]:
    """Training loader (stateful, for exact resume) and validation loader (None without val_files); `processor`:
    a vision-language model's, for image prompts."""
    from hybridflow.data import RLHFDataset, StatefulDataLoader

    train = StatefulDataLoader.from_config(cfg, RLHFDataset.from_config(cfg, tokenizer, "train", processor))
    val = None
    if cfg.data.val_files:
        val_ds = RLHFDataset.from_config(cfg, tokenizer, "val", processor)
        batch = min(cfg.data.val_batch_size or len(val_ds), len(val_ds))
        val = StatefulDataLoader(val_ds, batch, shuffle=False, drop_last=False)
    return train, val


def build_reward_fns(cfg: HybridFlowConfig, tokenizer: Any, data_sources: set[str], custom: Any = None) -> tuple[Any, Any]:
    """Reward managers for training and validation, scoring with `custom` (the configured custom reward function,
    `load_custom_reward_fn_from_config`) or the built-in scorers; fails now when a data source has no scorer.

    With a classifier reward model every response is scored by it (the managers return its `rm_scores`), so data
    sources need no rule scorer then; a generative one scores through `custom`, which it was pointed at.
    """
    from hybridflow.rewards import RewardManager, check_reward_sources

    classifier_scores = cfg.reward_model.enable and not (custom is not None and custom.served)
    if not classifier_scores:
        check_reward_sources(sorted(data_sources), custom)
    train_fn = RewardManager.from_config(cfg, tokenizer, compute_score=custom)
    val_fn = RewardManager.from_config(cfg, tokenizer, compute_score=custom, num_examine=1)
    return train_fn, val_fn


def start_sandbox(cfg: HybridFlowConfig, data_sources: set[str]) -> Any:
    """The code sandbox's router when the RLJob has a sandbox role (the code scorers pointed at it), else None.

    Its servers start once Ray is up (hybridflow.controller.sandbox_service); ValueError when the role would
    serve nothing in this run.
    """
    from hybridflow.controller.sandbox_service import SandboxDeployment, plan_sandbox

    plan = plan_sandbox(cfg, data_sources)
    if plan is None:
        return None
    sandbox = SandboxDeployment(plan)
    sandbox.point_reward(cfg)
    return sandbox


def multimodal_problem(cfg: HybridFlowConfig) -> str | None:
    """What this run asks of a vision-language model (actor_rollout_ref.model.path has an image processor) that
    image prompts do not have here yet; None when nothing."""
    arr = cfg.actor_rollout_ref
    model = f"actor_rollout_ref.model.path={arr.model.path} is a vision-language model"
    if arr.rollout.mode == "async" and arr.rollout.multi_turn.enable:
        return f"{model}: {verl_features.MULTIMODAL_AGENTS.message}"
    if arr.rollout.name == "hf":
        return f"{model}: image prompts need a vLLM or SGLang rollout; set actor_rollout_ref.rollout.name=vllm"
    unsupported = {
        "critic (GAE)": cfg.critic_enabled,
        "reward_model.enable (a classifier reward model)": cfg.reward_model.enable,
        "distillation": cfg.distillation.enabled,
        "Ulysses sequence parallelism": max(arr.actor.ulysses_sequence_parallel_size,
                                            arr.ref.ulysses_sequence_parallel_size or 1) > 1,
    }
    named = [name for name, used in unsupported.items() if used]
    if named:
        return (f"{model}: {', '.join(named)} with image prompts is not built in HybridFlow yet; train it with a "
                "critic-free estimator (grpo, rloo, ...), rule or custom rewards, and ulysses_sequence_parallel_size=1")
    return None


def profiler_tool_problem(cfg: HybridFlowConfig) -> str | None:
    """global_profiler.tool=nsys on a machine without nsys: Ray could not start the profiled workers."""
    import shutil

    from hybridflow._config.profiler import run_tool

    if run_tool(cfg) != "nsys" or shutil.which("nsys"):
        return None
    return (
        "global_profiler.tool=nsys: no `nsys` on this machine's PATH; Ray starts the profiled workers under "
        "`nsys profile`, so every node needs NVIDIA Nsight Systems (e.g. the cuda-nsight-systems package) on its "
        "PATH; or profile with global_profiler.tool=torch"
    )


def run(cfg: HybridFlowConfig) -> int:
    """Build everything and train; returns the last completed global step."""
    from transformers import AutoTokenizer

    from hybridflow.data.vision import load_processor
    from hybridflow.rewards import load_custom_reward_fn_from_config
    from hybridflow.trainer.ray_trainer import RayPPOTrainer, compute_total_training_steps
    from hybridflow.workers.reward_service import plan_served_reward_model

    model_cfg = cfg.actor_rollout_ref.model
    sandbox = served_rm = None
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_cfg.tokenizer_path or model_cfg.path)
        processor = load_processor(model_cfg.path, model_cfg.trust_remote_code)
        if processor is not None:
            problem = multimodal_problem(cfg)
            if problem:
                raise ValueError(problem)
        train_loader, val_loader = build_data(cfg, tokenizer, processor)
        sources = set(train_loader.dataset.data_sources())
        if val_loader is not None:
            sources |= set(val_loader.dataset.data_sources())
        sandbox = start_sandbox(cfg, sources)  # before the reward managers: the code scorers take its URL
        custom = load_custom_reward_fn_from_config(cfg)
        served_rm = plan_served_reward_model(cfg, custom)  # likewise: points `custom` at a generative reward model
        reward_fn, val_reward_fn = build_reward_fns(cfg, tokenizer, sources, custom)
        if cfg.distillation.enabled:  # an unreadable teacher or one with another vocabulary, before Ray starts
            from hybridflow.workers.teacher_worker import teacher_problem

            problem = teacher_problem(cfg)
            if problem:
                raise ValueError(problem)
        nsys_problem = profiler_tool_problem(cfg)
        if nsys_problem:
            raise ValueError(nsys_problem)
    except (OSError, ValueError) as exc:  # bad paths, unreadable data, prompts too long, no scorer...
        if sandbox is not None:
            sandbox.close()
        if served_rm is not None:
            served_rm.close()
        raise StartupError(str(exc)) from exc
    # The workers' lr schedules need the run length (verl injects it the same way).
    total_steps = compute_total_training_steps(cfg, len(train_loader))
    cfg.actor_rollout_ref.actor.optim.total_training_steps = total_steps
    cfg.critic.optim.total_training_steps = total_steps
    init_ray(cfg)
    try:
        if sandbox is not None:
            sandbox.start_servers()
        workers = build_worker_groups(cfg, tokenizer, served_rm)
        if sandbox is not None and workers.rollout_service is not None:
            sandbox.point_tools(workers.rollout_service.manager.tools)
        try:
            trainer = RayPPOTrainer(cfg, tokenizer, workers, train_loader, reward_fn, val_loader, val_reward_fn)
            step = trainer.fit()
        finally:
            workers.shutdown()
    finally:
        if sandbox is not None:
            sandbox.close()
        if served_rm is not None:
            served_rm.close()
    if cfg.trainer.export.enable and step >= trainer.total_training_steps:  # finished, not stopped by a signal
        from hybridflow.model_merger import export_final_checkpoint

        export_final_checkpoint(cfg, step)  # after the workers are gone: the driver has their memory
    return step


def print_config_problems(exc: ConfigError) -> None:
    """Every problem of an invalid config on stderr, one per line (the trainers' CLIs exit 2 after it)."""
    print(f"invalid trainer config ({len(exc.problems)} problem(s)):", file=sys.stderr)
    for problem in exc.problems:
        print(f"  - {problem}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: parse, validate, run; print config problems and exit 2 on invalid input."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + (__doc__ or ""))
        return 0
    try:
        cfg, notes = load_run_config(args)
    except ConfigError as exc:
        print_config_problems(exc)
        return 2
    except FileNotFoundError as exc:
        print(f"{exc}; pass an existing YAML file. {USAGE}", file=sys.stderr)
        return 2
    if notes:  # once, at start-up: never accept a verl key silently (issue 13)
        print(verl_compat.notes_line(notes), file=sys.stderr)
    from hybridflow.checkpoint import CheckpointError

    try:
        step = run(cfg)
    except (StartupError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"training finished at global step {step}; checkpoints under {cfg.trainer.default_local_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
