"""`make run`: the embedded default job (a local GRPO run of a tiny model on CPU)."""

import sys


def main() -> int:
    print(
        "make run: the RL loop (controller, FSDP workers, rollout) is not built yet "
        "(tracked in the 'HybridFlow controller' issue). Until it lands, `make test` exercises "
        "the config, batch type, algorithms, data and rewards.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
