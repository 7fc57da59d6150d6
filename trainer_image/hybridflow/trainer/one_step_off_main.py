"""`python -m hybridflow.trainer.one_step_off_main CONFIG [key=value ...]`: main_ppo with
async_training.mode=one_step_off (the shape of verl's `verl.experimental.one_step_off_policy.main_ppo`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hybridflow.trainer import main_ppo


def main_in_mode(mode: str, argv: Sequence[str] | None = None) -> int:
    """Run main_ppo with `async_training.mode=<mode>`; a different mode on the command line is an error."""
    args = list(sys.argv[1:] if argv is None else argv)
    given = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("async_training.mode=")]
    if any(value != mode for value in given):
        print(f"async_training.mode={given[-1]} contradicts this entry point ({mode}); remove the override or run "
              "python -m hybridflow.trainer.main_ppo", file=sys.stderr)
        return 2
    return main_ppo.main([*args, f"async_training.mode={mode}"])


if __name__ == "__main__":
    sys.exit(main_in_mode("one_step_off"))
