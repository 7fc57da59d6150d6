"""Check an RLJob's checkpoints in object storage with the trainer's own checkpoint module (cluster scripts).

The scripts port-forward the S3 endpoint (or reach the real one) and export AWS_*; then

    python -m e2e.cluster.verify URI --wait-latest 600   # wait for a first commit; print the latest committed step
    python -m e2e.cluster.verify URI --committed 3       # exit 0 only if step 3 is the latest and intact

"Committed" means what the trainer means by it (hybridflow.checkpoint): the commit marker matches the
manifest and every file's size and sha256 match it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from hybridflow import checkpoint, storage


def latest_file_step(uri: str) -> int | None:
    """The step named by latest_checkpointed_iteration.txt (rewritten only after a commit), or None."""
    try:
        return int(storage.read_bytes(f"{uri.rstrip('/')}/{checkpoint.LATEST_FILE}").decode().strip())
    except FileNotFoundError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """Wait for / check committed checkpoints under a URI; messages say what was found."""
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster.verify", description=__doc__.splitlines()[0])
    parser.add_argument("uri", help="spec.checkpoint.uri of the RLJob, e.g. s3://rljob-e2e/runs/e2e-tiny")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--wait-latest", type=float, metavar="SECONDS",
                       help="wait until a step is committed; print the latest committed step")
    group.add_argument("--committed", type=int, metavar="STEP", help="require STEP to be the latest committed step")
    args = parser.parse_args(argv)
    if args.wait_latest is not None:
        deadline = time.monotonic() + args.wait_latest
        while latest_file_step(args.uri) is None:
            if time.monotonic() > deadline:
                print(f"no committed checkpoint under {args.uri} after {args.wait_latest:.0f} s", file=sys.stderr)
                return 1
            time.sleep(0.2)
        print(checkpoint.find_latest_committed(args.uri))
        return 0
    latest = checkpoint.find_latest_committed(args.uri, log=lambda msg: print(msg, file=sys.stderr))
    if latest != args.committed:
        print(f"latest committed checkpoint under {args.uri} is {latest}, expected {args.committed}", file=sys.stderr)
        return 1
    problem = checkpoint.verify_step(checkpoint.step_dir(args.uri, latest), deep=True)
    if problem is not None:
        print(f"{checkpoint.step_dir(args.uri, latest)}: {problem}", file=sys.stderr)
        return 1
    print(f"ok: {checkpoint.step_dir(args.uri, latest)} is committed and intact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
