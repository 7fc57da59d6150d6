"""The SandboxFusion-compatible server (real, on 127.0.0.1) and the code-interpreter tool against it."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from hybridflow.tools.code_interpreter import CodeInterpreterTool, format_tool_text
from hybridflow.tools.sandbox import RunResult
from hybridflow.tools.sandbox_server import ServerSettings, main, serve_in_thread


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server, url = serve_in_thread("127.0.0.1", 0, ServerSettings(max_concurrency=2, max_run_timeout=30))
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


def _post(url: str, body: bytes | dict[str, Any], content_type: str = "application/json") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_successful_run_has_sandbox_fusions_shape(base_url: str) -> None:
    status, body = _post(f"{base_url}/run_code", {"code": "print(6 * 7)", "language": "python", "run_timeout": 5,
                                                  "compile_timeout": 5, "memory_limit_MB": -1, "files": {}})
    assert status == 200
    assert body["status"] == "Success" and body["message"] == "" and body["compile_result"] is None
    run = body["run_result"]
    assert set(run) == {"status", "execution_time", "return_code", "stdout", "stderr"}
    assert (run["status"], run["return_code"], run["stdout"], run["stderr"]) == ("Finished", 0, "42\n", "")
    assert body["sandbox"]["isolation"] in ("root-namespaces", "user-namespaces", "none")


def test_failing_program_and_stdin(base_url: str) -> None:
    status, body = _post(f"{base_url}/run_code", {"code": "import sys\nprint(input())\nsys.exit(2)",
                                                  "language": "python", "stdin": "echo me\n"})
    assert status == 200 and body["status"] == "Failed"
    assert body["run_result"]["return_code"] == 2 and body["run_result"]["stdout"] == "echo me\n"


def test_timeout_is_failed_with_time_limit_exceeded(base_url: str) -> None:
    started = time.monotonic()
    status, body = _post(f"{base_url}/run_code", {"code": "import time\ntime.sleep(60)", "language": "python",
                                                  "run_timeout": 1})
    assert status == 200 and body["status"] == "Failed"
    assert body["run_result"]["status"] == "TimeLimitExceeded" and body["run_result"]["return_code"] is None
    assert body["sandbox"]["limits_hit"] == ["wall_time"]
    assert time.monotonic() - started < 6


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    ({"language": "python"}, 400, "'code' is required"),
    ({"code": 42, "language": "python"}, 400, "'code' must be a string, not int"),
    ({"code": "1", "language": "cpp"}, 400, "language 'cpp' is not supported here; use one of: python"),
    ({"code": "1", "run_timeout": "ten"}, 400, "'run_timeout' must be a number"),
    ({"code": "1", "run_timeout": 1000}, 400, "run_timeout=1000 must be > 0 and <= 30"),
    ({"code": "1", "memory_limit_MB": 1.5}, 400, "'memory_limit_MB' must be an integer"),
    ({"code": "1", "memory_limit_MB": 10**6}, 400, "memory_limit_MB=1000000 must be between 32 and"),
    ({"code": "1", "stdin": 5}, 400, "'stdin' must be a string or null"),
    ({"code": "1", "files": {"a.txt": "aGk="}}, 400, "'files' is not supported by this sandbox"),
    ({"code": "1", "fetch_files": ["out.txt"]}, 400, "'fetch_files' is not supported"),
])
def test_bad_requests_get_400_saying_what_is_wrong(base_url: str, body: Any, status: int, fragment: str) -> None:
    got_status, got = _post(f"{base_url}/run_code", body)
    assert got_status == status and fragment in got["message"], got


def test_unknown_endpoint_and_health(base_url: str) -> None:
    status, body = _post(f"{base_url}/run", {"code": "1"})
    assert status == 404 and "use POST /run_code" in body["message"]
    with urllib.request.urlopen(f"{base_url}/healthz", timeout=10) as response:
        health = json.loads(response.read())
    assert response.status == 200 and health["status"] == "ok" and "network_namespace" in health


def test_cli_rejects_a_bad_concurrency(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--max-concurrency", "0"])
    assert "--max-concurrency=0 must be at least 1" in capsys.readouterr().err


def _call(tool: CodeInterpreterTool, parameters: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    async def scenario() -> tuple[str, dict[str, Any]]:
        instance_id, _ = await tool.create()
        response, reward, metrics = await tool.execute(instance_id, parameters)
        await tool.release(instance_id)
        assert reward == 0.0 and response.text is not None
        return response.text, metrics

    return asyncio.run(scenario())


@pytest.mark.parametrize("where", ["remote", "local"])
def test_tool_runs_code_through_the_server_and_locally(base_url: str, where: str) -> None:
    config = {"sandbox_fusion_url": f"{base_url}/run_code"} if where == "remote" else {}
    tool = CodeInterpreterTool({**config, "type": "native", "num_workers": 2, "default_timeout": 5}, None)
    assert tool.name == "code_interpreter" and tool.tool_schema.function.parameters.required == ["code"]
    text, metrics = _call(tool, {"code": "import sys\nprint(sum(range(10)))\nprint('warn', file=sys.stderr)"})
    assert text == "45\nwarn\n" and metrics["status"] == "Finished" and metrics["sandbox"] == where
    text, metrics = _call(tool, {"code": "import time\ntime.sleep(30)", "timeout": 1})
    assert metrics["status"] == "TimeLimitExceeded" and "wall-clock limit of 1s exceeded" in text
    text, metrics = _call(tool, {"code": "x = bytearray(10 * 2**30)"})
    assert "MemoryError" in text and "limits hit: memory" in text and metrics["limits_hit"] == ["memory"]
    for bad in ({}, {"code": 7}, {"code": "  "}):
        text, metrics = _call(tool, bad)
        assert text.startswith("Error: code_interpreter needs a non-empty string argument 'code'")
        assert metrics == {"status": "InvalidArguments"}


def test_tool_reports_an_unreachable_sandbox_as_text() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/run_code"
    tool = CodeInterpreterTool({"sandbox_fusion_url": url, "request_timeout_s": 5}, None)
    started = time.monotonic()
    text, metrics = _call(tool, {"code": "print(1)"})
    assert text.startswith(f"Error: the code was not run: the code sandbox at {url} is unreachable")
    assert metrics["status"] == "Error" and metrics["sandbox_error"] is True
    assert time.monotonic() - started < 10


def test_tool_reports_a_refused_request_as_text(base_url: str) -> None:
    tool = CodeInterpreterTool({"sandbox_fusion_url": f"{base_url}/run_code", "default_language": "cpp"}, None)
    text, _ = _call(tool, {"code": "int main() {}"})
    assert "refused the request (HTTP 400: language 'cpp' is not supported here" in text


def test_tool_config_is_validated_with_the_valid_keys_listed() -> None:
    with pytest.raises(ValueError, match=r"sandbox_url: Extra inputs are not permitted.*valid keys: type, sandbox_fusion_url"):
        CodeInterpreterTool({"sandbox_url": "http://x"}, None)
    with pytest.raises(ValueError, match="num_workers: Input should be greater than or equal to 1"):
        CodeInterpreterTool({"num_workers": 0}, None)


def test_long_output_keeps_head_and_tail() -> None:
    result = RunResult("Finished", 0, "a" * 600 + "b" * 600, "", 0.1)
    text = format_tool_text(result, 300)
    assert text.startswith("a" * 200) and text.endswith("b" * 100) and "[... 900 characters cut ...]" in text
