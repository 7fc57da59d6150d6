"""Loading a user's reward function by file path and name (verl's custom_reward_function)."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest

from hybridflow.rewards import CustomRewardError, load_custom_reward_fn, load_custom_reward_fn_from_config

USER_FILE = """
SCALE = 3

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return {"score": float(solution_str == ground_truth) + bonus, "source": data_source, "extra": extra_info}

def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str))
"""


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(USER_FILE)
    return path


def test_happy_path_binds_reward_kwargs(user_file: Path) -> None:
    fn = load_custom_reward_fn(str(user_file), "compute_score", {"bonus": 0.5})
    result = fn("src", "a", "a", extra_info={"index": 3})
    assert result == {"score": 1.5, "source": "src", "extra": {"index": 3}}
    assert fn(data_source="src", solution_str="a", ground_truth="b")["score"] == 0.5


def test_other_function_name(user_file: Path) -> None:
    assert load_custom_reward_fn(str(user_file), "length_reward")("s", "abcd", "x") == 4.0


def test_pickles_by_path(user_file: Path) -> None:
    fn = load_custom_reward_fn(str(user_file), "compute_score", {"bonus": 1.0})
    clone = pickle.loads(pickle.dumps(fn))
    assert clone("s", "a", "a")["score"] == 2.0
    assert "my_reward.py" in repr(clone)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CustomRewardError, match="no such file") as info:
        load_custom_reward_fn(str(tmp_path / "nope.py"), "compute_score")
    assert "custom_reward_function.path" in str(info.value)


def test_missing_function_lists_the_ones_defined(user_file: Path) -> None:
    with pytest.raises(CustomRewardError) as info:
        load_custom_reward_fn(str(user_file), "score_fn")
    message = str(info.value)
    assert "no function of that name" in message and "'score_fn'" in message
    assert "compute_score, length_reward" in message


def test_not_callable(user_file: Path) -> None:
    with pytest.raises(CustomRewardError, match="SCALE.*is a int, not a function"):
        load_custom_reward_fn(str(user_file), "SCALE")


def test_import_error_in_user_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("import no_such_module_xyz\n")
    with pytest.raises(CustomRewardError, match="importing the file failed with ModuleNotFoundError"):
        load_custom_reward_fn(str(path))


def test_empty_name(user_file: Path) -> None:
    with pytest.raises(CustomRewardError, match="name is empty"):
        load_custom_reward_fn(str(user_file), "")


def test_from_config(user_file: Path) -> None:
    cfg = SimpleNamespace(
        custom_reward_function=SimpleNamespace(
            path=str(user_file), name="compute_score", reward_kwargs={"bonus": 2}
        )
    )
    fn = load_custom_reward_fn_from_config(cfg)
    assert fn is not None and fn("s", "x", "x")["score"] == 3.0
    empty = SimpleNamespace(
        custom_reward_function=SimpleNamespace(path=None, name="compute_score", reward_kwargs={})
    )
    assert load_custom_reward_fn_from_config(empty) is None
