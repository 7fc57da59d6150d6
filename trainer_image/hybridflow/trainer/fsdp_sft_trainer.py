"""Entry point: `python -m hybridflow.trainer.fsdp_sft_trainer [config.yaml] key=value ...` (verl's SFT command).

Supervised fine-tuning on response tokens with verl's `sft_trainer.yaml` keys (`data.prompt_key`,
`data.response_key`, `data.multiturn.*`, `data.micro_batch_size_per_gpu`, `model.partial_pretrain`,
`optim.lr`, `trainer.*`), on the RL stack's FSDP2 engine, checkpoints and loggers (see
`hybridflow.trainer.offline`). Unlike verl's it is started once with `python`, not with torchrun: it starts
`trainer.nnodes x trainer.n_gpus_per_node` worker processes itself.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hybridflow.trainer.offline import main as offline_main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the SFT trainer with a command line (default: sys.argv); returns the exit status."""
    return offline_main(argv, "sft", __doc__)


if __name__ == "__main__":
    sys.exit(main())
