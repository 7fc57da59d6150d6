"""A seeded fuzzer for the two validating entry points (issue 12): `rljob validate -f` and
`python -m hybridflow.config FILE --for-run`.

Each case starts from a real example (an RLJob manifest or a trainer config), mutates its structure
(hostile values, typos, deep nesting, `${...}` references) and then its YAML text (duplicate keys,
alias bombs, tags, non-UTF-8 bytes, truncation), and runs the entry point in-process with a time
limit. Outcomes: `clean` (rejected with a message: exit 1, 2 or 3), `accepted` (exit 0), `crash`
(a traceback, an escaped exception or the bug-report exit 4) and `hang` (over the time limit).

    python -m tests.support.fuzz --cases 10000 [--seed 0] [--timeout 5]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import random
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RLJOB_EXAMPLE = ROOT / "examples" / "rljob_cpu_tiny.yaml"
CONFIG_EXAMPLE = ROOT / "examples" / "tiny_grpo.yaml"
OUTCOMES = ("clean", "accepted", "crash", "hang")


def _nested(rng: random.Random, depth: int) -> Any:
    value: Any = rng.choice([1, "x", None, [], {}])
    for _ in range(depth):
        value = {"a": value} if rng.random() < 0.5 else [value]
    return value


def _hostile_value(rng: random.Random) -> Any:
    """A value the fuzz of issue 12 found trouble with, or another odd one."""
    makers: list[Callable[[], Any]] = [
        lambda: _nested(rng, rng.choice([5, 99, 150, 300, 600])),
        lambda: "x" * rng.choice([1000, 100_000, 1_000_000]),
        lambda: "9" * rng.choice([10, 4301, 5000]),
        lambda: rng.choice([float("nan"), float("inf"), -float("inf"), -1, 0, 10**30, -(10**30), 1e308, 5e-324]),
        lambda: rng.choice([True, False, None, [], {}, "", " ", "\n", "name\n", "Ünïcödé", "\x00", "\ud800"]),
        lambda: rng.choice(["1e1000000", "1e-1000000", "1000000001", "-1", "0.5", "16Gi", "8GB", "1e3", "∞"]),
        lambda: rng.choice(["s3:/b", "file://", "ftp://x", "s3://", "gs://b/p", "file:///abs", "../x", "~"]),
        lambda: "${" + rng.choice(["trainer.nnodes", "nope", ".x", "..", "oc.select:x,[", "oc.select:x,{",
                                    "oc.env:HOME", "trainer", "", "a.b.c.d"]) + "}",
        lambda: "${x}" * rng.choice([2, 50, 5000]),
        lambda: [rng.random() for _ in range(rng.choice([1, 100, 10_000]))],
        lambda: {f"k{i}": i for i in range(rng.choice([1, 100, 5000]))},
    ]
    return rng.choice(makers)()


def _paths(tree: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths into a tree, down to 12 levels and 50 items per list."""
    yield prefix
    if len(prefix) >= 12:
        return
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree[:50]):
            yield from _paths(value, (*prefix, index))


def _set(tree: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = tree
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return tree


def _reference_storm(rng: random.Random, tree: dict[str, Any], config: dict[str, Any]) -> None:
    """Chains and exponential fan-outs of `${...}` in a free-form group of the trainer config."""
    free = config.setdefault("actor_rollout_ref", {}).setdefault("model", {})
    if not isinstance(free, dict):
        return
    levels = rng.choice([5, 40, 400])
    base = "actor_rollout_ref.model.override_config"
    if rng.random() < 0.5:
        refs = {f"k{i}": f"${{{base}.k{i + 1}}}" for i in range(levels)} | {f"k{levels}": "end"}
    else:
        refs = {"k0": "ab"} | {f"k{i}": f"${{.k{i - 1}}}${{.k{i - 1}}}" for i in range(1, levels)}
    free["override_config"] = refs
    config.setdefault("trainer", {})["project_name"] = f"${{{base}.k0}}"


def mutate_tree(rng: random.Random, tree: dict[str, Any], config_of: Callable[[Any], Any]) -> Any:
    """A few structural mutations of `tree` (config_of(tree): the trainer config inside it)."""
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        paths = list(_paths(tree))
        path = rng.choice(paths)
        action = rng.random()
        try:
            if action < 0.45:
                tree = _set(tree, path, _hostile_value(rng))
            elif action < 0.6 and path:
                parent = tree
                for part in path[:-1]:
                    parent = parent[part]
                if isinstance(parent, dict):
                    value = parent.pop(path[-1])
                    if rng.random() < 0.5:  # a typo of the key
                        key = str(path[-1])
                        parent[key[:-1] if len(key) > 1 else key + "x"] = value
            elif action < 0.75:
                tree = _set(tree, path, [copy.deepcopy(_get(tree, path))])  # a value wrapped in a list
            elif action < 0.85:
                config = config_of(tree)
                if isinstance(config, dict):
                    _reference_storm(rng, tree, config)
            else:
                tree = _set(tree, path, {"unknown_key": _hostile_value(rng)})
        except (KeyError, IndexError, TypeError, AttributeError, RecursionError):
            continue  # the path went away with an earlier mutation, or copying it hit our own limits
    return tree


def _get(tree: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        tree = tree[part]
    return tree


def _bomb(levels: int) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def mutate_text(rng: random.Random, text: str) -> bytes:
    """Text-level damage: duplicate keys, aliases, tags, nesting, truncation, bad bytes."""
    lines = text.splitlines(keepends=True)
    action = rng.random()
    if action < 0.1 and lines:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])  # a duplicate key (or list item)
    elif action < 0.15:
        lines.append(_bomb(rng.choice([3, 6, 9, 12])))
    elif action < 0.25 and lines:
        i = rng.randrange(len(lines))
        tag = rng.choice(["!!float abc", "!!int 0x", "!!binary x", "!!set {a}", "!!timestamp x", "!Custom x",
                          "!!python/object:os.system x", "*undefined", "&a [*a]", "=", "!!str", "? [a]"])
        lines[i] = lines[i].rstrip("\n") + f" {tag}\n" if ":" not in lines[i] else \
            lines[i].split(":", 1)[0] + f": {tag}\n"
    elif action < 0.32:
        lines.append("deep: " + "[" * rng.choice([99, 101, 500, 5000, 100_000]) + "\n")
    elif action < 0.4 and lines:
        cut = rng.randrange(len(text))
        return text[:cut].encode()
    elif action < 0.45:
        data = text.encode()
        i = rng.randrange(len(data) + 1)
        return data[:i] + rng.choice([b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80"]) + data[i:]
    elif action < 0.5:
        lines.insert(0, rng.choice(["---\n", "- 1\n---\n", "just text\n---\n", "%YAML 1.1\n---\n"]))
        lines.append(rng.choice(["---\n- a\n", "---\nkind: RLjob\n", "---\n", "---\n42\n"]))
    elif action < 0.55 and lines:
        i = rng.randrange(len(lines))
        lines[i] = "\t" + lines[i]
    elif action < 0.6 and lines:
        i, j = rng.randrange(len(text)), rng.randrange(len(text))
        return (text[: min(i, j)] + rng.choice("[]{}:&*!|>'\"#%@`,?-") + text[max(i, j):]).encode()
    return "".join(lines).encode()


@dataclass(frozen=True)
class Case:
    """One fuzz input: which entry point, and the file's bytes."""

    target: str  # "rljob" or "config"
    data: bytes


def generate(rng: random.Random) -> Case:
    """One case, from a mutated copy of an example."""
    if rng.random() < 0.5:
        job = yaml.safe_load(RLJOB_EXAMPLE.read_text())
        tree = mutate_tree(rng, job, lambda t: (t.get("spec") or {}).get("config") if isinstance(t, dict) else None)
        target = "rljob"
    else:
        tree = mutate_tree(rng, yaml.safe_load(CONFIG_EXAMPLE.read_text()), lambda t: t)
        target = "config"
    try:
        text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=rng.random() < 0.5, width=10**9)
    except (RecursionError, yaml.YAMLError, ValueError):
        text = "{broken: [}"  # our own generator met its limits: a syntax error case instead
    if rng.random() < 0.6:
        return Case(target, mutate_text(rng, text))
    return Case(target, text.encode("utf-8", "surrogatepass"))


class Hang(BaseException):
    """Raised by SIGALRM inside a case (a BaseException, so no `except Exception` swallows it)."""


def _alarm(_signum: int, _frame: Any) -> None:
    raise Hang()


def run_case(case: Case, path: Path, timeout: float) -> tuple[str, str]:
    """Run one case in-process: (outcome, detail)."""
    from hybridflow import config as hf_config
    from rljob_operator import cli

    path.write_bytes(case.data)
    argv = ["validate", "-f", str(path)] if case.target == "rljob" else [str(path), "--for-run"]
    entry = cli.main if case.target == "rljob" else hf_config.main
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, timeout)  # pytest-timeout may have its own alarm set
    started = time.monotonic()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = entry(argv)
    except Hang:
        return "hang", f"over {timeout:g} s"
    except BaseException as exc:  # noqa: BLE001 - an escaped exception is exactly what we look for
        return "crash", f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer > 0:  # give the outer alarm back what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.001))
    text = out.getvalue() + err.getvalue()
    if code == 4 or "Traceback (most recent call last)" in text:
        return "crash", text[-600:]
    return ("accepted" if code == 0 else "clean"), ""


def fuzz(cases: int, seed: int = 0, timeout: float = 5.0, budget: float | None = None,
         on_problem: Callable[[int, Case, str, str], None] | None = None) -> Counter[str]:
    """Run `cases` cases (or fewer when `budget` seconds run out); the outcome counts."""
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    start = time.monotonic()
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input.yaml"
        for index in range(cases):
            if budget is not None and time.monotonic() - start > budget:
                break
            case = generate(rng)
            outcome, detail = run_case(case, path, timeout)
            grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024
            if grown_mib > 1024:
                outcome, detail = "crash", f"memory grew by {grown_mib:.0f} MiB"
            counts[outcome] += 1
            if outcome in ("crash", "hang") and on_problem is not None:
                on_problem(index, case, outcome, detail)
    return counts


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.support.fuzz --cases N`: print the counts; exit 1 on any crash or hang."""
    parser = argparse.ArgumentParser(prog="python -m tests.support.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per case before it is a hang")
    parser.add_argument("--save", type=Path, help="folder to write crashing/hanging inputs to")
    args = parser.parse_args(argv)

    def report(index: int, case: Case, outcome: str, detail: str) -> None:
        print(f"case {index} ({case.target}): {outcome}: {detail[:300]}", file=sys.stderr, flush=True)
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / f"{index}-{case.target}-{outcome}.yaml").write_bytes(case.data)

    start = time.monotonic()
    counts = fuzz(args.cases, args.seed, args.timeout, on_problem=report)
    total = sum(counts.values())
    print(f"{total} cases in {time.monotonic() - start:.0f} s (seed {args.seed}): "
          + ", ".join(f"{name} {counts[name]}" for name in OUTCOMES))
    return 1 if counts["crash"] or counts["hang"] else 0


if __name__ == "__main__":
    sys.exit(main())
