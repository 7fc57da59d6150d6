"""`python -m hybridflow.trainer.fully_async_main CONFIG [key=value ...]`: main_ppo with
async_training.mode=fully_async (the shape of verl's `verl.experimental.fully_async_policy.fully_async_main`)."""

from __future__ import annotations

import sys

from hybridflow.trainer.one_step_off_main import main_in_mode

if __name__ == "__main__":
    sys.exit(main_in_mode("fully_async"))
