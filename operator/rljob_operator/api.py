"""Pydantic models of the RLJob custom resource (rl.hybridflow.dev/v1alpha1): spec and status.

These models are the single source of truth for the API: the CRD's openAPIV3Schema is generated
from them (`make crds`, see crdgen.py), the operator parses every RLJob with them, and `rljob validate`
uses them too. Python attributes are snake_case; the wire format (aliases) is Kubernetes camelCase,
so dump with `model_dump(mode="json", exclude_none=True)` (serialisation is by alias by default).
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from hybridflow._config.values import Location, refuse_bool_as_number
from hybridflow.recipes import RecipeName

GROUP = "rl.hybridflow.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"
PLURAL = "rljobs"
SINGULAR = "rljob"
SHORT_NAMES = ["rlj"]

#: The trainer image used when `spec.image` is not set and the operator names no other
#: (`rljob operator --trainer-image`, the chart's `trainerImage`); built from trainer_image/.
DEFAULT_IMAGE = "ghcr.io/rljob-hybridflow/trainer:0.1.0"

#: Kubernetes resource.Quantity syntax (same regex as the API server's OpenAPI for quantities).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
#: A quantity is an integer or a string such as "500m", "16Gi" (CRD: x-kubernetes-int-or-string).
#: The integer is strict, as in the API server: a string is never turned into one ("4\n" is refused).
Quantity = Annotated[int, Strict()] | Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN)]


class _Model(BaseModel):
    """Base for every API model: unknown fields are errors, camelCase on the wire, true/false is no number."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    # pydantic would read `cpu: true` as 1 CPU; the trainer config refuses booleans as numbers the same way.
    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse true/false for every number field (see hybridflow._config.values)."""
        return refuse_bool_as_number(cls, value, info)


# ---------------------------------------------------------------------------------------------- spec


class LocalObjectReference(_Model):
    """A reference to an object by name in the RLJob's namespace."""

    name: str = Field(min_length=1, description="Name of the referenced object (same namespace).")


class HeadResources(_Model):
    """CPU and memory for the Ray head pod (it runs the trainer driver, no GPUs)."""

    cpu: Quantity = Field(default="2", description="CPU request and limit of the head pod.")
    memory: Quantity = Field(default="8Gi", description="Memory request and limit of the head pod.")


class ResourcesSpec(_Model):
    """Per-node compute resources; GPU counts come from spec.config.trainer (n_gpus_per_node)."""

    gpu_resource_name: str = Field(
        default="nvidia.com/gpu",
        min_length=1,
        description="Extended resource name of the GPUs requested per worker node, e.g. nvidia.com/gpu "
        "or amd.com/gpu. The count is spec.config.trainer.n_gpus_per_node.",
    )
    cpu: Quantity = Field(default="8", description="CPU request and limit of each worker pod.")
    memory: Quantity = Field(default="64Gi", description="Memory request and limit of each worker pod.")
    shared_memory: Quantity = Field(
        default="16Gi",
        description="Size of the in-memory /dev/shm volume of each pod (NCCL and Ray's object store use it).",
    )
    head: HeadResources = Field(
        default_factory=HeadResources, description="Resources of the Ray head pod (the trainer driver)."
    )


class Toleration(_Model):
    """A Kubernetes toleration (core/v1 Toleration)."""

    key: str | None = Field(default=None, description="Taint key the toleration applies to; empty matches all.")
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (default Equal) between key and value."
    )
    value: str | None = Field(default=None, description="Taint value the toleration matches (with Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, description="With NoExecute: how long the pod stays bound after the taint appears."
    )


class KeySelector(_Model):
    """Selects a key of a Secret or ConfigMap (core/v1 SecretKeySelector / ConfigMapKeySelector)."""

    name: str = Field(min_length=1, description="Name of the Secret or ConfigMap.")
    key: str = Field(min_length=1, description="The key to select.")
    optional: bool | None = Field(default=None, description="Whether the object or its key may be missing.")


class ObjectFieldSelector(_Model):
    """Selects a field of the pod (core/v1 ObjectFieldSelector)."""

    field_path: str = Field(description="Path of the field, e.g. metadata.name or status.podIP.")
    api_version: str | None = Field(default=None, description="Version of the schema fieldPath is written in.")


class ResourceFieldSelector(_Model):
    """Selects a container resource (core/v1 ResourceFieldSelector)."""

    resource: str = Field(description="Resource to select, e.g. limits.memory.")
    container_name: str | None = Field(default=None, description="Container name; defaults to this one.")
    divisor: Quantity | None = Field(default=None, description="Output format of the exposed resource.")


class EnvVarSource(_Model):
    """Where an environment variable's value comes from (exactly one source)."""

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(default=None, description="A container resource.")


class EnvVar(_Model):
    """An environment variable for the trainer containers (core/v1 EnvVar)."""

    name: str = Field(min_length=1, description="Variable name.")
    value: str | None = Field(default=None, description="Literal value; do not put secrets here, use valueFrom.")
    value_from: EnvVarSource | None = Field(default=None, description="Source of the value (Secret, ...).")


class OptionalObjectReference(_Model):
    """A reference to a Secret or ConfigMap for envFrom."""

    name: str = Field(min_length=1, description="Name of the Secret or ConfigMap.")
    optional: bool | None = Field(default=None, description="Whether the object may be missing.")


class EnvFromSource(_Model):
    """Imports every key of a Secret or ConfigMap as environment variables (core/v1 EnvFromSource)."""

    prefix: str | None = Field(default=None, description="Prefix prepended to every imported variable name.")
    secret_ref: OptionalObjectReference | None = Field(default=None, description="The Secret to import.")
    config_map_ref: OptionalObjectReference | None = Field(default=None, description="The ConfigMap to import.")


class PodSpec(_Model):
    """Scheduling and environment settings applied to the head and worker pods."""

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pods must match (pod spec nodeSelector)."
    )
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints the pods tolerate.")
    affinity: dict[str, Any] | None = Field(
        default=None, description="Pod affinity rules, verbatim core/v1 Affinity (nodeAffinity, podAffinity, ...)."
    )
    priority_class_name: str | None = Field(default=None, description="PriorityClass of the pods.")
    scheduler_name: str | None = Field(default=None, description="Scheduler of the pods, e.g. volcano.")
    service_account_name: str | None = Field(default=None, description="ServiceAccount the pods run as.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables of the trainer.")
    env_from: list[EnvFromSource] = Field(
        default_factory=list, description="Secrets/ConfigMaps imported whole as environment variables."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Extra labels on the pods.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra annotations on the pods.")


class CheckpointSpec(_Model):
    """Where checkpoints go; every attempt resumes from the latest committed one."""

    uri: Location | None = Field(
        default=None,
        description="Checkpoint location: s3://bucket/prefix, gs://bucket/prefix, file:///path or /path. "
        "The operator sets spec.config.trainer.default_local_dir from it (setting both is an error). Use "
        "object storage on a cluster: every attempt runs on fresh pods.",
    )
    secret_ref: LocalObjectReference | None = Field(
        default=None,
        description="Secret whose keys (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL) are "
        "imported as environment variables of the trainer pods.",
    )
    keep: int | None = Field(
        default=None,
        ge=1,
        description="How many checkpoints to keep (older ones are deleted); unset keeps all. The operator sets "
        "spec.config.trainer.max_actor_ckpt_to_keep and max_critic_ckpt_to_keep from it (setting both is an error).",
    )


class ExportSpec(_Model):
    """Export the final checkpoint as a Hugging Face model folder when the job succeeds."""

    enabled: bool = Field(
        default=True,
        description="After the last training step the trainer exports the final checkpoint's actor to "
        "<spec.checkpoint.uri>/export/global_step_<N>: config, safetensors shards, tokenizer and generation config "
        "(with LoRA the merged model, plus the peft adapter in lora_adapter/), loadable by transformers and vLLM; "
        "status.export says where. Needs spec.config.trainer.save_freq > 0 (the last step is saved then).",
    )
    max_shard_size: str = Field(
        default="5GB",
        pattern=r"^\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$",
        description="Largest safetensors file of the export, e.g. 5GB or 500MB.",
    )


class SmokeRunSpec(_Model):
    """A short run at the smallest size before the full one: catches a broken image, config, data path or
    storage credentials before the full GPU request is made.

    Only `steps` is usually set: the rest defaults to the smallest shape the trainer accepts, derived from
    spec.config with the trainer's own rules (rljob_operator.smoke): one node, the fewest GPUs the config
    allows (e.g. rollout.tensor_model_parallel_size), the smallest batch that splits over them.
    """

    steps: int = Field(
        default=2, ge=1, le=1000,
        description="Training steps of the smoke run (its trainer.total_training_steps); it saves a checkpoint after "
        "the last one, to its own location (<checkpoint location>/smoke-run), never where the full run resumes from.",
    )
    train_batch_size: int | None = Field(
        default=None, ge=1,
        description="Prompts per step of the smoke run (rows with spec.recipe sft or dpo): its data.train_batch_size; "
        "mini- and micro-batches shrink to fit. Unset: the smallest size the trainer accepts on the smoke run's GPUs.",
    )
    nnodes: int = Field(
        default=1, ge=1,
        description="Nodes of the smoke run (its trainer.nnodes), at most spec.config.trainer.nnodes.",
    )
    n_gpus_per_node: int | None = Field(
        default=None, ge=1,
        description="GPUs per node of the smoke run (processes with trainer.device cpu), at most "
        "spec.config.trainer.n_gpus_per_node. Unset: the fewest the config allows.",
    )
    timeout_seconds: int | None = Field(
        default=None, ge=1,
        description="Fail the job (reason SmokeRunFailed) when the smoke run has not finished this long after it "
        "started. Unset: only spec.runPolicy.activeDeadlineSeconds limits it.",
    )


class RunPolicy(_Model):
    """Retries, deadlines and clean-up."""

    backoff_limit: int = Field(
        default=3, ge=0, description="Retries after a failed attempt; each retry resumes from the latest checkpoint."
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, description="Fail the job when it has run this long in total (all attempts)."
    )
    stall_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Treat a running attempt whose training step has not advanced for this long as failed.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the children of a finished job (its RayJobs, their Ray clusters, the ConfigMap) this "
        "many seconds after it succeeded or failed; the RLJob and its status stay (status.childrenDeletedAt "
        "records when). Unset: the children stay until the RLJob is deleted.",
    )
    smoke_run: SmokeRunSpec | None = Field(
        default=None,
        description="Run a short smoke run first, as its own small RayJob (<name>-smoke): when it succeeds the full "
        "attempt starts; when it fails the job fails (reason SmokeRunFailed, with the log tail) before the full GPU "
        "request is made. It runs once per job: not again on retries or after a spec edit of the running full job. "
        "A failed smoke run is not retried and does not count against backoffLimit. Unset: no smoke run.",
    )


#: spec.scheduling.scheduler values: Kubernetes' own scheduler, Kueue, or a KubeRay batch scheduler (named
#: as KubeRay's --batch-scheduler flag names them).
SchedulerName = Literal["default", "kueue", "volcano", "yunikorn", "kai-scheduler"]
SCHEDULERS: tuple[str, ...] = get_args(SchedulerName)


class SchedulingSpec(_Model):
    """How the job's pods are admitted: gang-scheduled (all pods of an attempt at once) through a queue."""

    scheduler: SchedulerName = Field(
        description="Who admits the job's Ray cluster as a whole. kueue: Kueue's RayJob integration (the RayJob "
        "is created suspended and Kueue unsuspends it once the queue's quota fits every pod). volcano, yunikorn, "
        "kai-scheduler: KubeRay's batch-scheduler integration (KubeRay's operator must run with "
        "--batch-scheduler=<the same name>). default: the cluster's default scheduler, no gang scheduling.",
    )
    queue: str | None = Field(
        default=None,
        description="The queue to submit to: a Kueue LocalQueue in the job's namespace (required with kueue), a "
        "Volcano Queue (default: Volcano's default queue), a YuniKorn queue such as root.team-a (default: "
        "YuniKorn's placement rules), a KAI Scheduler Queue (required with kai-scheduler).",
    )


class RoleResources(_Model):
    """Per-pod compute resources of a role; every field left unset takes spec.resources' value."""

    gpu_resource_name: str | None = Field(
        default=None,
        min_length=1,
        description="Extended resource name of the role's GPUs, e.g. nvidia.com/gpu; another device plugin's name "
        "(or a nodeSelector on a GPU-type label) gives the role its own GPU type. Unset: "
        "spec.resources.gpuResourceName. The count per pod is derived from spec.config. Refused on the CPU-only "
        "sandbox role.",
    )
    cpu: Quantity | None = Field(default=None, description="CPU request and limit of each pod. Unset: spec.resources.cpu.")
    memory: Quantity | None = Field(
        default=None, description="Memory request and limit of each pod. Unset: spec.resources.memory."
    )
    shared_memory: Quantity | None = Field(
        default=None, description="Size of each pod's in-memory /dev/shm. Unset: spec.resources.sharedMemory."
    )


class RolloutRoleSpec(_Model):
    """The rollout role: pods of their own for the rollout replicas of split placement.

    Its size is the trainer's, not set here: with spec.config.trainer.placement split the rollout gets a
    resource pool of the trainer's shape, so the role has trainer.nnodes pods of trainer.n_gpus_per_node GPUs
    each, and actor_rollout_ref.rollout (replicas, tensor_model_parallel_size) decides how the replicas split
    them. `replicas` and `gpusPerReplica` only state what you expect: a value the config contradicts is refused.
    """

    replicas: int | None = Field(
        default=None, ge=1,
        description="Rollout server replicas you expect (rollout.mode async). The trainer decides them: "
        "actor_rollout_ref.rollout.replicas, else one per tensor_model_parallel_size GPUs of the pool (one with "
        "trainer.device cpu); a different value is refused with the config change that gives it. Unset: no check.",
    )
    gpus_per_replica: int | None = Field(
        default=None, ge=1,
        description="GPUs of each replica you expect: actor_rollout_ref.rollout.tensor_model_parallel_size; a "
        "different value is refused. Unset: no check.",
    )
    resources: RoleResources = Field(
        default_factory=RoleResources, description="Per-pod resources of the rollout pods (unset: spec.resources')."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the rollout pods must match, merged over spec.pod.nodeSelector key by key (the "
        "role wins), e.g. a GPU-type label that sends the rollout to cheaper inference GPUs.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints the rollout pods tolerate, in addition to spec.pod.tolerations."
    )


class SandboxRoleSpec(_Model):
    """The sandbox role: CPU-only pods serving the code sandbox (SandboxFusion's run_code API) to the code tool and
    the code scorers.

    Its size is the trainer's, not set here: spec.config.trainer.sandbox.replicas run_code servers, one per pod.
    `replicas` only states what you expect: a value the config contradicts is refused.
    """

    replicas: int | None = Field(
        default=None, ge=1,
        description="Sandbox pods you expect: spec.config.trainer.sandbox.replicas, which the trainer reads (one "
        "run_code server per pod); a different value is refused with the config change that gives it. Unset: no "
        "check.",
    )
    resources: RoleResources = Field(
        default_factory=RoleResources,
        description="Per-pod cpu, memory and sharedMemory of the sandbox pods (unset: spec.resources'). CPU only: "
        "gpuResourceName is refused here.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the sandbox pods must match, merged over spec.pod.nodeSelector key by key (the "
        "role wins), e.g. a CPU node pool.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints the sandbox pods tolerate, in addition to spec.pod.tolerations."
    )


class RolesSpec(_Model):
    """An RLJob's pods by role. The trainer role (actor, reference, critic, reward model) is always there and
    uses spec.resources and spec.pod; each role set here gets a KubeRay worker group of its own in the same
    RayCluster (admitted together), and the trainer places that role's workers on it."""

    rollout: RolloutRoleSpec | None = Field(
        default=None,
        description="Pods of their own for the rollout replicas; needs spec.config.trainer.placement: split. "
        "Unset: the rollout shares the trainer's worker group (colocated, or split over identical pods).",
    )
    sandbox: SandboxRoleSpec | None = Field(
        default=None,
        description="CPU-only pods of their own for the code sandbox (run_code servers for the code tool and the "
        "code scorers); needs spec.config.trainer.sandbox.replicas. Unset: code runs in the trainer's processes.",
    )


class RLJobSpec(_Model):
    """Desired state of an RLJob: the trainer config plus how to run it on the cluster.

    `config` stays a plain mapping here and in the CRD: it is validated with the parser of `recipe`'s
    trainer (`hybridflow.recipes`, see validation.py), which resolves `${...}` references and accepts
    verl's shorthands that a typed schema would reject; a typed CRD would also silently prune typos.
    """

    config: dict[str, Any] = Field(
        description="The HybridFlow trainer config in verl's nested shape (algorithm, data, actor_rollout_ref, "
        "critic, reward_model, custom_reward_function, trainer; with spec.recipe sft or dpo: data, model, optim, "
        "trainer and dpo). The cluster is sized from trainer.nnodes "
        "and trainer.n_gpus_per_node. Checked by the operator (condition Validated) and `rljob validate` "
        "with the trainer's own models; the schema leaves it open because verl's ${...} references and "
        "single-string lists are valid here and typos should be reported, not pruned.",
    )
    recipe: RecipeName = Field(
        default="ppo",
        description="Which trainer runs spec.config: ppo (RL: PPO, GRPO, DAPO, online DPO, ...; "
        "hybridflow.trainer.main_ppo, config in verl's ppo_trainer shape), sft (supervised fine-tuning; "
        "hybridflow.trainer.fsdp_sft_trainer, verl's sft_trainer keys: data, model, optim, trainer) or dpo (offline "
        "DPO/IPO from preference pairs; hybridflow.trainer.fsdp_dpo_trainer, the sft keys plus dpo.beta and "
        "dpo.loss_type). spec.config is validated with that trainer's own models.",
    )
    image: str | None = Field(
        default=None,
        min_length=1,
        description="Trainer container image. Unset: the operator's default trainer image (Helm value "
        f"trainerImage, flag --trainer-image), {DEFAULT_IMAGE} unless the operator is given another; each "
        "attempt uses the default current when it starts.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Pull policy of the trainer image."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, description="Secrets used to pull the trainer image."
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Per-node compute resources.")
    pod: PodSpec = Field(default_factory=PodSpec, description="Scheduling and environment settings of the pods.")
    roles: RolesSpec | None = Field(
        default=None,
        description="Roles with pods of their own (rollout, sandbox), each a KubeRay worker group advertising the Ray "
        "custom resource rljob.role/<role>; sizes come from spec.config. Unset: one worker group for everything.",
    )
    scheduling: SchedulingSpec | None = Field(
        default=None,
        description="Gang scheduling: Kueue or a KubeRay batch scheduler (Volcano, YuniKorn, KAI Scheduler) and "
        "its queue. Unset: the default scheduler.",
    )
    queue_name: str | None = Field(
        default=None,
        description="Deprecated shorthand for scheduling: {scheduler: kueue, queue: <this>}: the Kueue LocalQueue "
        "to submit to. Set spec.scheduling instead (not both).",
    )
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec, description="Checkpoint storage and retention."
    )
    export: ExportSpec | None = Field(
        default=None,
        description="Export the final checkpoint as a Hugging Face model folder under the checkpoint location when "
        "the job succeeds (the RL trainer, spec.recipe ppo). Unset: no export (`python -m hybridflow.model_merger "
        "merge` exports any checkpoint later).",
    )
    run_policy: RunPolicy = Field(default_factory=RunPolicy, description="Retries, deadlines and clean-up.")
    suspend: bool = Field(
        default=False, description="Suspend the job: frees the cluster; unsuspending resumes from checkpoint."
    )


# -------------------------------------------------------------------------------------------- status


class Phase(str, Enum):
    """One-word summary of an RLJob's state (printer column); conditions hold the detail."""

    PENDING = "Pending"
    INVALID = "Invalid"
    QUEUED = "Queued"
    SUSPENDED = "Suspended"
    STARTING = "Starting"
    RUNNING = "Running"
    RETRYING = "Retrying"
    RESTARTING = "Restarting"
    SMOKE_RUN = "SmokeRun"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ConditionType(str, Enum):
    """Condition types an RLJob reports."""

    VALIDATED = "Validated"
    SMOKE_RUN_PASSED = "SmokeRunPassed"
    SUSPENDED = "Suspended"
    CLUSTER_READY = "ClusterReady"
    ROLES_READY = "RolesReady"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SPEC_APPLIED = "SpecApplied"


class Condition(_Model):
    """A Kubernetes-style condition (type, status, reason, message, lastTransitionTime)."""

    type: ConditionType = Field(description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str | None = Field(default=None, description="CamelCase machine-readable reason of the last change.")
    message: str | None = Field(default=None, description="Human-readable detail: what happened, what to do.")
    last_transition_time: str | None = Field(
        default=None, description="RFC 3339 time when status last changed."
    )
    observed_generation: int | None = Field(
        default=None, description="metadata.generation the condition was computed from."
    )


class FailureInfo(_Model):
    """What made the most recent attempt fail."""

    attempt: int = Field(description="The attempt number that failed (0: the smoke run, spec.runPolicy.smokeRun).")
    reason: str | None = Field(default=None, description="CamelCase reason (e.g. from the RayJob status).")
    message: str | None = Field(default=None, description="Detail of the failure.")


class Progress(_Model):
    """Training progress reported by the trainer."""

    step: int | None = Field(default=None, description="Latest completed training step.")
    total_steps: int | None = Field(default=None, description="Total training steps of the run.")
    percent: float | None = Field(default=None, description="step / totalSteps in percent.")
    eta_seconds: int | None = Field(default=None, description="Estimated seconds until the run finishes.")


class Metrics(_Model):
    """Latest training metrics that matter."""

    reward_mean: float | None = Field(default=None, description="Mean sequence reward of the latest step.")
    kl: float | None = Field(default=None, description="KL divergence to the reference policy, latest step.")
    throughput_tokens_per_second: float | None = Field(
        default=None, description="Training throughput of the latest step, tokens per second."
    )
    policy_version: int | None = Field(
        default=None, description="Asynchronous training: actor updates in the weights being trained."
    )
    staleness_max: float | None = Field(
        default=None, description="Asynchronous training: policy versions the oldest sample of the latest step "
        "was behind the trainer.",
    )


class CheckpointStatus(_Model):
    """The latest committed checkpoint."""

    step: int | None = Field(default=None, description="Training step of the checkpoint.")
    uri: str | None = Field(default=None, description="Where the checkpoint is stored.")
    time: str | None = Field(default=None, description="RFC 3339 time the checkpoint was committed.")


class ExportStatus(_Model):
    """The Hugging Face folder exported from the final checkpoint (spec.export)."""

    step: int | None = Field(default=None, description="Training step of the exported checkpoint.")
    uri: str | None = Field(default=None, description="Where the folder is: from_pretrained / vLLM load it.")
    time: str | None = Field(default=None, description="RFC 3339 time the export finished.")
    lora: bool | None = Field(
        default=None, description="True: a LoRA run; the folder holds the merged model and the adapter in lora_adapter/."
    )


class RoleStatus(_Model):
    """One role's pods in the current attempt (the head and the trainer group are role trainer)."""

    name: str = Field(description="The role: trainer, rollout or sandbox.")
    desired: int = Field(description="Pods the role's worker groups ask for (the trainer's include the Ray head).")
    ready: int = Field(description="Pods of the role that are Ready.")
    restarts: int = Field(
        description="Pods of the role lost in this attempt (deleted, failed, or their Ray container restarted). "
        "A lost rollout or sandbox pod is replaced while the attempt goes on; a lost trainer pod ends the attempt "
        "(reason TrainerPodLost) and the next one resumes from the latest checkpoint.",
    )


class SmokeRunStatus(_Model):
    """The smoke run (spec.runPolicy.smokeRun): its RayJob, the shape it ran at, how it went."""

    ray_job_name: str = Field(description="Name of the smoke run's RayJob.")
    state: Literal["Pending", "Running", "Passed", "Failed", "Skipped"] = Field(
        description="Pending (created, not running yet), Running, Passed (the full attempt may start), Failed (the "
        "job failed with it) or Skipped (spec.runPolicy.smokeRun was removed before it finished).",
    )
    steps: int | None = Field(default=None, description="Training steps of the smoke run.")
    train_batch_size: int | None = Field(default=None, description="Its data.train_batch_size.")
    nnodes: int | None = Field(default=None, description="Its trainer.nnodes.")
    n_gpus_per_node: int | None = Field(default=None, description="Its trainer.n_gpus_per_node.")
    checkpoint_uri: str | None = Field(default=None, description="Where it writes checkpoints and progress.json.")
    start_time: str | None = Field(default=None, description="RFC 3339 time it was first seen started.")
    completion_time: str | None = Field(default=None, description="RFC 3339 time it passed or failed.")


class RLJobStatus(_Model):
    """Observed state of an RLJob, written by the operator."""

    observed_generation: int | None = Field(default=None, description="metadata.generation last reconciled.")
    phase: Phase | None = Field(default=None, description="One-word summary of the job's state.")
    conditions: list[Condition] = Field(default_factory=list, description="Detailed state, one per type.")
    attempt: int | None = Field(default=None, description="Current attempt number, starting at 1.")
    failed_attempts: int | None = Field(
        default=None,
        description="Attempts that failed so far, stalls included (spec.runPolicy.stallTimeoutSeconds); the job "
        "fails once this exceeds spec.runPolicy.backoffLimit. Restarts after a spec edit are not counted.",
    )
    ray_job_name: str | None = Field(default=None, description="Name of the current attempt's RayJob.")
    config_map_name: str | None = Field(default=None, description="Name of the ConfigMap holding the config.")
    dashboard_url: str | None = Field(
        default=None, alias="dashboardURL", description="Ray dashboard address of the current attempt."
    )
    start_time: str | None = Field(default=None, description="RFC 3339 time the first attempt started.")
    completion_time: str | None = Field(default=None, description="RFC 3339 time the job finished.")
    children_deleted_at: str | None = Field(
        default=None,
        description="RFC 3339 time the operator deleted the finished job's RayJobs and ConfigMap "
        "(spec.runPolicy.ttlSecondsAfterFinished).",
    )
    last_failure: FailureInfo | None = Field(default=None, description="What made the latest attempt fail.")
    smoke_run: SmokeRunStatus | None = Field(
        default=None, description="The smoke run (spec.runPolicy.smokeRun); condition SmokeRunPassed sums it up."
    )
    roles: list[RoleStatus] | None = Field(
        default=None, description="The current attempt's pods by role; condition RolesReady sums it up."
    )
    progress: Progress | None = Field(default=None, description="Training progress.")
    metrics: Metrics | None = Field(default=None, description="Latest training metrics.")
    checkpoint: CheckpointStatus | None = Field(default=None, description="The latest committed checkpoint.")
    export: ExportStatus | None = Field(
        default=None, description="The Hugging Face folder exported when the job succeeded (spec.export)."
    )


class ObjectMeta(BaseModel):
    """The subset of metadata the operator reads; other keys are kept but not interpreted."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(description="Name of the RLJob.")
    namespace: str | None = Field(default=None, description="Namespace of the RLJob.")
    uid: str | None = Field(default=None, description="UID assigned by the API server.")
    generation: int | None = Field(default=None, description="Spec generation assigned by the API server.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels of the RLJob.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations of the RLJob.")


class RLJob(_Model):
    """A whole RLJob object as read from the API or a manifest file."""

    api_version: Literal["rl.hybridflow.dev/v1alpha1"] = Field(
        default="rl.hybridflow.dev/v1alpha1", description="Must be rl.hybridflow.dev/v1alpha1."
    )
    kind: Literal["RLJob"] = Field(default="RLJob", description="Must be RLJob.")
    metadata: ObjectMeta = Field(description="Object metadata.")
    spec: RLJobSpec = Field(description="Desired state.")
    status: RLJobStatus | None = Field(default=None, description="Observed state (written by the operator).")
