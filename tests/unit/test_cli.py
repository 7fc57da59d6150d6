"""Tests for the `rljob` CLI (operator/rljob_operator/cli.py): validate, render, dispatch."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rljob_operator import cli

REPO = Path(__file__).resolve().parents[2]
GPU_EXAMPLE = REPO / "examples" / "rljob_gsm8k_qwen.yaml"
CPU_EXAMPLE = REPO / "examples" / "rljob_cpu_tiny.yaml"


def _invalid_job() -> dict:
    job = yaml.safe_load(CPU_EXAMPLE.read_text())
    job["metadata"]["name"] = "broken"
    job["spec"]["resources"]["memory"] = "8GB"
    job["spec"]["config"]["trainer"]["nnode"] = 2
    return job


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("validate", "render", "operator"):
        assert f"  {name}" in out


def test_no_command_prints_usage_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "usage: rljob COMMAND" in capsys.readouterr().out


def test_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["valdate"]) == 2
    assert "unknown command 'valdate'; choose one of validate, render, operator" in capsys.readouterr().err


def _fake_command(argv: list[str]) -> int:
    print(f"fake got {argv}")
    return 7


def test_dispatch_table_passes_the_remaining_argv(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(cli.COMMANDS, "fake", cli.Command("a test command", f"{__name__}:_fake_command"))
    assert cli.main(["fake", "--flag", "x"]) == 7
    assert "fake got ['--flag', 'x']" in capsys.readouterr().out


def test_unavailable_command_says_so(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(cli.COMMANDS, "gone", cli.Command("missing", "rljob_operator.no_such_module:run"))
    assert cli.main(["gone"]) == 2
    assert "rljob gone: not available in this installation" in capsys.readouterr().err


def test_validate_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", "-f", str(GPU_EXAMPLE), "-f", str(CPU_EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "(RLJob/gsm8k-qwen-grpo): valid" in out
    assert "(RLJob/tiny-cpu-grpo): valid" in out


def test_validate_lists_every_problem_per_document(tmp_path: Path, capsys) -> None:
    good = yaml.safe_load(CPU_EXAMPLE.read_text())
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump_all([good, secret, _invalid_job()]))
    assert cli.main(["validate", "-f", str(path)]) == 1
    out = capsys.readouterr().out
    assert "document 1 (RLJob/tiny-cpu-grpo): valid" in out
    assert "document 2 (Secret/s): skipped (not an RLJob)" in out
    assert "document 3 (RLJob/broken): invalid (2 problems):" in out
    assert "  - spec.resources.memory: '8GB' is not a Kubernetes quantity" in out
    assert "  - spec.config.trainer.nnode: unknown key; did you mean nnodes?" in out


def test_validate_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(GPU_EXAMPLE.read_text()))
    assert cli.main(["validate", "-f", "-"]) == 0
    assert "-: document 1 (RLJob/gsm8k-qwen-grpo): valid" in capsys.readouterr().out


@pytest.mark.parametrize(
    "content, message, code",
    [
        (None, "cannot read", cli.EXIT_UNREADABLE),
        ("a: [unclosed", "not valid YAML", cli.EXIT_UNREADABLE),
        (b"kind: RLJob\nname: caf\xe9\n", "not UTF-8 text", cli.EXIT_UNREADABLE),
        ("kind: RLJob\nkind: RLJob\n", "line 2, column 1: duplicate key 'kind' (first at line 1)", cli.EXIT_UNREADABLE),
        ("a: " + "[" * 500 + "]" * 500, "nested deeper than 100 levels", cli.EXIT_UNREADABLE),
        ("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
            f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefg", "bcdefgh", strict=True)),
         "aliases (*name) expand to more than 100,000 values", cli.EXIT_UNREADABLE),
        ("apiVersion: v1\nkind: ConfigMap\n", "no RLJob found", cli.EXIT_INVALID),
    ],
)
def test_validate_file_problems(tmp_path: Path, capsys, content: str | bytes | None, message: str, code: int) -> None:
    path = tmp_path / "job.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert cli.main(["validate", "-f", str(path)]) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_validate_fails_on_any_bad_document(tmp_path: Path, capsys) -> None:
    """A list, a scalar, a mapping without kind or a near miss of RLJob is invalid, never skipped (issue 12)."""
    good = yaml.safe_load(CPU_EXAMPLE.read_text())
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump_all([good, [1, 2], "text", {"metadata": {"name": "x"}},
                                        {**good, "kind": "RLjob"}, {"apiVersion": "v1", "kind": "Secret"}]))
    assert cli.main(["validate", "-f", str(path)]) == cli.EXIT_INVALID
    out = capsys.readouterr().out
    assert "document 1 (RLJob/tiny-cpu-grpo): valid" in out
    assert "document 2: invalid (1 problem):\n  - <document>: expected a Kubernetes object" in out
    assert "document 3: invalid" in out
    assert "document 4 (?/x): invalid (1 problem):\n  - kind: missing or not a string; set kind: RLJob" in out
    assert "document 5 (RLjob/tiny-cpu-grpo): invalid (1 problem):\n  - kind: 'RLjob' is not a kind of " \
           "rl.hybridflow.dev; did you mean RLJob?" in out
    assert "document 6 (Secret/?): skipped (not an RLJob)" in out


def test_an_unexpected_exception_is_a_bug_report(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    def broken(doc: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(cli, "check_rljob", broken)
    assert cli.main(["validate", "-f", str(CPU_EXAMPLE)]) == cli.EXIT_BUG == 4
    err = capsys.readouterr().err
    assert f"rljob validate: internal error while checking {CPU_EXAMPLE}: document 1 (RLJob/tiny-cpu-grpo): " \
           "RecursionError: maximum recursion depth exceeded" in err
    assert "This is a bug, please report it" in err and "Traceback" not in err


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["validate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 every document is valid; 1 a document is invalid" in out
    assert "3 a file could not be read" in out and "4 internal error" in out


def test_render_prints_a_free_form_value_as_deep_as_the_loader_allows(tmp_path: Path, capsys) -> None:
    """Issue 12: a deep free-form value used to validate and then crash printing (RecursionError)."""
    job = yaml.safe_load(CPU_EXAMPLE.read_text())
    deep: object = 1
    for _ in range(95):  # spec.config.reward_model.reward_kwargs is 4 levels: 99 in all
        deep = {"a": deep}
    job["spec"]["config"].setdefault("custom_reward_function", {})["reward_kwargs"] = deep
    path = tmp_path / "deep.yaml"
    path.write_text(yaml.safe_dump(job))
    assert cli.main(["validate", "-f", str(path)]) == 0
    assert cli.main(["render", "-f", str(path)]) == 0
    assert "a:" in capsys.readouterr().out


def test_validate_requires_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["validate"])
    assert exit_.value.code == 2
    assert "-f/--filename" in capsys.readouterr().err


def test_render_prints_children_deterministically(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", "-f", str(GPU_EXAMPLE), "--attempt", "3"]) == 0
    first = capsys.readouterr().out
    assert cli.main(["render", "-f", str(GPU_EXAMPLE), "--attempt", "3"]) == 0
    assert capsys.readouterr().out == first
    assert first.startswith("# Rendered offline by `rljob render` (attempt 3); nothing was applied.")
    assert cli.PLACEHOLDER_UID in first.splitlines()[1]
    docs = list(yaml.safe_load_all(first))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("ConfigMap", "gsm8k-qwen-grpo-config"),
        ("RayJob", "gsm8k-qwen-grpo-a3"),
    ]
    assert docs[1]["metadata"]["ownerReferences"][0]["uid"] == cli.PLACEHOLDER_UID
    config = yaml.safe_load(docs[0]["data"]["config.yaml"])
    assert config["trainer"]["default_local_dir"] == "s3://my-rl-bucket/checkpoints/gsm8k-qwen-grpo"
    limits = docs[1]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert limits["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_render_prints_the_smoke_run_before_the_attempt(capsys: pytest.CaptureFixture[str]) -> None:
    example = GPU_EXAMPLE.parent / "rljob_grpo_2node.yaml"
    assert cli.main(["render", "-f", str(example)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("ConfigMap", "gsm8k-qwen7b-grpo-2node-config"),
        ("RayJob", "gsm8k-qwen7b-grpo-2node-smoke"),
        ("RayJob", "gsm8k-qwen7b-grpo-2node-a1"),
    ]
    configmap, smoke, attempt = docs
    assert "smoke-config.yaml" in configmap["data"]
    entry = smoke["spec"]["entrypoint"]
    assert "smoke-config.yaml" in entry and "trainer.resume_mode=disable" in entry and "/smoke-run" in entry
    assert "rl.hybridflow.dev/smoke-run-spec" in smoke["metadata"]["annotations"]
    assert "rl.hybridflow.dev/smoke-run-spec" not in attempt["metadata"].get("annotations", {})
    workers = [g.get("replicas") for g in smoke["spec"]["rayClusterSpec"]["workerGroupSpecs"]]
    full = [g.get("replicas") for g in attempt["spec"]["rayClusterSpec"]["workerGroupSpecs"]]
    assert sum(workers) < sum(full)  # one node, not the full job's


def test_render_uses_the_operators_default_image_unless_the_rljob_pins_one(tmp_path: Path, capsys) -> None:
    job = yaml.safe_load(CPU_EXAMPLE.read_text())
    pinned = {**job, "metadata": {**job["metadata"], "name": "pinned"}, "spec": {**job["spec"], "image": "team/t:1"}}
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump_all([job, pinned]))
    assert cli.main(["render", "-f", str(path), "--trainer-image", "mirror.local/trainer:0.1.0"]) == 0
    rayjobs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d["kind"] == "RayJob"]
    images = [d["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
              for d in rayjobs]
    assert images == ["mirror.local/trainer:0.1.0", "team/t:1"]


def test_render_applies_the_operators_pod_defaults(tmp_path: Path, capsys) -> None:
    defaults = "{serviceAccountName: rl-trainer, tolerations: [{key: nvidia.com/gpu, operator: Exists}]}"
    assert cli.main(["render", "-f", str(CPU_EXAMPLE), "--pod-defaults", defaults]) == 0
    (rayjob,) = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d["kind"] == "RayJob"]
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == "rl-trainer"
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in head["tolerations"]


@pytest.mark.parametrize(
    ("defaults", "message"),
    [
        ("{serviceAcountName: x}", "serviceAcountName: Extra inputs are not permitted"),
        ("{tolerations: [{key: a, operator: Exists, value: b}]}", "tolerations[0].value: must be empty"),
        ("[unclosed", "not valid YAML or JSON"),
    ],
)
def test_render_refuses_bad_pod_defaults(defaults: str, message: str, capsys) -> None:
    assert cli.main(["render", "-f", str(CPU_EXAMPLE), "--pod-defaults", defaults]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rljob render: --pod-defaults") and message in err


def test_render_keeps_a_real_uid(tmp_path: Path, capsys) -> None:
    job = yaml.safe_load(CPU_EXAMPLE.read_text())
    job["metadata"]["uid"] = "1234-real"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert cli.main(["render", "-f", str(path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert {d["metadata"]["ownerReferences"][0]["uid"] for d in docs} == {"1234-real"}


def test_render_refuses_invalid_jobs(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_invalid_job()))
    assert cli.main(["render", "-f", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "invalid, not rendered" in captured.err and "spec.resources.memory" in captured.err


def test_render_rejects_attempt_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["render", "-f", str(CPU_EXAMPLE), "--attempt", "0"])
    assert "attempts start at 1" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "rljob"
    if not script.exists():
        pytest.skip(f"{script} is not installed (pip install -e . creates it)")
    result = subprocess.run([str(script), "validate", "-f", str(CPU_EXAMPLE)], capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout
