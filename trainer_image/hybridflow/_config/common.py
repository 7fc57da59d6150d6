"""Building blocks shared by several config groups: the base class, optimizer, FSDP, checkpoint."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .values import refuse_bool_as_number

Dtype = Literal["bf16", "bfloat16", "fp16", "float16", "fp32", "float32"]
CheckpointContent = Literal["model", "optimizer", "extra", "hf_model"]


#: An AdamW beta: the decay of a moving average, so 0 <= beta < 1 (Kingma & Ba 2015, Algorithm 1).
Beta = Annotated[float, Field(ge=0, lt=1)]


class Section(BaseModel):
    """Base of every config model: unknown keys are errors, values are checked on assignment.

    Every float is finite (a rate, coefficient or length is never inf or nan) and no number field
    takes true/false; both rules hold here once, for every field of every group.
    """

    # Numbers become strings where a string is expected (`experiment_name=2025`), as OmegaConf does.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, coerce_numbers_to_str=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse true/false for every number field (see hybridflow._config.values)."""
        return refuse_bool_as_number(cls, value, info)


class OptimConfig(Section):
    """AdamW optimizer and learning-rate schedule of one trained model."""

    lr: float = Field(default=1e-6, ge=0, description="Peak learning rate.")
    lr_warmup_steps: int = Field(
        default=-1, description="Warm-up steps; a negative value means: use lr_warmup_steps_ratio instead."
    )
    lr_warmup_steps_ratio: float = Field(
        default=0.0, ge=0, le=1, description="Warm-up length as a fraction of the total training steps."
    )
    min_lr_ratio: float = Field(
        default=0.0, ge=0, le=1, description="Floor of the cosine schedule as a fraction of lr (cosine only)."
    )
    num_cycles: float = Field(default=0.5, gt=0, description="Number of cosine half-waves (cosine only).")
    lr_scheduler_type: Literal["constant", "cosine"] = Field(
        default="constant", description="Schedule after warm-up: constant or cosine decay."
    )
    warmup_style: Literal["constant", "cosine"] | None = Field(
        default=None,
        description="Older verl name of lr_scheduler_type; when set it is copied there (set only one of the two).",
    )
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW decoupled weight decay.")
    betas: list[Beta] = Field(
        default_factory=lambda: [0.9, 0.999],
        min_length=2,
        max_length=2,
        description="AdamW (beta1, beta2), each in [0, 1).",
    )
    total_training_steps: int = Field(
        default=-1, description="Steps the schedule spans; -1 means: filled in by the trainer at start-up."
    )

    @model_validator(mode="after")
    def _copy_warmup_style(self) -> OptimConfig:
        """Let the legacy `warmup_style` key set the schedule, as verl still accepts it."""
        if self.warmup_style is not None and self.warmup_style != self.lr_scheduler_type:
            if "lr_scheduler_type" in self.model_fields_set:
                raise ValueError(
                    f"warmup_style={self.warmup_style!r} contradicts lr_scheduler_type="
                    f"{self.lr_scheduler_type!r}; set only lr_scheduler_type"
                )
            object.__setattr__(self, "lr_scheduler_type", self.warmup_style)
        return self


class WrapPolicy(Section):
    """Which submodules FSDP shards as a unit."""

    min_num_params: int = Field(
        default=0,
        ge=0,
        description="FSDP1's size-based wrapping; accepted for verl compatibility, no effect: the FSDP2 engine "
        "shards each decoder layer (transformer_layer_cls_to_wrap).",
    )
    transformer_layer_cls_to_wrap: list[str] | None = Field(
        default=None, description="Class names to wrap; null means the model's own decoder-layer class."
    )


class MixedPrecision(Section):
    """Dtypes FSDP uses for parameters, gradient reduction and buffers."""

    param_dtype: Dtype = Field(default="bf16", description="Dtype of parameters in forward/backward.")
    reduce_dtype: Dtype = Field(default="fp32", description="Dtype gradients are reduced in.")
    buffer_dtype: Dtype = Field(
        default="fp32",
        description="FSDP1's buffer dtype; accepted for verl compatibility, no effect: FSDP2 leaves buffers as loaded.",
    )


class FsdpConfig(Section):
    """Sharding and offload of one model (FSDP2 `fully_shard`, or FSDP1 when strategy=fsdp)."""

    param_offload: bool = Field(
        default=False,
        description="Keep parameters in host memory (GPU). Served by FSDP2's CPU offload policy, as offload_policy.",
    )
    optimizer_offload: bool = Field(
        default=False,
        description="Keep optimizer state in host memory (GPU). Served by FSDP2's CPU offload policy, as offload_policy.",
    )
    offload_policy: bool = Field(
        default=False,
        description="GPU: parameters, gradients and optimizer state in host memory; the optimizer steps on CPU.",
    )
    reshard_after_forward: bool = Field(
        default=True,
        description="FSDP2: free gathered parameters after forward (saves memory, costs a gather).",
    )
    fsdp_size: int = Field(
        default=-1,
        ge=-1,
        description="Ranks per FSDP shard group; -1 shards over every rank (no replication).",
    )
    model_dtype: Dtype = Field(default="fp32", description="Dtype the master weights are held in.")
    mixed_precision: MixedPrecision = Field(
        default_factory=MixedPrecision, description="Compute and gradient-reduction dtypes on GPU; on CPU the model computes in model_dtype "
        "unless trainer.cpu_mixed_precision is set."
    )
    wrap_policy: WrapPolicy = Field(default_factory=WrapPolicy, description="Which submodules are sharded.")

    @model_validator(mode="after")
    def _check_fsdp_size(self) -> FsdpConfig:
        """Reject fsdp_size=0, which would mean shard groups of no rank."""
        if self.fsdp_size == 0:
            raise ValueError("fsdp_size must be -1 (all ranks) or a positive group size, not 0")
        return self


def _default_contents() -> list[CheckpointContent]:
    """What verl saves by default."""
    return ["model", "optimizer", "extra"]


class CheckpointConfig(Section):
    """What a checkpoint of one model holds."""

    save_contents: list[CheckpointContent] = Field(
        default_factory=_default_contents,
        description="Parts to save: model, optimizer, extra (scheduler, RNG, data position), hf_model.",
    )
    load_contents: list[CheckpointContent] | None = Field(
        default=None, description="Parts to load on resume; null means the same as save_contents."
    )

    @model_validator(mode="after")
    def _default_load_contents(self) -> CheckpointConfig:
        """Load what is saved unless told otherwise (verl writes this as `${.save_contents}`)."""
        if self.load_contents is None:
            object.__setattr__(self, "load_contents", list(self.save_contents))
        return self
