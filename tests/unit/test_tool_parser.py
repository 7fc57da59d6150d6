"""Tool-call formats: gpt-oss's Harmony calls read from a turn's text, Harmony tool turns, Qwen3-Coder's XML calls
typed by the tool schemas, the registry."""

from __future__ import annotations

import pytest

from hybridflow._config.names import TOOL_CALL_FORMATS
from hybridflow.agent.tool_parser import (
    PARSERS,
    FunctionCall,
    ToolCallError,
    get_tool_parser,
    parse_harmony,
    parse_qwen3_xml,
    render_harmony_turn,
    typed_by_schema,
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
    assert tuple(PARSERS) == TOOL_CALL_FORMATS == ("hermes", "gpt-oss", "qwen3_coder")
    assert all(parser.name == name for name, parser in PARSERS.items())
    with pytest.raises(ValueError, match=r"choose one of \['gpt-oss', 'hermes', 'qwen3_coder'\]"):
        get_tool_parser("pythonic")


# -- Qwen3-Coder XML ---------------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
    "code": {"type": "string"}, "lines": {"type": "integer"}, "ratio": {"type": "number"},
    "verbose": {"type": "boolean"}, "env": {"type": "object"}, "args": {"type": "array"},
    "note": {"type": ["string", "null"]},
}}}}]


def xml_call(name: str, **params: str) -> str:
    """A call as Qwen3-Coder's chat template writes one."""
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_qwen3_xml_calls_are_read_with_values_typed_by_the_tools_schema() -> None:
    text = "I will run it." + xml_call("run", code="print(1)\nprint(2)", lines="2", ratio="0.5", verbose="True",
                                       env='{"A": "1"}', args="[1, 2]", note="007") + "\n" + xml_call("other", x="3")
    content, calls = parse_qwen3_xml(text)
    assert content == "I will run it."
    assert calls == [FunctionCall("run", {"code": "print(1)\nprint(2)", "lines": "2", "ratio": "0.5", "verbose": "True",
                                          "env": '{"A": "1"}', "args": "[1, 2]", "note": "007"}),
                     FunctionCall("other", {"x": "3"})]
    typed = [typed_by_schema(c, TOOLS) for c in calls]
    assert typed == [FunctionCall("run", {"code": "print(1)\nprint(2)", "lines": 2, "ratio": 0.5, "verbose": True,
                                          "env": {"A": "1"}, "args": [1, 2], "note": "007"}),
                     FunctionCall("other", {"x": "3"})]  # a tool without a schema here: its values stay text
    # only one newline of layout is taken off each side: the value's own blank lines are kept
    (call,) = parse_qwen3_xml(xml_call("run", code="\nx = 1\n"))[1]
    assert call.arguments == {"code": "\nx = 1\n"}


@pytest.mark.parametrize(("text", "message"), [
    (xml_call("run", lines="two"), "parameter lines of run must be of type integer, got 'two'"),
    (xml_call("run", verbose="yes"), "parameter verbose of run must be of type boolean"),
    (xml_call("run", env="[1]"), "parameter env of run must be of type object"),
    ("<tool_call>\n<parameter=a>\n1\n</parameter>\n</tool_call>", "a tool call needs <function=NAME>"),
    ("<tool_call>\n<function=run>\n<parameter=code>\nx\n</function>\n</tool_call>",
     "a <parameter=...> of run was opened but not closed"),
    ("ok <tool_call>\n<function=run>\n", "a <tool_call> was opened but not closed"),
])
def test_malformed_qwen3_xml_calls_become_messages_to_the_model(text: str, message: str) -> None:
    (call,) = [typed_by_schema(c, TOOLS) for c in parse_qwen3_xml(text)[1]]
    assert isinstance(call, ToolCallError) and message in call.message, call


def test_the_qwen3_coder_format_types_values_from_the_schemas_it_is_given() -> None:
    tok = build_toy_tokenizer(extra_words=["<tool_call>", "</tool_call>", "<function=run>", "</function>",
                                           "<parameter=lines>", "</parameter>"])
    ids = tok(xml_call("run", lines="2"), add_special_tokens=False)["input_ids"]
    parser = get_tool_parser("qwen3_coder")
    assert parser.read(tok, ids, TOOLS)[1] == [FunctionCall("run", {"lines": 2})]
    assert parser.read(tok, ids)[1] == [FunctionCall("run", {"lines": "2"})]  # no schemas: text
    assert typed_by_schema(FunctionCall("run", {"lines": "3"}), [None, {"function": "x"}, {}]) == FunctionCall(
        "run", {"lines": "3"})  # malformed tool lists never raise
