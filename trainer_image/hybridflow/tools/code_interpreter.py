"""The code-interpreter tool: runs the model's Python in a SandboxFusion service or a local sandbox.

Config keys are verl's `SandboxFusionTool` ones (sandbox_fusion_url, num_workers, default_timeout,
default_language, memory_limit_mb, enable_global_rate_limit, rate_limit) plus max_output_chars and
request_timeout_s. With `sandbox_fusion_url` set, code is POSTed there (SandboxFusion's `run_code`
API, e.g. `hybridflow.tools.sandbox_server`); without it, it runs in `hybridflow.tools.sandbox`.
Whatever goes wrong (bad arguments, an unreachable sandbox) becomes text for the model, never an
exception in the agent loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import urllib.error
import urllib.request
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridflow.tools.base import BaseTool, OpenAIFunctionToolSchema, ToolResponse
from hybridflow.tools.sandbox import RunResult, SandboxPool
from hybridflow.tools.sandbox_server import result_from_response

logger = logging.getLogger(__name__)

DEFAULT_TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run a Python program in a sandbox (no network, a private scratch directory) and "
                       "return what it prints to stdout and stderr.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python program to run; print results."}},
            "required": ["code"],
        },
    },
}


class CodeInterpreterConfig(BaseModel):
    """The tool's config (tools[].config in verl's tool-config YAML)."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(default="native", description="verl's tool type; only 'native' tools exist here.")
    sandbox_fusion_url: str = Field(
        default="", description="SandboxFusion run_code endpoint (http://host:8080/run_code); empty: run locally.")
    num_workers: int = Field(default=10, ge=1, description="Runs one tool instance makes at once.")
    default_timeout: float = Field(default=30, gt=0, description="run_timeout in seconds; a call may ask for less.")
    default_language: str = Field(default="python", description="Language when a call names none.")
    memory_limit_mb: int = Field(default=1024, ge=32, description="Address-space limit of the program, in MB.")
    enable_global_rate_limit: bool = Field(
        default=True, description="Share `rate_limit` concurrent runs among all code-interpreter tools of this "
                                  "process (verl shares it cluster-wide through a Ray actor; here it is per process).")
    rate_limit: int = Field(default=10, ge=1, description="Concurrent runs allowed by the shared limit.")
    max_output_chars: int = Field(default=8000, ge=100, description="Longest text returned to the model.")
    request_timeout_s: float = Field(default=60, gt=0, description="Seconds to wait for a remote sandbox beyond run_timeout.")


_PROCESS_LIMITS: dict[int, threading.BoundedSemaphore] = {}
_PROCESS_LIMITS_LOCK = threading.Lock()


def _process_limit(size: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore of the given size (one per distinct rate_limit)."""
    with _PROCESS_LIMITS_LOCK:
        return _PROCESS_LIMITS.setdefault(size, threading.BoundedSemaphore(size))


class CodeInterpreterTool(BaseTool):
    """verl's SandboxFusionTool, able to run without the service (in the local sandbox)."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None = None) -> None:
        try:
            self.settings = CodeInterpreterConfig.model_validate(dict(config or {}))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"code_interpreter tool config is invalid ({problems}); valid keys: "
                             f"{', '.join(CodeInterpreterConfig.model_fields)}") from None
        super().__init__(config, tool_schema)
        self._gate = _process_limit(self.settings.rate_limit) if self.settings.enable_global_rate_limit else None
        self._pool = None if self.settings.sandbox_fusion_url else SandboxPool(self.settings.num_workers, gate=self._gate)
        self._slots = asyncio.Semaphore(self.settings.num_workers)

    @property
    def runs_locally(self) -> bool:
        """Whether code runs in this process's local sandbox (no sandbox_fusion_url)."""
        return self._pool is not None

    def use_sandbox_service(self, url: str) -> None:
        """Run code at the SandboxFusion endpoint `url` from now on instead of the local sandbox.

        The trainer calls it when the RLJob has a sandbox role (hybridflow.controller.sandbox_service); a tool
        configured with its own sandbox_fusion_url keeps it.
        """
        if self._pool is None:
            raise ValueError(f"{self.name} already runs code at {self.settings.sandbox_fusion_url}; only a tool without "
                             "sandbox_fusion_url is pointed at the sandbox role's servers")
        self.settings = self.settings.model_copy(update={"sandbox_fusion_url": url})
        pool, self._pool = self._pool, None
        pool.close()

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The default schema: `code_interpreter(code: str)`."""
        return OpenAIFunctionToolSchema.model_validate(DEFAULT_TOOL_SCHEMA)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run `parameters["code"]`; the text is its stdout then stderr, with a note on how it ended."""
        code = parameters.get("code") if isinstance(parameters, dict) else None
        if not isinstance(code, str) or not code.strip():
            got = "nothing" if code is None else f"a {type(code).__name__}" if not isinstance(code, str) else "an empty string"
            text = (f"Error: {self.name} needs a non-empty string argument 'code' with the Python program to run "
                    f"(got {got}); call it again like {{\"code\": \"print(1 + 1)\"}}.")
            return ToolResponse(text=text), 0.0, {"status": "InvalidArguments"}
        timeout = self._timeout(parameters.get("timeout"))
        language = parameters.get("language")
        language = language if isinstance(language, str) and language else self.settings.default_language
        if self._pool is not None:
            result = await self._pool.run(code, language=language, run_timeout=timeout,
                                          memory_limit_mb=self.settings.memory_limit_mb)
        else:
            async with self._slots:
                result = await asyncio.to_thread(self._post_gated, code, language, timeout)
        metrics = {
            "status": result.status, "return_code": result.return_code, "execution_time": result.execution_time,
            "limits_hit": list(result.limits_hit), "isolation": result.isolation,
            "sandbox": "local" if self._pool is not None else "remote", "sandbox_error": result.sandbox_error is not None,
        }
        return ToolResponse(text=format_tool_text(result, self.settings.max_output_chars)), 0.0, metrics

    def _timeout(self, requested: Any) -> float:
        """The call's run_timeout: what the model asked for, never more than default_timeout."""
        if isinstance(requested, (int, float)) and not isinstance(requested, bool) and requested > 0:
            return min(float(requested), self.settings.default_timeout)
        return self.settings.default_timeout

    def _post_gated(self, code: str, language: str, timeout: float) -> RunResult:
        if self._gate is None:
            return self._post(code, language, timeout)
        with self._gate:
            return self._post(code, language, timeout)

    def _post(self, code: str, language: str, timeout: float) -> RunResult:
        """POST to the SandboxFusion endpoint; every failure becomes an Error result saying what happened."""
        url = self.settings.sandbox_fusion_url
        payload = {"code": code, "language": language, "run_timeout": timeout, "compile_timeout": timeout,
                   "memory_limit_MB": self.settings.memory_limit_mb, "stdin": None}
        request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout + self.settings.request_timeout_s) as response:
                body = json.loads(response.read())
            return result_from_response(body)
        except urllib.error.HTTPError as exc:
            detail = _error_detail(exc)
            return _failure(f"the code sandbox at {url} refused the request (HTTP {exc.code}: {detail})")
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            logger.warning("code sandbox %s unreachable (%s): check sandbox_fusion_url and that the service runs",
                           url, reason)
            return _failure(f"the code sandbox at {url} is unreachable ({reason})")
        except ValueError as exc:
            return _failure(f"the code sandbox at {url} sent an invalid response ({exc})")


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read() or b"{}")
    except (ValueError, OSError):
        return exc.reason or "no detail"
    return str(body.get("message") or body.get("detail") or exc.reason) if isinstance(body, dict) else str(body)


def _failure(message: str) -> RunResult:
    return RunResult("Error", None, "", "", 0.0, reason=message, sandbox_error=message, isolation="remote")


def format_tool_text(result: RunResult, max_chars: int) -> str:
    """The tool message: stdout then stderr (head and tail kept when long) and a note unless it just exited."""
    if result.status == "Error":
        return f"Error: the code was not run: {result.sandbox_error or result.reason}"
    text = result.stdout + result.stderr
    if len(text) > max_chars:
        head, tail = max_chars * 2 // 3, max_chars // 3
        text = f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"
    ended_plainly = result.status == "Finished" and not result.limits_hit and (result.return_code or 0) >= 0
    if not ended_plainly:
        note = result.reason
        if result.limits_hit and result.status == "Finished":
            note += f"; limits hit: {', '.join(result.limits_hit)}"
        text += ("" if not text or text.endswith("\n") else "\n") + f"[{note}]"
    return text or "(no output)"
