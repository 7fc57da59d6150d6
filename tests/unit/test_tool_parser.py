"""Tool-call formats: gpt-oss's Harmony calls read from a turn's text, Harmony tool turns, the registry."""

from __future__ import annotations

import pytest

from hybridflow._config.names import TOOL_CALL_FORMATS
from hybridflow.agent.tool_parser import (
    PARSERS,
    FunctionCall,
    ToolCallError,
    get_tool_parser,
    parse_harmony,
    render_harmony_turn,
)
from hybridflow.data.toy import build_toy_tokenizer

HARMONY = ["<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"]
CALL = '<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{"key": "c"}<|call|>'


def harmony_tokenizer() -> object:
    """The toy tokenizer with Harmony's markers as special tokens, as gpt-oss's tokenizer has them."""
    tok = build_toy_tokenizer(extra_words=["{", "}"])
    tok.add_special_tokens({"additional_special_tokens": HARMONY})
    return tok


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (CALL, [FunctionCall("lookup", {"key": "c"})]),  # the turn's <|start|>assistant was the generation prompt
        ("<|start|>assistant" + CALL, [FunctionCall("lookup", {"key": "c"})]),
        ('<|channel|>commentary to=functions.lookup<|message|>{"key": "c"}<|call|>', [FunctionCall("lookup", {"key": "c"})]),
        # the recipient in the role part, the content type without <|constrain|> (as gpt-oss's template writes it)
        ('<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"x": 1}<|call|>', [FunctionCall("f", {"x": 1})]),
        # reasoning, then two calls, one in the analysis channel
        ('<|channel|>analysis<|message|>look up c, then d<|end|><|start|>assistant' + CALL
         + '<|start|>assistant<|channel|>analysis to=functions.lookup <|constrain|>json<|message|>{"key": "d"}<|call|>',
         [FunctionCall("lookup", {"key": "c"}), FunctionCall("lookup", {"key": "d"})]),
        ("<|channel|>commentary to=functions.now <|constrain|>json<|message|><|call|>", [FunctionCall("now", {})]),
        ("<|channel|>final<|message|>no call here<|return|>", []),
        ("plain text", []),
    ],
)
def test_harmony_calls_are_read(text: str, expected: list[FunctionCall]) -> None:
    assert parse_harmony(text)[1] == expected


def test_a_call_written_inside_reasoning_is_not_a_call() -> None:
    text = ("<|channel|>analysis<|message|>I could write <|start|>assistant" + CALL.replace('"c"', '"z"')
            + " but no.<|end|><|start|>assistant<|channel|>final<|message|>it is q<|return|>")
    assert parse_harmony(text) == ("it is q", [])


@pytest.mark.parametrize(
    ("text", "message", "name"),
    [
        ("<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{key: c}<|call|>", "not valid JSON", "lookup"),
        ("<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>[1]<|call|>", "must be a JSON object", "lookup"),
        ('<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{"key": ', "not valid JSON", "lookup"),  # cut
        ("<|channel|>commentary to=browser.search<|message|>{}<|call|>", "to=functions.<name>", "browser.search"),
        ("<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>" + "[" * 100_000 + "<|call|>",
         "not valid JSON", "lookup"),
    ],
)
def test_malformed_harmony_calls_become_messages_to_the_model(text: str, message: str, name: str) -> None:
    _, calls = parse_harmony(text)
    assert len(calls) == 1 and isinstance(calls[0], ToolCallError)
    assert message in calls[0].message and calls[0].name == name


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|> 42 <|return|>", "42"),
        # no final channel: the text outside calls and reasoning (a commentary preamble)
        ("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
         "<|start|>assistant" + CALL, "Checking."),
        ("just words", "just words"),
        # a reply the model wrote in a tool's name is neither its words nor a call
        ("<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>made up<|end|>", ""),
    ],
)
def test_harmony_content_is_the_final_channel_else_the_text_outside_calls_and_reasoning(text: str, content: str) -> None:
    assert parse_harmony(text)[0] == content


def test_the_gpt_oss_format_reads_the_tokens_with_their_special_tokens() -> None:
    tok = harmony_tokenizer()
    ids = tok("<|channel|>analysis<|message|>hm<|end|><|start|>assistant" + CALL, add_special_tokens=False)["input_ids"]
    assert get_tool_parser("gpt-oss").read(tok, ids) == ("", [FunctionCall("lookup", {"key": "c"})])
    # decoded without them (as Hermes turns are), the markers are gone and so is the call
    assert parse_harmony(tok.decode(ids, skip_special_tokens=True))[1] == []


def test_harmony_turns_are_written_as_harmony_messages_ending_in_the_next_assistant_header() -> None:
    tok = harmony_tokenizer()
    ids = render_harmony_turn(tok, [{"role": "tool", "name": "lookup", "content": "q"},
                                    {"role": "tool", "content": "error: x"}, {"role": "user", "content": "again"}])
    assert tok.decode(ids) == (
        "<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>q<|end|>"
        "<|start|>functions.unknown to=assistant<|channel|>commentary<|message|>error: x<|end|>"
        "<|start|>user<|message|>again<|end|><|start|>assistant"
    )
    with pytest.raises(ValueError, match="not 'assistant'"):
        render_harmony_turn(tok, [{"role": "assistant", "content": "x"}])


def test_the_registry_holds_verls_parser_names_and_a_wrong_name_lists_them() -> None:
    assert tuple(PARSERS) == TOOL_CALL_FORMATS == ("hermes", "gpt-oss")
    assert all(parser.name == name for name, parser in PARSERS.items())
    with pytest.raises(ValueError, match=r"choose one of \['gpt-oss', 'hermes'\]"):
        get_tool_parser("pythonic")
