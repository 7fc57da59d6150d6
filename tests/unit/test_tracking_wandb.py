"""W&B for real, in offline mode: steps land in the run, a second attempt continues the same run (issue 6).

Offline mode never contacts a server: wandb writes `wandb/offline-run-<time>-<id>[-N]/run-<id>.wandb`
under $WANDB_DIR, one folder per process that opened the run; `wandb sync` later uploads each folder
into the run named by its id. The `.wandb` file is a LevelDB-style log of protobuf `Record`s; wandb 0.31
no longer ships a Python reader for it, so `read_records` below parses the framing itself.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridflow.checkpoint import TrainerState
from hybridflow.progress import Progress, choose_wandb_run_id, read_progress
from hybridflow.tracking import Tracking, WandbLogger

# LevelDB log framing as wandb writes it: a 7-byte file header (":W&B", magic 0xBEE1, version), then
# 32 KiB blocks of chunks, each "crc32c u32, length u16, type u8" + payload (1 full, 2 first, 3 middle,
# 4 last); a block tail shorter than a chunk header is zero padding.
FILE_HEADER = b":W&B"
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> Iterator[Any]:
    """Yield the protobuf records of a `.wandb` file."""
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == FILE_HEADER, f"{path} is not a wandb transaction log"
    pos, pending = CHUNK_HEADER, b""
    while pos + CHUNK_HEADER <= len(raw):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + CHUNK_HEADER])
        payload = raw[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == 0:  # zero padding to the end of the block
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        if kind in (FULL, FIRST):
            pending = b""
        pending += payload
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
        elif kind not in (FIRST, MIDDLE):
            raise AssertionError(f"{path}: unknown chunk type {kind} at byte {pos}")


def run_folders(wandb_dir: Path, run_id: str) -> list[Path]:
    """The offline folders of one run, oldest first (the first has no -N suffix)."""
    folders = list((wandb_dir / "wandb").glob(f"offline-run-*-{run_id}*"))
    return sorted(folders, key=lambda p: (len(p.name), p.name))


def logged(folder: Path, settle_s: float = 30.0) -> tuple[set[str], dict[int, dict[str, Any]]]:
    """Return the run ids in a folder's run records and its history rows by step, once the run file holds its
    exit record: the wandb-core service may still be writing the last records when finish() returns on a loaded
    machine (seen: a resumed run's file with only its header right after finish())."""
    deadline = time.monotonic() + settle_s
    while True:
        ids: set[str] = set()
        history: dict[int, dict[str, Any]] = {}
        finished = False
        for path in folder.glob("run-*.wandb"):
            for record in read_records(path):
                kind = record.WhichOneof("record_type")
                if kind == "run":
                    ids.add(record.run.run_id)
                elif kind == "history":
                    row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
                    history[int(row["_step"])] = row
                elif kind == "exit":
                    finished = True
        if finished or time.monotonic() > deadline:
            return ids, history
        time.sleep(0.25)


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Offline, silent wandb writing under tmp_path; the wandb-core service is stopped afterwards."""
    wandb = pytest.importorskip("wandb", reason="install the dev extra: pip install -c constraints.txt -e '.[dev]'")
    for key in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_PROJECT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    # A loaded 2-core box (Ray tests just finished) can make the wandb-core service slow to start.
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "300")
    try:
        yield tmp_path
    finally:
        wandb.teardown()


def test_offline_run_logs_steps_and_a_second_attempt_continues_it(offline_wandb: Path) -> None:
    first = Tracking("proj", "exp", ["wandb"], {"trainer": {"total_epochs": 1}})
    run_id = first.wandb_run_id
    assert run_id
    for step in (1, 2, 3):
        first.log({"critic/score/mean": 0.1 * step, "actor/entropy": float("nan")}, step=step)
    first.finish()

    (folder,) = run_folders(offline_wandb, run_id)
    ids, history = logged(folder)
    assert ids == {run_id}
    assert sorted(history) == [1, 2, 3]
    assert history[2]["critic/score/mean"] == pytest.approx(0.2)
    assert "actor/entropy" not in history[2]  # non-finite values are dropped, not sent as NaN

    second = Tracking("proj", "exp", ["wandb"], {}, wandb_run_id=run_id)
    wandb_logger = second.loggers["wandb"]
    assert isinstance(wandb_logger, WandbLogger)
    assert second.wandb_run_id == wandb_logger.run.id == run_id
    assert wandb_logger.run.settings.resume == "allow"
    for step in (4, 5):
        second.log({"critic/score/mean": 0.1 * step}, step=step)
    second.finish()

    folders = run_folders(offline_wandb, run_id)
    assert len(folders) == 2, [p.name for p in folders]
    assert folders[0] == folder
    resumed_ids, resumed_history = logged(folders[1])
    assert resumed_ids == {run_id}  # `wandb sync` uploads both folders into the one run
    assert sorted(resumed_history) == [4, 5]
    assert resumed_history[5]["critic/score/mean"] == pytest.approx(0.5)


def test_run_id_survives_an_attempt_that_died_before_its_first_checkpoint(offline_wandb: Path) -> None:
    root = offline_wandb / "ckpt"
    attempt1 = Tracking("proj", "exp", ["wandb"], {}, default_local_dir=str(root))
    attempt1.log({"critic/score/mean": 0.5}, step=1)
    attempt1.finish()  # no checkpoint was saved; progress.json alone holds the id
    record = read_progress(str(root))
    assert record is not None and record.wandb_run_id == attempt1.wandb_run_id

    chosen = choose_wandb_run_id(None, read_progress(str(root)), "auto")
    attempt2 = Tracking("proj", "exp", ["wandb"], {}, default_local_dir=str(root), wandb_run_id=chosen)
    attempt2.log({"critic/score/mean": 0.6}, step=2)
    attempt2.finish()
    assert attempt2.wandb_run_id == attempt1.wandb_run_id
    assert len(run_folders(offline_wandb, attempt1.wandb_run_id or "")) == 2


def test_choose_prefers_the_checkpoint_then_progress_and_disable_starts_fresh() -> None:
    state = TrainerState(global_step=4, wandb_run_id="from-ckpt")
    record = Progress(step=6, wandb_run_id="from-progress")
    assert choose_wandb_run_id(state, record, "auto") == "from-ckpt"
    assert choose_wandb_run_id(state, record, "resume_path") == "from-ckpt"
    assert choose_wandb_run_id(None, record, "auto") == "from-progress"
    assert choose_wandb_run_id(TrainerState(global_step=4), record, "auto") == "from-progress"
    assert choose_wandb_run_id(state, record, "disable") is None
    assert choose_wandb_run_id(None, record, "disable") is None
    assert choose_wandb_run_id(None, None, "auto") is None
    assert choose_wandb_run_id(None, Progress(step=1), "auto") is None


def test_validation_generations_become_a_growing_table(offline_wandb: Path) -> None:
    run = Tracking("proj", "exp", ["wandb"], {})
    run.log_generations([("What is 2+2?", "4", 1.0)], step=0)
    run.log_generations([("What is 2+2?", "5", 0.0)], step=2)
    run.finish()
    (folder,) = run_folders(offline_wandb, str(run.wandb_run_id))
    # a table is recorded as nested keys: val/generations/{_type,nrows,ncols,path,...}
    _, history = logged(folder)
    tables = {step: row for step, row in history.items() if "val/generations/nrows" in row}
    assert sorted(tables) == [0, 2]
    assert tables[0]["val/generations/_type"] == "table-file" and tables[0]["val/generations/ncols"] == 4
    assert tables[0]["val/generations/nrows"] == 1
    assert tables[2]["val/generations/nrows"] == 2  # earlier validations stay in the table
