"""Entry point: `python -m hybridflow.trainer.fsdp_dpo_trainer [config.yaml] key=value ...`: offline DPO / IPO.

Preference pairs from parquet (`data.prompt_key`, `data.chosen_key`, `data.rejected_key`), TRL's loss
names (`dpo.beta`, `dpo.loss_type: sigmoid | ipo`), the reference log-probs from a frozen copy of
`model.partial_pretrain`; otherwise the SFT trainer's keys, engine, checkpoints and loggers (see
`hybridflow.trainer.offline`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hybridflow.trainer.offline import main as offline_main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the DPO trainer with a command line (default: sys.argv); returns the exit status."""
    return offline_main(argv, "dpo", __doc__)


if __name__ == "__main__":
    sys.exit(main())
