"""Asynchronous vs synchronous GRPO steps per minute on the demo's toy task, split placement.

    python -m bench.async_step [--steps 30] [--batch 32] [--n 8] [--micro 64] [--out outputs/bench/async_step]

The same model (the demo's tiny model), data, batch, group size, optimizer and number of steps, with the
rollout on a vLLM AsyncLLM replica of its own (trainer.placement=split: one core for the rollout replica, one
for the FSDP2 trainer process on a 2-core box) in three modes:
(a) sync: generate, then train, then push the weights (`async_training.mode=sync`, server-mode rollout);
(b) one_step_off: step k+1's batch is generated with the weights of step k-1 while step k trains;
(c) fully_async: groups stream into a bounded queue (staleness_threshold 0.5, partial rollout).
Each mode runs `python -m hybridflow.trainer.main_ppo examples/tiny_grpo_async.yaml` in a fresh process;
steps per minute are read from the JSONL metrics (the sum of `timing_s/step` after the first step, so the
engine start-up and the first, un-overlapped generation are left out), with the reward curve of each mode.
Prints a table, the reward curves, and last one JSON line with `async_over_sync` (one-step-off) and
`fully_async_over_sync`. Target (issue 16): >= 1.5. vLLM-CPU binds threads to its core: run it on a quiet
machine and read the numbers as this machine's; a GPU box takes larger shapes through the same flags.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny_grpo_async.yaml"
MODES = {
    "sync": ["async_training.mode=sync"],  # the same decoupled correction: pi_old recomputed, IS weights ~1
    "one_step_off": ["async_training.mode=one_step_off"],
    "fully_async": ["async_training.mode=fully_async", "async_training.staleness_threshold=0.5",
                    "async_training.partial_rollout=true"],
}


#: Which process a CPU second belongs to, by command line (Ray actors are named `ray::<Class>...`).
ROLES = (("rollout", ("RolloutReplica", "EngineCore", "VllmWorker")), ("trainer", ("ActorRolloutRefWorker",)),
         ("driver", ("hybridflow.trainer.main_ppo",)))


class CpuProfile:
    """CPU seconds (user + system) per role over a run: the driver (agent loops, router client, reward,
    batching), the trainer process, the rollout replica (vLLM); sampled every 0.5 s, last value per pid."""

    def __init__(self) -> None:
        self.seconds: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        while not self._stop.wait(0.5):
            for proc in psutil.process_iter(["pid", "cmdline", "cpu_times"]):
                cmd = " ".join(proc.info["cmdline"] or [])
                role = next((r for r, marks in ROLES if any(m in cmd for m in marks)), None)
                if role and proc.info["cpu_times"] is not None:
                    times = proc.info["cpu_times"]
                    self.seconds[proc.info["pid"]] = (role, times.user + times.system)

    def __enter__(self) -> CpuProfile:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def by_role(self) -> dict[str, float]:
        """CPU seconds per role."""
        out = {role: 0.0 for role, _ in ROLES}
        for role, seconds in self.seconds.values():
            out[role] += seconds
        return out


def run_mode(name: str, base: dict[str, str], args: argparse.Namespace, out: Path) -> tuple[list[dict], dict[str, float]]:
    """Train in one mode; return its JSONL metric rows and CPU seconds per role."""
    root = out / name
    shutil.rmtree(root, ignore_errors=True)  # a previous run's metrics.jsonl would be appended to
    overrides = {**base, "trainer.default_local_dir": str(root), "trainer.total_training_steps": str(args.steps),
                 "data.train_batch_size": str(args.batch), "actor_rollout_ref.rollout.n": str(args.n),
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": str(args.micro),
                 "trainer.save_freq": "-1", "trainer.test_freq": "-1", "trainer.val_before_train": "false",
                 "trainer.logger": "[file]"}
    cmd = [sys.executable, "-m", "hybridflow.trainer.main_ppo", str(EXAMPLE),
           *(f"{k}={v}" for k, v in overrides.items()), *MODES[name]]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "trainer_image"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with (out / f"{name}.log").open("w") as log, CpuProfile() as profile:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed; see {out / f'{name}.log'}")
    rows = [json.loads(line) for line in (root / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, profile.by_role()


def summarize(rows: list[dict]) -> dict[str, float]:
    """Steps per minute after the first step, mean phase times, first and last rewards."""
    steps = [r for r in rows if "timing_s/step" in r]
    timed = steps[1:]
    seconds = sum(r["timing_s/step"] for r in timed)
    scores = [r["critic/score/mean"] for r in steps]

    def mean(key: str) -> float:
        return sum(r.get(key, 0.0) for r in timed) / max(len(timed), 1)

    return {"steps_per_minute": 60.0 * len(timed) / seconds, "step_s": seconds / len(timed), "wait_s": mean("timing_s/gen"),
            "update_s": mean("timing_s/update_actor"), "reward_first3": sum(scores[:3]) / 3,
            "reward_last5": sum(scores[-5:]) / 5, "staleness_max": max(r.get("fully_async/trajectory_staleness/max", 0.0)
                                                                       for r in steps)}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the three modes, print the table, the curves, and the JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench.async_step", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--micro", type=int, default=64, help="actor micro-batch rows")
    parser.add_argument("--out", default=str(ROOT / "outputs" / "bench" / "async_step"))
    args = parser.parse_args(argv)
    sys.path[:0] = [str(ROOT / "trainer_image"), str(ROOT)]
    from hybridflow.demo import prepare

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in prepare(out / "demo").items() if k != "trainer.default_local_dir"}
    runs = {name: run_mode(name, base, args, out) for name in MODES}
    results = {name: rows for name, (rows, _) in runs.items()}
    summary = {name: summarize(rows) for name, rows in results.items()}
    print(f"{'mode':<14}{'steps/min':>10}{'step s':>9}{'wait s':>9}{'update s':>10}{'reward 1-3':>12}"
          f"{'reward last5':>14}{'max lag':>9}")
    for name, s in summary.items():
        print(f"{name:<14}{s['steps_per_minute']:>10.1f}{s['step_s']:>9.2f}{s['wait_s']:>9.2f}{s['update_s']:>10.2f}"
              f"{s['reward_first3']:>12.3f}{s['reward_last5']:>14.3f}{s['staleness_max']:>9.0f}")
    print("CPU seconds per step by process (whole run incl. start-up / steps):")
    for name, (_, cpu) in runs.items():
        print(f"  {name:<14}" + "  ".join(f"{role} {seconds / args.steps:.2f}" for role, seconds in cpu.items()))
    for name, rows in results.items():
        curve = [round(r["critic/score/mean"], 2) for r in rows if "critic/score/mean" in r]
        print(f"reward by step, {name}: {curve}")
    sync = summary["sync"]["steps_per_minute"]
    print(json.dumps({
        "steps": args.steps, "batch": args.batch, "n": args.n,
        **{f"{name}_steps_per_minute": round(s["steps_per_minute"], 2) for name, s in summary.items()},
        "async_over_sync": round(summary["one_step_off"]["steps_per_minute"] / sync, 3),
        "fully_async_over_sync": round(summary["fully_async"]["steps_per_minute"] / sync, 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
