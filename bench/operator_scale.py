"""How the operator scales: N RLJobs against the API emulator, time until all have children and status.

    python -m bench.operator_scale [--n 1000] [--timeout 300]

Measures the time from creating N RLJobs until every one has its RayJob `<name>-a1` and a
`Validated=True` condition, the API requests the operator made per RLJob (counted by the emulator;
the RLJobs themselves are created in-process, not over HTTP), and the operator process's peak RSS.
Prints a table, then one JSON object as the last line. Targets: < 60 s for 1000, < 10 requests per
RLJob, < 300 MB.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

import yaml

from tests.support.kube_emulator import KubeEmulator

ROOT = pathlib.Path(__file__).resolve().parents[1]
RLJ, RAY = "rl.hybridflow.dev/v1alpha1", "ray.io/v1"


def _peak_rss_mb(pid: int) -> float:
    """Peak resident set size of a live process (VmHWM from /proc), in MB."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _done(kube: KubeEmulator) -> tuple[int, int]:
    """(RayJobs, RLJobs with Validated=True), read from the store without copying 2N objects."""
    with kube.store.lock:
        objects = list(kube.store.objects.items())
    rayjobs = sum(1 for (group, plural, _, _), _obj in objects if (group, plural) == ("ray.io", "rayjobs"))
    validated = sum(1 for (group, plural, _, _), obj in objects if plural == "rljobs"
                    and any(c["type"] == "Validated" and c["status"] == "True"
                            for c in (obj.get("status") or {}).get("conditions", [])))
    return rayjobs, validated


def run_benchmark(n: int, timeout: float = 300.0) -> dict[str, Any]:
    """Run the benchmark once and return its measurements."""
    template = yaml.safe_load((ROOT / "examples" / "rljob_cpu_tiny.yaml").read_text())
    kube = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml"))).start()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = kube.write_kubeconfig(pathlib.Path(tmp) / "kubeconfig")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(ROOT)}
        log = open(pathlib.Path(tmp) / "operator.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-m", "rljob_operator.main", "--standalone", "-A",
                                 "--metrics-port", "0"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            # Let kopf start and settle, so only per-RLJob traffic is counted.
            deadline = time.monotonic() + 30
            while kube.count_requests(("watch",), "rayjobs") == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)
            baseline = kube.count_requests()
            start = time.monotonic()
            for i in range(n):
                job = copy.deepcopy(template)
                job["metadata"] = {"name": f"bench-{i:05d}"}
                kube.create(RLJ, "rljobs", job, "default")
            created_s = time.monotonic() - start
            progress = (0, 0)
            while time.monotonic() - start < timeout:
                progress = _done(kube)
                if progress == (n, n):
                    break
                time.sleep(0.5)
            elapsed = time.monotonic() - start
            time.sleep(1.0)  # let trailing events (RayJob ADDED -> owner reconcile) finish
            requests = kube.count_requests() - baseline
            rss = _peak_rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
            kube.stop()
    by_verb: dict[str, int] = {}
    for (verb, plural), count in kube.request_counts.items():
        by_verb[f"{verb} {plural}"] = count
    return {"n": n, "completed": progress[0] == n and progress[1] == n, "rayjobs": progress[0],
            "validated": progress[1], "create_seconds": round(created_s, 2), "seconds": round(elapsed, 2),
            "requests_per_rljob": round(requests / max(n, 1), 2), "operator_peak_rss_mb": round(rss, 1),
            "requests_by_verb": by_verb}


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print the table and the JSON line."""
    p = argparse.ArgumentParser(prog="python -m bench.operator_scale", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1000, help="number of RLJobs (default 1000)")
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    args = p.parse_args(argv)
    result = run_benchmark(args.n, args.timeout)
    rows = [("RLJobs", result["n"]), ("all children + Validated", result["completed"]),
            ("time to converge (s)", result["seconds"]), ("API requests per RLJob", result["requests_per_rljob"]),
            ("operator peak RSS (MB)", result["operator_peak_rss_mb"])]
    for label, value in rows:
        print(f"{label:<28} {value}")
    for key, count in sorted(result["requests_by_verb"].items()):
        print(f"  {key:<26} {count}")
    print(json.dumps(result, sort_keys=True))
    return 0 if result["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
