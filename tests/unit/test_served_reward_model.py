"""A generative reward model served for the custom reward function (verl's GenRM), without Ray or an engine:
the SGLang-shaped `/generate` route over real HTTP in front of a scripted router, the reward-loop arguments and
`async def` functions in `CustomRewardFunction` (also after pickling, as the scoring processes receive it), and
the start-up plan that tells a classifier from a generative model and refuses what cannot run.
(`tests/integration/test_served_reward_model.py` serves a real model on vLLM replicas.)"""

from __future__ import annotations

import json
import logging
import pickle
import textwrap
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hybridflow.agent.manager import EventLoopThread
from hybridflow.agent.openai_server import OpenAIServer
from hybridflow.config import load_config
from hybridflow.rewards.custom import load_custom_reward_fn
from hybridflow.workers.reward_service import is_generative, plan_served_reward_model, serving_config
from tests.unit.test_agent_loops import TOK, ScriptedServer, ids

GENRM_FN = textwrap.dedent('''
    import asyncio
    import json
    import urllib.request


    def _post(url, body):
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())


    async def judge(data_source, solution_str, ground_truth, extra_info, reward_router_address,
                    reward_model_tokenizer, reward_model_path):
        ids = reward_model_tokenizer(solution_str, add_special_tokens=False)["input_ids"]
        out = await asyncio.get_running_loop().run_in_executor(None, lambda: _post(
            f"http://{reward_router_address}/generate",
            {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}))
        return {"score": float(out["text"] == ground_truth), "judge": out["text"], "path": reward_model_path}


    def plain(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0
''')


def _post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture
def endpoint() -> Any:
    """An endpoint in front of a router that answers "ok" (token ids of the toy tokenizer), max 8 tokens."""
    events = EventLoopThread()
    router = ScriptedServer([ids("ok")])
    server = OpenAIServer(router, TOK, default_max_tokens=8)
    url = events.run(server.start())
    try:
        yield url, router, server
    finally:
        events.run(server.stop())
        events.close()


def test_generate_speaks_sglang_s_native_shape(endpoint: Any) -> None:
    url, router, _ = endpoint
    status, body = _post(f"{url}/generate", {"input_ids": [5, 6, 7], "sampling_params": {
        "max_new_tokens": 100, "temperature": 0, "top_k": 3}})
    assert status == 200 and body["text"] == "ok" and body["output_ids"] == ids("ok")
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "stop"} and meta["prompt_tokens"] == 3 and meta["completion_tokens"] == 2
    assert [e[1] for e in meta["output_token_logprobs"]] == ids("ok")
    sent = router.calls[-1]
    assert sent["prompt_ids"] == [5, 6, 7]
    # greedy, and max_new_tokens capped at the served model's response length
    assert sent["params"] == {"max_tokens": 8, "temperature": 0.0, "do_sample": False, "top_p": 1.0, "top_k": 3}
    status, body = _post(f"{url}/generate", {"text": "ab"})
    assert status == 200 and router.calls[-1]["prompt_ids"] == ids("ab")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "send 'input_ids'"),
        ({"input_ids": []}, "non-empty list of token ids"),
        ({"input_ids": [1], "sampling_params": {"n": 2}}, "sampling_params n not supported"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens must be a positive integer"),
        ({"input_ids": [1], "sampling_params": {"temperature": "hot"}}, "temperature must be a number"),
    ],
)
def test_generate_refuses_bad_requests_with_the_fix(endpoint: Any, body: dict[str, Any], message: str) -> None:
    url, router, _ = endpoint
    status, answer = _post(f"{url}/generate", body)
    assert status == 400 and message in answer["error"]["message"] and router.calls == []


def test_an_endpoint_without_replicas_yet_answers_503() -> None:
    events = EventLoopThread()
    server = OpenAIServer(None, TOK)
    try:
        url = events.run(server.start())
        for path in ("/generate", "/v1/completions"):
            status, answer = _post(f"{url}{path}", {"input_ids": [1], "prompt": [1]})
            assert status == 503 and "still starting" in answer["error"]["message"]
    finally:
        events.run(server.stop())
        events.close()


def test_an_async_genrm_function_gets_the_reward_loop_arguments_it_names(tmp_path: Path, endpoint: Any) -> None:
    """verl's GenRM signature: reward_router_address, reward_model_tokenizer, reward_model_path; the function is
    `async def` and posts to /generate; it runs the same after pickling (the scoring processes' copy)."""
    from hybridflow.models.tiny import build_tiny_model

    url, router, _ = endpoint
    model = build_tiny_model(tmp_path / "genrm")
    (tmp_path / "fn.py").write_text(GENRM_FN)
    fn = load_custom_reward_fn(str(tmp_path / "fn.py"), "judge")
    assert fn.wants_reward_model() and not load_custom_reward_fn(str(tmp_path / "fn.py"), "plain").wants_reward_model()
    fn.serve_reward_model(url.removeprefix("http://"), str(model))
    for scorer in (fn, pickle.loads(pickle.dumps(fn))):
        out = scorer("toy", "ab", "ok", {})
        assert out == {"score": 1.0, "judge": "ok", "path": str(model)}
    assert router.calls[-1]["prompt_ids"] == ids("ab")  # the reward model's tokenizer (the toy one) encoded it
    plain = load_custom_reward_fn(str(tmp_path / "fn.py"), "plain")
    plain.serve_reward_model("127.0.0.1:1", str(model))
    assert plain("toy", "x", "y") == 1.0  # names none of them: gets none


def _rm_config(path: Path, *overrides: str) -> Any:
    return load_config(None, [
        "actor_rollout_ref.model.path=/m", "data.train_files=/d", "reward_model.enable=true",
        f"reward_model.model.path={path}", *overrides,
    ])


POOL = ["reward_model.enable_resource_pool=true", "reward_model.nnodes=1", "reward_model.n_gpus_per_node=1"]


def test_the_plan_serves_a_generative_reward_model_and_refuses_what_cannot_run(tmp_path: Path) -> None:
    from hybridflow.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "genrm")
    assert is_generative(str(model))
    (tmp_path / "fn.py").write_text(GENRM_FN)
    judge = load_custom_reward_fn(str(tmp_path / "fn.py"), "judge")
    plain = load_custom_reward_fn(str(tmp_path / "fn.py"), "plain")
    with pytest.raises(ValueError, match="is a generative model .*ForCausalLM.* takes reward_router_address"):
        plan_served_reward_model(_rm_config(model, *POOL), plain)
    with pytest.raises(ValueError, match="is a generative model .*ForCausalLM.* reward_model.enable_resource_pool=true"):
        plan_served_reward_model(_rm_config(model), judge)
    with pytest.raises(ValueError, match="reward_model.rollout.name=hf: a generative reward model is served by vllm"):
        plan_served_reward_model(_rm_config(model, *POOL, "reward_model.rollout.name=hf"), judge)
    profiled = ["global_profiler.tool=torch", "global_profiler.steps=[1]", "reward_model.profiler.enable=true",
                "reward_model.profiler.all_ranks=true"]
    with pytest.raises(ValueError, match="profiling its served replicas is not built in HybridFlow yet; remove it"):
        plan_served_reward_model(_rm_config(model, *POOL, *profiled), judge)
    cfg = _rm_config(model, *POOL, "reward_model.rollout.response_length=16")
    served = plan_served_reward_model(cfg, judge)
    try:
        assert served is not None and judge.served == {"reward_router_address": served.address,
                                                      "reward_model_path": str(model)}
        status, answer = _post(f"http://{served.address}/generate", {"input_ids": [1]})
        assert status == 503  # listening before Ray: the replicas come with start()
    finally:
        served.close()
    rollout = serving_config(cfg).actor_rollout_ref
    assert (rollout.model.path, rollout.rollout.mode, rollout.rollout.load_format) == (str(model), "async", "auto")
    assert rollout.rollout.response_length == 16 and cfg.actor_rollout_ref.model.path == "/m"  # a copy


def test_a_classifier_reward_model_stays_on_its_worker_and_says_rollout_is_unread(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from transformers import AutoModelForTokenClassification

    from hybridflow.models.tiny import build_tiny_model

    policy = build_tiny_model(tmp_path / "policy")
    AutoModelForTokenClassification.from_pretrained(str(policy), num_labels=1).save_pretrained(str(tmp_path / "rm"))
    with caplog.at_level(logging.WARNING):
        assert plan_served_reward_model(_rm_config(tmp_path / "rm", "reward_model.rollout.gpu_memory_utilization=0.8"),
                                        None) is None
    assert "reward_model.rollout (gpu_memory_utilization) has no effect" in caplog.text
    assert "ForTokenClassification" in caplog.text


ASYNC_FN = textwrap.dedent('''
    import asyncio

    running = 0
    most = 0


    async def judge(data_source, solution_str, ground_truth, extra_info=None):
        global running, most
        running += 1
        most = max(most, running)
        try:
            if solution_str.startswith("slow"):
                await asyncio.sleep(30)
            if solution_str.startswith("bad"):
                raise RuntimeError("the judge could not parse its own answer")
            await asyncio.sleep(0.05)
            return {"score": 1.0, "most": float(most)}
        finally:
            running -= 1
''')


def test_async_reward_functions_are_awaited_together_each_under_its_budget(tmp_path: Path) -> None:
    """Calls of an `async def` function (a served judge: mostly waiting) are awaited at once in the trainer process,
    not one per scoring process; one that overruns its budget scores 0 as a timeout, one that raises as an error."""
    from hybridflow.rewards.budget import Call
    from hybridflow.rewards.pool import BudgetedScorer

    (tmp_path / "fn.py").write_text(ASYNC_FN)
    fn = load_custom_reward_fn(str(tmp_path / "fn.py"), "judge")
    assert fn.is_async
    texts = ["ok"] * 8 + ["slow", "bad"]
    calls = [Call({"data_source": "toy", "solution_str": t, "ground_truth": "", "extra_info": {}}, 1.0) for t in texts]
    scorer = BudgetedScorer(fn, workers=2)
    outcomes = scorer.run(calls)
    assert scorer._pool is None  # no scoring processes: awaited here
    assert [o.status for o in outcomes] == ["ok"] * 8 + ["timeout", "error"]
    assert max(o.value["most"] for o in outcomes[:8]) == 10  # all ten were running at once
    assert "ran past its budget of 1 s" in outcomes[8].message and "could not parse" in outcomes[9].message


@pytest.mark.parametrize(("reply", "score"), [("yes", 1.0), ("no", 0.0)])
def test_the_llm_judge_example_scores_the_judge_s_reply(tmp_path: Path, reply: str, score: float) -> None:
    """examples/llm_judge.py against the endpoint: the judge's chat prompt holds the question, the reference and
    the answer, and its reply decides the score."""
    from hybridflow.models.tiny import build_tiny_model
    from hybridflow.rewards.budget import Call
    from hybridflow.rewards.pool import BudgetedScorer

    model = build_tiny_model(tmp_path / "judge")
    events = EventLoopThread()
    router = ScriptedServer([ids(reply)])
    server = OpenAIServer(router, TOK, default_max_tokens=8)
    try:
        url = events.run(server.start())
        fn = load_custom_reward_fn(str(Path(__file__).resolve().parents[2] / "examples" / "llm_judge.py"), "judge")
        assert fn.is_async and fn.wants_reward_model()
        fn.serve_reward_model(url.removeprefix("http://"), str(model))
        (outcome,) = BudgetedScorer(fn).run([Call({"data_source": "toy", "solution_str": " b ", "ground_truth": "b",
                                                    "extra_info": {"question": "copy b"}}, 5.0)])
    finally:
        events.run(server.stop())
        events.close()
    assert outcome.status == "ok" and outcome.value == {"score": score, "judge_said_yes": score}
    prompt = TOK.decode(router.calls[0]["prompt_ids"]).replace(" ", "")  # the toy tokenizer has no space token
    assert "Question:copyb" in prompt and "Referenceanswer:b" in prompt and "Studentanswer:b" in prompt
    assert router.calls[0]["params"]["do_sample"] is False and router.calls[0]["params"]["max_tokens"] == 8
