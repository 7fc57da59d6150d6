"""How the operator scales: N RLJobs applied over HTTP to the API emulator, with the validating webhook in the path.

    python -m bench.operator_scale [--n 1000] [--concurrency 50] [--no-webhook] [--example PATH] [--probe 500]

One operator process (`python -m rljob_operator.main`) against the HTTP API emulator
(tests/support/kube_emulator.py). With `--webhook` (the default) the chart's own
ValidatingWebhookConfiguration (rendered by the real `helm`) is installed and the operator serves it
with the chart's flags (self-signed certificate in a Secret, caBundle written by the operator); the
emulator calls it over HTTPS for every RLJob create and update, as an API server does
(tests/support/kube_admission.py). Before timing, one invalid RLJob is sent and must be refused, so a
run where admission silently stayed out of the path cannot pass.

The N RLJobs are copies of `--example` (default: the multi-role example, trainer and rollout worker
groups), each with its own experiment name and checkpoint location, any smoke run dropped. An aiohttp
client creates them over HTTP, `--concurrency` requests in flight. Measured:
- time from the first create until every RLJob has a RayJob and a `Validated=True` condition;
- the operator's API requests per RLJob (counted by the emulator; the bench's own creates excluded);
- the operator process's peak RSS;
- create latency (client side: the whole POST, admission included) and webhook latency as the
  emulator sees it (AdmissionReview sent to answer, TLS handshake included), p50/p99 over the calls
  made while the creates ran; the operator's own answer time (its rljob_webhook_duration_seconds);
- the webhook probe: after convergence, `--probe` AdmissionReviews sent straight to the webhook from a
  process of its own, `--concurrency` in flight, over kept connections (as an API server keeps them)
  and with a new TLS connection each (as the emulator dials). The emulator is Python on the same
  cores, so its view includes its own queueing; the probe shows the webhook without it.
Prints a table, then one JSON object as the last line. Targets (issue 15): < 60 s for 1000, < 10
requests per RLJob, < 300 MB, webhook p99 < 100 ms at 50 concurrent applies.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import copy
import json
import math
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp
import yaml

from tests.support.kube_emulator import KubeEmulator
from tests.support.kube_rbac import User

ROOT = pathlib.Path(__file__).resolve().parents[1]
RLJ, VWC = "rl.hybridflow.dev/v1alpha1", "admissionregistration.k8s.io/v1"
#: The namespace the chart is rendered for (the webhook Service and its certificate Secret live there).
OPERATOR_NS = "rljob-system"
#: The multi-role example (trainer + rollout worker groups, spec.roles); the multi-node one where it is missing.
DEFAULT_EXAMPLE = next(p for p in (ROOT / "examples" / "rljob_multirole.yaml", ROOT / "examples" / "rljob_grpo_2node.yaml")
                       if p.exists())
TARGETS = {"seconds": 60.0, "requests_per_rljob": 10.0, "operator_peak_rss_mb": 300.0, "webhook_p99_ms": 100.0,
           "probe_p99_ms": 100.0}


def _peak_rss_mb(pid: int) -> float:
    """Peak resident set size of a live process (VmHWM from /proc), in MB."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by the nearest-rank method; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _done(kube: KubeEmulator) -> tuple[int, int]:
    """(RayJobs, RLJobs with Validated=True), read from the store without copying 2N objects."""
    with kube.store.lock:
        objects = list(kube.store.objects.items())
    rayjobs = sum(1 for (group, plural, _, _), _obj in objects if (group, plural) == ("ray.io", "rayjobs"))
    validated = sum(1 for (group, plural, _, _), obj in objects if plural == "rljobs"
                    and any(c["type"] == "Validated" and c["status"] == "True"
                            for c in (obj.get("status") or {}).get("conditions", [])))
    return rayjobs, validated


def load_template(path: pathlib.Path) -> dict[str, Any]:
    """The example RLJob without its name and smoke run (its first RayJob is then the full attempt's)."""
    job = yaml.safe_load(path.read_text())
    job.pop("status", None)
    (job.get("spec", {}).get("runPolicy") or {}).pop("smokeRun", None)
    return job


def invalid_copy(template: dict[str, Any]) -> dict[str, Any]:
    """A copy only the operator's checks refuse (no schema or CEL rule): /dev/shm above the worker memory."""
    bad = job_copy(template, "bench-invalid")
    bad["spec"]["resources"] = {**(bad["spec"].get("resources") or {}), "memory": "8Gi", "sharedMemory": "16Gi"}
    return bad


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(check: Any, what: str, timeout: float, proc: subprocess.Popen[bytes], log: pathlib.Path) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise RuntimeError(f"the operator exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def job_copy(template: dict[str, Any], name: str) -> dict[str, Any]:
    """The template as RLJob `name`, with its own experiment name and checkpoint location (as real jobs have)."""
    job = copy.deepcopy(template)
    job["metadata"] = {"name": name}
    trainer = job["spec"].setdefault("config", {}).setdefault("trainer", {})
    trainer["experiment_name"] = name
    checkpoint = job["spec"].get("checkpoint") or {}
    if checkpoint.get("uri"):
        checkpoint["uri"] = checkpoint["uri"].rstrip("/") + f"/{name}"
    return job


def webhook_histogram(metrics_text: str) -> collections.Counter[str] | None:
    """The operator's rljob_webhook_duration_seconds from /metrics: cumulative count per bucket bound, sum, count
    (None: no /metrics text)."""
    if not metrics_text:
        return None
    seen: collections.Counter[str] = collections.Counter()
    for line in metrics_text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("rljob_webhook_duration_seconds_bucket{"):
            seen[name.split('le="', 1)[1].split('"', 1)[0]] += float(value)  # type: ignore[assignment]
        elif name.startswith(("rljob_webhook_duration_seconds_sum{", "rljob_webhook_duration_seconds_count{")):
            seen[name.split("{", 1)[0].rsplit("_", 1)[1]] += float(value)  # type: ignore[assignment]
    return seen


def server_times(before: collections.Counter[str] | None, after: collections.Counter[str] | None) -> dict[str, Any]:
    """Requests answered between two scrapes, their mean (ms) and the bucket bound (ms) that holds the p99."""
    if before is None or after is None:
        return {"answered": None, "mean_ms": None, "p99_le_ms": None}
    delta = collections.Counter(after)
    delta.subtract(before)
    count = delta["count"]
    bounds = sorted((float(k), v) for k, v in delta.items() if k not in ("sum", "count"))
    p99 = next((bound for bound, seen in bounds if seen >= 0.99 * count), float("nan")) if count else float("nan")
    return {"answered": int(count), "mean_ms": round(delta["sum"] / count * 1000, 1) if count else None,
            "p99_le_ms": p99 * 1000 if math.isfinite(p99) else None}


def _metrics(port: int) -> str:
    """The operator's /metrics text ("" when it does not answer within a minute: a swamped loop, reported as
    missing figures rather than a lost run)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
            return resp.read().decode()
    except OSError as err:
        print(f"operator /metrics did not answer: {err}", file=sys.stderr)
        return ""


def probe_reviews(kube: KubeEmulator, jobs: list[dict[str, Any]]) -> list[bytes]:
    """AdmissionReview CREATE requests for `jobs`, built as the emulator builds them (objects defaulted, not stored)."""
    from tests.support.kube_admission import Admission, Attributes
    from tests.support.kube_rbac import ADMIN

    rt = kube.rt(RLJ, "rljobs")
    out = []
    for job in jobs:
        preview = kube.store.create(rt, "default", job, dry_run=True)
        attrs = Attributes("CREATE", rt, "default", preview["metadata"]["name"], None, preview, None, ADMIN)
        out.append(json.dumps(Admission._review(attrs)).encode())
    return out


async def _probe(url: str, ca_pem: str, hostname: str, reviews: list[bytes], concurrency: int,
                 keepalive: bool) -> list[float]:
    import ssl

    ctx = ssl.create_default_context(cadata=ca_pem)
    slots = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(force_close=not keepalive, limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(body: bytes) -> float:
            async with slots:
                started = time.monotonic()
                async with session.post(url, data=body, ssl=ctx, server_hostname=hostname,
                                        headers={"Content-Type": "application/json"}) as resp:
                    answer = await resp.json()
                    if resp.status != 200 or not answer["response"]["allowed"]:
                        raise RuntimeError(f"the webhook did not allow a valid RLJob: HTTP {resp.status} {answer}")
                return time.monotonic() - started

        return list(await asyncio.gather(*(one(body) for body in reviews)))


def _child(target: Any, args: tuple[Any, ...], out: Any) -> None:
    try:
        out.send(("ok", target(*args)))
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises it
        out.send(("error", f"{type(err).__name__}: {err}"))


def in_own_process(target: Any, *args: Any, timeout: float = 600.0) -> Any:
    """`target(*args)` in a spawned process of its own (a client apart from the emulator's thread and GIL, as
    kubectl or an API server is); its return value."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(target, args, send))
    child.start()
    try:
        if not receive.poll(timeout):
            raise RuntimeError(f"{target.__name__} gave no answer within {timeout:.0f} s")
        kind, value = receive.recv()
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    if kind != "ok":
        raise RuntimeError(f"{target.__name__} failed: {value}")
    return value


def probe_both(url: str, ca_pem: str, hostname: str, reviews: list[bytes], concurrency: int) -> dict[bool, list[float]]:
    """A new TLS connection per review first (as the emulator dials), then kept connections (as an API server)."""
    return {keepalive: asyncio.run(_probe(url, ca_pem, hostname, reviews, concurrency, keepalive))
            for keepalive in (False, True)}


def create_all_sync(url: str, jobs: list[dict[str, Any]], concurrency: int) -> tuple[float, list[tuple[int, float, str]]]:
    """`create_all` as a plain function (for in_own_process): when it began (time.monotonic, one clock for all
    processes on Linux, so the child's start-up is not timed) and its results."""
    started = time.monotonic()
    return started, asyncio.run(create_all(url, jobs, concurrency))


def probe_webhook(kube: KubeEmulator, reviews: list[bytes], concurrency: int) -> dict[bool, list[float]]:
    """Send `reviews` straight to the operator's webhook, `concurrency` at a time, as an API server would (TLS
    verified against the configuration's caBundle for the Service's name): seconds per review, by keep-alive."""
    import base64

    (vwc,) = kube.list(VWC, "validatingwebhookconfigurations")
    config = vwc["webhooks"][0]["clientConfig"]
    service = config["service"]
    host, port = kube.admission.endpoints[(service["namespace"], service["name"])]
    return in_own_process(probe_both, f"https://{host}:{port}{service.get('path') or ''}",
                          base64.b64decode(config["caBundle"]).decode(),
                          f"{service['name']}.{service['namespace']}.svc", reviews, concurrency)


def install_chart_webhook(kube: KubeEmulator) -> tuple[list[str], str]:
    """Install the chart's ValidatingWebhookConfiguration; the operator flags that serve it on a free port, and
    the username of the chart's ServiceAccount (its matchCondition keeps that user's writes from the webhook)."""
    from tests.support import binaries
    from tests.support.helm import CHART, render

    objs = render(binaries.ensure("helm"), CHART)
    (vwc,) = [o for o in objs if o["kind"] == "ValidatingWebhookConfiguration"]
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    kube.create(VWC, "validatingwebhookconfigurations", vwc)
    port = _free_port()
    service = vwc["webhooks"][0]["clientConfig"]["service"]
    kube.admission.endpoints[(service["namespace"], service["name"])] = ("127.0.0.1", port)
    chart_flags = [a for a in container["args"] if a.startswith("--webhook-") and not a.startswith("--webhook-port")]
    account = f"system:serviceaccount:{service['namespace']}:{deployment['spec']['template']['spec']['serviceAccountName']}"
    return [f"--webhook-port={port}", "--webhook-address=127.0.0.1", *chart_flags], account


async def create_all(url: str, jobs: list[dict[str, Any]], concurrency: int) -> list[tuple[int, float, str]]:
    """POST every RLJob, `concurrency` at a time; (HTTP status, seconds, error text) per create, in order."""
    path = f"{url}/apis/{RLJ}/namespaces/default/rljobs"
    slots = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def one(job: dict[str, Any]) -> tuple[int, float, str]:
            body = json.dumps(job).encode()
            async with slots:
                started = time.monotonic()
                async with session.post(path, data=body, headers={"Content-Type": "application/json"}) as resp:
                    text = await resp.text()
                    return resp.status, time.monotonic() - started, "" if resp.status == 201 else text[:500]

        return list(await asyncio.gather(*(one(job) for job in jobs)))


def run_benchmark(n: int, timeout: float = 300.0, webhook: bool = True, concurrency: int = 50,
                  example: pathlib.Path = DEFAULT_EXAMPLE, probe: int = 500) -> dict[str, Any]:
    """Run the benchmark once and return its measurements."""
    template = load_template(example)
    kube = KubeEmulator(crd_files=sorted((ROOT / "crds").glob("*.yaml")),
                        namespaces=("default", "kube-system", OPERATOR_NS)).start()
    with tempfile.TemporaryDirectory() as tmp:
        extra, account = install_chart_webhook(kube) if webhook else ([], "")
        # The operator authenticates as the chart's ServiceAccount, as in its pod (in system:masters: RBAC is
        # tests/integration/test_operator_rbac.py's subject, not this benchmark's).
        token = kube.add_token(User(account, ("system:masters", "system:authenticated"))) if account else "emulator-token"
        kubeconfig = kube.write_kubeconfig(pathlib.Path(tmp) / "kubeconfig", token=token)
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(ROOT), "POD_NAMESPACE": OPERATOR_NS}
        log_path = pathlib.Path(tmp) / "operator.log"
        log = log_path.open("wb")
        metrics_port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "rljob_operator.main", "--standalone", "-A",
                                 "--metrics-port", str(metrics_port), *extra], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            # Let kopf start and settle, so only per-RLJob traffic is counted.
            _wait(lambda: kube.count_requests(("watch",), "rayjobs") > 0, "kopf's RayJob watch", 60, proc, log_path)
            refused = ""
            if webhook:
                port = int(extra[0].split("=")[1])
                _wait(lambda: _listening(port), "the webhook server", 60, proc, log_path)
                (status, _, refused), = asyncio.run(create_all(kube.url, [invalid_copy(template)], 1))
                if status == 201 or "denied the request" not in refused:
                    raise RuntimeError(f"the webhook did not refuse an invalid RLJob (HTTP {status}): {refused}")
            time.sleep(0.5)
            baseline = collections.Counter(kube.request_counts)
            calls_before = len(kube.admission.calls)
            before = webhook_histogram(_metrics(metrics_port))
            jobs = [job_copy(template, f"bench-{i:05d}") for i in range(n)]
            start, creates = in_own_process(create_all_sync, kube.url, jobs, concurrency, timeout=timeout)
            created_s = time.monotonic() - start
            calls_during_creates = len(kube.admission.calls)
            progress, shown = (0, 0), start
            while time.monotonic() - start < timeout:
                progress = _done(kube)
                if progress == (n, n):
                    break
                if time.monotonic() - shown >= 10:  # a run that times out still shows how far it got
                    shown = time.monotonic()
                    print(f"{shown - start:6.1f} s: {progress[0]} RayJobs, {progress[1]} validated, load average "
                          f"{os.getloadavg()[0]:.2f}", file=sys.stderr)
                time.sleep(0.25)
            elapsed = time.monotonic() - start
            time.sleep(1.0)  # let trailing events (RayJob ADDED -> owner reconcile) finish
            counts = collections.Counter(kube.request_counts)
            counts.subtract(baseline)
            counts[("create", "rljobs")] -= len(creates)  # ours, not the operator's
            calls = kube.admission.calls[calls_before:]
            probe_ms: dict[bool, list[float]] = {False: [], True: []}
            if webhook:
                server = server_times(before, webhook_histogram(_metrics(metrics_port)))
                if probe:
                    reviews = probe_reviews(kube, [job_copy(template, f"probe-{i:05d}") for i in range(probe)])
                    probe_ms = {keep: [s * 1000 for s in seconds]
                                for keep, seconds in probe_webhook(kube, reviews, concurrency).items()}
            rss = _peak_rss_mb(proc.pid)
            sample = kube.list("ray.io/v1", "rayjobs")[:1]
            groups = [g.get("groupName") for g in ((sample[0]["spec"].get("rayClusterSpec") or {})
                                                   .get("workerGroupSpecs") or [])] if sample else []
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
            kube.stop()
    by_verb = {f"{verb} {plural}": count for (verb, plural), count in sorted(counts.items()) if count}
    failed = [(status, text) for status, _, text in creates if status != 201]
    create_ms = [s * 1000 for _, s, _ in creates]
    window_ms = [c.seconds * 1000 for c in calls[:calls_during_creates - calls_before]]
    all_ms = [c.seconds * 1000 for c in calls]
    result: dict[str, Any] = {
        "n": n, "webhook": webhook, "concurrency": concurrency, "example": str(example.relative_to(ROOT) if example.is_relative_to(ROOT) else example),
        "rayjob_worker_groups": groups, "completed": progress == (n, n) and not failed, "rayjobs": progress[0], "validated": progress[1],
        "create_failures": len(failed), "first_failure": failed[0] if failed else None,
        "create_seconds": round(created_s, 2), "seconds": round(elapsed, 2),
        "requests_per_rljob": round(sum(counts.values()) / max(n, 1), 2),
        "operator_peak_rss_mb": round(rss, 1), "requests_by_verb": by_verb,
        "create_p50_ms": round(percentile(create_ms, 50), 1), "create_p99_ms": round(percentile(create_ms, 99), 1),
    }
    if webhook:
        outcomes = collections.Counter(c.outcome for c in calls)
        result.update({
            "invalid_refused": bool(refused), "webhook_calls": len(calls),
            "webhook_calls_per_rljob": round(len(calls) / max(n, 1), 2), "webhook_outcomes": dict(outcomes),
            "webhook_p50_ms": round(percentile(window_ms, 50), 1), "webhook_p99_ms": round(percentile(window_ms, 99), 1),
            "webhook_max_ms": round(max(window_ms, default=float("nan")), 1),
            "webhook_all_p99_ms": round(percentile(all_ms, 99), 1),
            # The operator's own view (rljob_webhook_duration_seconds), over the whole run.
            "webhook_operator_answered": server["answered"], "webhook_operator_mean_ms": server["mean_ms"],
            "webhook_operator_p99_le_ms": server["p99_le_ms"],
            # Straight to the webhook after convergence, `concurrency` reviews in flight, from a process of its own:
            # kept connections (as an API server keeps them) and a new TLS connection per review (as the emulator).
            "probe_reviews": len(probe_ms[True]), "probe_p50_ms": round(percentile(probe_ms[True], 50), 1),
            "probe_p99_ms": round(percentile(probe_ms[True], 99), 1),
            "probe_new_tls_p50_ms": round(percentile(probe_ms[False], 50), 1),
            "probe_new_tls_p99_ms": round(percentile(probe_ms[False], 99), 1),
        })
    result["targets_met"] = {key: bool(result[key] < limit) for key, limit in TARGETS.items() if key in result}
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print the table and the JSON line."""
    p = argparse.ArgumentParser(prog="python -m bench.operator_scale", description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1000, help="number of RLJobs (default 1000)")
    p.add_argument("--concurrency", type=int, default=50, help="creates in flight at once (default 50)")
    p.add_argument("--webhook", action=argparse.BooleanOptionalAction, default=True,
                   help="put the operator's validating webhook in the path (default on; needs the helm binary)")
    p.add_argument("--example", type=pathlib.Path, default=DEFAULT_EXAMPLE,
                   help=f"the RLJob to copy (default {DEFAULT_EXAMPLE.relative_to(ROOT)}; a smoke run is dropped)")
    p.add_argument("--probe", type=int, default=500, metavar="K",
                   help="after convergence, send K AdmissionReviews straight to the webhook, --concurrency at a "
                        "time, from a process of its own (default 500; 0: skip)")
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    args = p.parse_args(argv)
    if args.n < 1 or args.concurrency < 1:
        p.error("--n and --concurrency must be at least 1")
    result = run_benchmark(args.n, args.timeout, args.webhook, args.concurrency, args.example.resolve(), args.probe)
    met = result["targets_met"]

    def mark(key: str) -> str:
        return "" if key not in met else f"  (target < {TARGETS[key]:g}: {'met' if met[key] else 'MISSED'})"

    rows = [("RLJobs", result["n"], ""), ("example", result["example"], ""),
            ("worker groups per RayJob", ", ".join(map(str, result["rayjob_worker_groups"])), ""),
            ("webhook in the path", result["webhook"], ""), ("creates in flight", result["concurrency"], ""),
            ("all children + Validated", result["completed"], ""),
            ("time to create all (s)", result["create_seconds"], ""),
            ("time to converge (s)", result["seconds"], mark("seconds")),
            ("API requests per RLJob", result["requests_per_rljob"], mark("requests_per_rljob")),
            ("operator peak RSS (MB)", result["operator_peak_rss_mb"], mark("operator_peak_rss_mb")),
            ("create p50 / p99 (ms)", f"{result['create_p50_ms']} / {result['create_p99_ms']}", "")]
    if result["webhook"]:
        rows += [("webhook p50 / p99 (ms)", f"{result['webhook_p50_ms']} / {result['webhook_p99_ms']}",
                  mark("webhook_p99_ms")),
                 ("  operator side mean / p99", f"{result['webhook_operator_mean_ms']} / "
                                                f"<= {result['webhook_operator_p99_le_ms']}", ""),
                 ("webhook calls per RLJob", result["webhook_calls_per_rljob"], "")]
        if result["probe_reviews"]:
            rows += [("webhook probe p50 / p99 (ms)", f"{result['probe_p50_ms']} / {result['probe_p99_ms']}",
                      mark("probe_p99_ms")),
                     ("  new TLS each p50 / p99", f"{result['probe_new_tls_p50_ms']} / {result['probe_new_tls_p99_ms']}",
                      "")]
    for label, value, note in rows:
        print(f"{label:<28} {value}{note}")
    for key, count in result["requests_by_verb"].items():
        print(f"  {key:<26} {count}")
    print(json.dumps(result, sort_keys=True))
    return 0 if result["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
