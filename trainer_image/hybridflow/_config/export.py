"""`trainer.export`: write the final checkpoint as a Hugging Face model folder when a run finishes (HybridFlow).

Not a verl key: verl exports with its separate `model_merger` tool, which HybridFlow also has
(`python -m hybridflow.model_merger merge --backend fsdp --local_dir <step>/actor --target_dir <dir>`).
The RLJob field `spec.export` sets this section, so a finished job leaves a servable model behind.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from .common import Section
from .values import Location

if TYPE_CHECKING:
    from .root import HybridFlowConfig

EXPORT_DIR = "export"
_SHARD_SIZE = re.compile(r"^\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$")


class ExportConfig(Section):
    """Export the final checkpoint's actor as a Hugging Face folder (config, safetensors, tokenizer)."""

    enable: bool = Field(
        default=False,
        description="After the last training step, export the final checkpoint's actor: a Hugging Face folder "
        "(config, safetensors shards, tokenizer, generation config; with LoRA the merged model plus the peft adapter "
        "in lora_adapter/), recorded in progress.json (and the RLJob's status.export). Needs the last step "
        "checkpointed (trainer.save_freq > 0).",
    )
    dir: Location | None = Field(
        default=None,
        description="Where the folder goes (a path or URI); null: <trainer.default_local_dir>/export/global_step_<N>.",
    )
    max_shard_size: str = Field(
        default="5GB", description="Largest safetensors file of the export, e.g. 5GB or 500MB (transformers' spelling)."
    )

    @field_validator("max_shard_size")
    @classmethod
    def _shard_size(cls, value: str) -> str:
        if not _SHARD_SIZE.match(value.strip()):
            raise ValueError(f"{value!r} is not a size; write it as transformers does, e.g. 5GB, 500MB or 2GiB")
        return value.strip()


def export_uri(cfg: HybridFlowConfig, step: int) -> str:
    """Where the final step's export goes: trainer.export.dir, else under the checkpoints."""
    if cfg.trainer.export.dir:
        return str(cfg.trainer.export.dir).rstrip("/")
    return f"{str(cfg.trainer.default_local_dir).rstrip('/')}/{EXPORT_DIR}/global_step_{step}"


def check(cfg: HybridFlowConfig) -> list[str]:
    """The export reads the final checkpoint: the last step must be saved."""
    if cfg.trainer.export.enable and cfg.trainer.save_freq <= 0:
        return [
            "trainer.export.enable (an RLJob's spec.export sets it): the export reads the final checkpoint, but "
            f"trainer.save_freq={cfg.trainer.save_freq} "
            "saves none; set trainer.save_freq to a positive N (the last step is always saved then), or turn the "
            "export off"
        ]
    return []
