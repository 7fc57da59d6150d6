"""One wording for an unexpected exception in a command-line tool: a bug report, never a raw traceback.

Issue 12: a crash used to print a traceback and exit 1, the same status as "invalid input". The
validating CLIs (`rljob validate`, `python -m hybridflow.config`) catch anything unexpected, name the
input that triggered it and exit with `INTERNAL_ERROR`. `HYBRIDFLOW_DEBUG=1` adds the traceback.
"""

from __future__ import annotations

import os
import traceback
from typing import TextIO

from hybridflow.yamlio import shorten

INTERNAL_ERROR = 4
"""Exit status of a validating CLI that failed on its own (a bug), distinct from invalid input."""

DEBUG_ENV = "HYBRIDFLOW_DEBUG"


def report_bug(prog: str, where: str, error: BaseException, out: TextIO) -> int:
    """Print the bug report for `error` met while reading `where`; return INTERNAL_ERROR."""
    print(
        f"{prog}: internal error while checking {where}: {type(error).__name__}: {shorten(str(error))}\n"
        f"This is a bug, please report it with the input ({where}); set {DEBUG_ENV}=1 to print the "
        "traceback.",
        file=out,
    )
    if os.environ.get(DEBUG_ENV):
        traceback.print_exception(error, file=out)
    return INTERNAL_ERROR
