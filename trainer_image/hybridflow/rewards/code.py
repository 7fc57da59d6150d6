"""Code problems (verl's `codecontests`, `apps`, `codeforces`, `taco` sources): run the answer on the test cases.

The completion's program is its last fenced code block (```python ... ```, or a bare ``` block). The ground truth
holds the test cases as verl's preprocessing writes them, a JSON string or a mapping
``{"inputs": [...], "outputs": [...]}`` and, for call-based problems (APPS, TACO), ``"fn_name"``:

- standard input: each input is fed on stdin and the printed output must equal the expected one, compared
  line by line with trailing whitespace and trailing blank lines ignored;
- call-based: each input is the argument list of ``fn_name`` (a method of ``Solution`` when the program defines
  that class, as LeetCode-style answers do); the returned value, as JSON, must equal the expected output (or its
  only element, as APPS wraps outputs in a list).

The score is the fraction of cases passed, in [0, 1] (verl's `continuous=True`); no code block scores 0. Each case
runs in a fresh sandbox: a SandboxFusion `run_code` service when `reward_model.sandbox_fusion.url` is set (the
real service, or `python -m hybridflow.tools.sandbox_server`), else the local sandbox of
`hybridflow.tools.sandbox` in the scoring process. A sandbox that fails (unreachable, refusing) raises: the
response scores 0 and counts in `reward/errors`, and the log says why, rather than reading as a wrong answer.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from hybridflow.tools.sandbox import RunResult, run_code
from hybridflow.tools.sandbox_server import result_from_response

SOURCES = ("codecontests", "apps", "codeforces", "taco")
CASE_TIMEOUT_S = 10.0  # per test case, as verl's sandbox scorer allows
MAX_CASES = 64  # a ground truth with more cases is cut here (the response's time budget would run out anyway)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


class SandboxUnavailable(RuntimeError):
    """The sandbox could not run a test case (unreachable service, refused request): not the answer's fault."""


@dataclass(frozen=True)
class Sandbox:
    """Where test cases run: a SandboxFusion `run_code` URL, or None for the local sandbox."""

    url: str | None = None
    memory_limit_mb: int = 1024
    run_timeout: float = CASE_TIMEOUT_S

    def run(self, code: str, stdin: str | None) -> RunResult:
        """Run one program; SandboxUnavailable when the sandbox itself failed."""
        result = self._remote(code, stdin) if self.url else run_code(
            code, stdin=stdin, run_timeout=self.run_timeout, memory_limit_mb=self.memory_limit_mb
        )
        if result.status == "Error" and result.sandbox_error:
            raise SandboxUnavailable(f"the code sandbox failed: {result.sandbox_error}")
        return result

    def _remote(self, code: str, stdin: str | None) -> RunResult:
        payload = {"code": code, "language": "python", "run_timeout": self.run_timeout,
                   "compile_timeout": self.run_timeout, "memory_limit_MB": self.memory_limit_mb, "stdin": stdin}
        request = urllib.request.Request(str(self.url), data=json.dumps(payload).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.run_timeout + 30) as response:
                return result_from_response(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            raise SandboxUnavailable(
                f"the code sandbox at {self.url} refused the request (HTTP {exc.code}); check "
                "reward_model.sandbox_fusion.url points at a SandboxFusion run_code endpoint"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise SandboxUnavailable(
                f"the code sandbox at {self.url} is unreachable ({getattr(exc, 'reason', exc)}); check "
                "reward_model.sandbox_fusion.url and that the service runs"
            ) from None
        except ValueError as exc:
            raise SandboxUnavailable(f"the code sandbox at {self.url} sent an invalid response ({exc})") from None


def extract_code(solution_str: str) -> str | None:
    """The last fenced code block of a completion (a ```python block preferred over other languages), or None."""
    blocks = _FENCE.findall(solution_str)
    if not blocks:
        return None
    python = [body for lang, body in blocks if lang.lower() in ("python", "python3", "py", "")]
    return (python or [blocks[-1][1]])[-1]


def load_test_cases(ground_truth: Any) -> dict[str, Any]:
    """The ground truth's test cases as a mapping; ValueError naming the problem when it is not usable."""
    cases = ground_truth
    if isinstance(cases, bytes | str):
        try:
            cases = json.loads(cases)
        except ValueError as exc:
            raise ValueError(f"code ground truth is not JSON test cases ({exc})") from None
    if not isinstance(cases, dict) or "inputs" not in cases or "outputs" not in cases:
        raise ValueError('code ground truth must hold {"inputs": [...], "outputs": [...]} (and optionally fn_name)')
    if any(isinstance(cases[k], str | bytes | dict) or not hasattr(cases[k], "__iter__") for k in ("inputs", "outputs")):
        raise ValueError("code ground truth's inputs and outputs must be lists, one entry per test case")
    inputs, outputs = _plain(cases["inputs"]), _plain(cases["outputs"])  # a list, or the numpy array parquet gives
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"code ground truth has {len(inputs)} inputs and {len(outputs)} outputs; they must pair up")
    return {"inputs": inputs[:MAX_CASES], "outputs": outputs[:MAX_CASES], "fn_name": cases.get("fn_name")}


def _plain(value: Any) -> Any:
    """Numpy arrays and scalars (what a parquet column gives) as plain lists and numbers, recursively."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def same_output(printed: str, expected: Any) -> bool:
    """Printed text equals the expected text, line by line, ignoring trailing whitespace and blank end lines."""
    def lines(text: str) -> list[str]:
        rows = [row.rstrip() for row in str(text).replace("\r\n", "\n").split("\n")]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    expected_text = "\n".join(map(str, expected)) if isinstance(expected, list) else str(expected)
    return lines(printed) == lines(expected_text)


def _call_harness(code: str, fn_name: str) -> str:
    """The program plus a driver that calls `fn_name` on the JSON argument list read from stdin."""
    target = f"Solution().{fn_name}" if re.search(r"^class\s+Solution\b", code, re.MULTILINE) else fn_name
    return (f"{code}\n\nimport json as _hf_json, sys as _hf_sys\n_hf_args = _hf_json.loads(_hf_sys.stdin.read())\n"
            f"_hf_result = {target}(*_hf_args)\nprint(_hf_json.dumps(_hf_result))\n")


def _call_passed(result: RunResult, expected: Any) -> bool:
    if result.status != "Finished" or result.return_code != 0:
        return False
    try:
        value = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False
    return value == expected or (isinstance(expected, list) and len(expected) == 1 and value == expected[0])


def compute_score(solution_str: str, ground_truth: Any, sandbox: Sandbox | None = None) -> dict[str, Any]:
    """``score``: the fraction of test cases passed; ``acc``: all of them passed; ``passed`` / ``cases``."""
    cases = load_test_cases(ground_truth)
    code = extract_code(solution_str)
    total = len(cases["inputs"])
    if code is None:
        return {"score": 0.0, "acc": False, "passed": 0, "cases": total}
    sandbox = sandbox or Sandbox()
    passed = 0
    for given, expected in zip(cases["inputs"], cases["outputs"], strict=True):
        if cases["fn_name"]:
            args = given if isinstance(given, list) else [given]
            result = sandbox.run(_call_harness(code, str(cases["fn_name"])), json.dumps(args))
            passed += _call_passed(result, expected)
        else:
            stdin = "\n".join(map(str, given)) if isinstance(given, list) else str(given)
            result = sandbox.run(code, stdin)
            passed += result.status == "Finished" and result.return_code == 0 and same_output(result.stdout, expected)
    return {"score": passed / total, "acc": passed == total, "passed": passed, "cases": total}
