"""The scripted model's decision table, as pure unit tests of :func:`plan_response`."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest

from service.emulator.arithmetic import extract_expression
from service.emulator.directives import parse_directives, strip_directives
from service.emulator.request import TOKENS_PER_TOOL_SPEC, count_input_tokens
from service.emulator.script import plan_response
from service.emulator.steps import (
    EmitReasoning,
    EmitSignature,
    EmitText,
    EmitToolInput,
    Plan,
    RaiseException,
    ReportUsage,
    StartMessage,
    StartToolUse,
    StopBlock,
    StopMessage,
)

CALCULATOR_TOOLS = {
    "tools": [
        {
            "toolSpec": {
                "name": "calculator",
                "description": "Evaluates an arithmetic expression.",
                "inputSchema": {"json": {"type": "object"}},
            }
        }
    ]
}


def _user(text: str) -> dict[str, Any]:
    """A user message holding one text block."""
    return {"role": "user", "content": [{"text": text}]}


def _body(text: str, *, tools: bool = True, **extra: Any) -> dict[str, Any]:
    """A request body for one user prompt, offering the calculator unless told not to."""
    body: dict[str, Any] = {"messages": [_user(text)], **extra}
    if tools:
        body["toolConfig"] = CALCULATOR_TOOLS
    return body


def _follow_up(
    question: str, result: str, *, status: str = "success", tool_use_id: str = "tooluse_1"
) -> dict[str, Any]:
    """A conversation whose last message carries the result of a calculator call."""
    return {
        "messages": [
            _user(question),
            {
                "role": "assistant",
                "content": [{"toolUse": {"toolUseId": tool_use_id, "name": "calculator", "input": {}}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "toolResult": {
                            "toolUseId": tool_use_id,
                            "content": [{"text": result}],
                            "status": status,
                        }
                    }
                ],
            },
        ],
        "toolConfig": CALCULATOR_TOOLS,
    }


def _text(plan: Plan) -> str:
    """The concatenated answer text."""
    return "".join(s.text for s in plan.steps if isinstance(s, EmitText))


def _text_deltas(plan: Plan) -> list[str]:
    """The answer text, delta by delta."""
    return [s.text for s in plan.steps if isinstance(s, EmitText)]


def _tool_calls(plan: Plan) -> list[tuple[str, Any]]:
    """Each tool use as (name, parsed input)."""
    calls: list[tuple[str, Any]] = []
    for start in (s for s in plan.steps if isinstance(s, StartToolUse)):
        fragments = [
            s.fragment for s in plan.steps if isinstance(s, EmitToolInput) and s.index == start.index
        ]
        calls.append((start.name, json.loads("".join(fragments))))
    return calls


def _usage(plan: Plan) -> ReportUsage:
    """The plan's single usage step."""
    (usage,) = [s for s in plan.steps if isinstance(s, ReportUsage)]
    return usage


# --- directives ----------------------------------------------------------------------------


def test_directives_are_parsed_anywhere_and_later_ones_win() -> None:
    """Directives are found anywhere in the text; a repeated one takes the last value."""
    text = "Hi [emu:tokens=3] there [emu:reasoning] and [emu:tokens=5] [emu:stop=stop_sequence]"
    assert parse_directives(text) == {"tokens": "5", "reasoning": "", "stop": "stop_sequence"}
    assert strip_directives(text) == "Hi there and"


def test_directives_come_from_the_latest_user_prompt() -> None:
    """In a multi-query conversation only the latest prompt's directives count."""
    body = {
        "messages": [
            _user("[emu:http=500] first question"),
            {"role": "assistant", "content": [{"text": "answer"}]},
            _user("second question [emu:tokens=2]"),
        ]
    }
    plan = plan_response(body)
    assert plan.http_error is None
    assert _text_deltas(plan) == ["Here", " is"]


# --- text answers ----------------------------------------------------------------------------


def test_plain_question_gets_a_deterministic_text_answer() -> None:
    """A plain question gets 12 deterministic word deltas and ends with end_turn."""
    plan = plan_response(_body("Tell me about rivers"))
    deltas = _text_deltas(plan)
    assert len(deltas) == 12
    assert deltas[0] == "Here" and all(d.startswith(" ") for d in deltas[1:])
    assert _text(plan).startswith("Here is an answer to: Tell me about rivers")
    assert plan == plan_response(_body("Tell me about rivers"))
    assert not any(isinstance(s, StartToolUse) for s in plan.steps)
    assert isinstance(plan.steps[0], StartMessage)
    assert plan.steps[-3:] == (StopBlock(0), StopMessage("end_turn"), _usage(plan))
    assert _usage(plan).output_tokens == 12


@pytest.mark.parametrize("count", [1, 30, 500])
def test_tokens_directive_sets_the_exact_delta_count(count: int) -> None:
    """tokens=N yields exactly N text deltas."""
    plan = plan_response(_body(f"[emu:tokens={count}] Hello"))
    assert len(_text_deltas(plan)) == count
    assert _usage(plan).output_tokens == count


def test_say_directive_dictates_the_answer_word_by_word() -> None:
    """say=TEXT (percent-encoded) is answered exactly, newlines and brackets kept, one word a delta."""
    said = "  # Title\n\n- one [link](https://x.test)\n\n```\ncode\n```"
    encoded = quote(said, safe="")
    plan = plan_response(_body(f"What is 2+2? [emu:say={encoded}]"))
    assert _text(plan) == said and not _tool_calls(plan)
    assert _text_deltas(plan) == [
        "  ",
        "# ",
        "Title\n\n",
        "- ",
        "one ",
        "[link](https://x.test)\n\n",
        "```\n",
        "code\n",
        "```",
    ]
    assert _usage(plan).output_tokens == 9


def test_tokens_zero_gives_an_empty_message() -> None:
    """tokens=0 yields a message without content blocks."""
    plan = plan_response(_body("[emu:tokens=0] Hello"))
    assert plan.steps[:2] == (StartMessage(), StopMessage("end_turn"))


def test_default_length_is_configurable() -> None:
    """The default answer length comes from the caller."""
    assert len(_text_deltas(plan_response(_body("Hello"), default_tokens=4))) == 4


def test_malformed_directive_value_falls_back_to_the_default() -> None:
    """A malformed directive value is ignored."""
    assert len(_text_deltas(plan_response(_body("[emu:tokens=lots] Hello")))) == 12


# --- calculator ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "expression"),
    [
        ("What is the square root of 144?", "sqrt(144)"),
        ("What is the factorial of 5?", "factorial(5)"),
        ("Compute 5 factorial please", "factorial(5)"),
        ("What is 2 + 3 * 4?", "2 + 3 * 4"),
        ("What is 2^10?", "2**10"),
        ("Please work out (1 + 2) * 3.", "(1 + 2) * 3"),
        ("What is 7 % 3, and also 10/4?", "7 % 3"),
        ("Compute 100 - 58 for me", "100 - 58"),
    ],
)
def test_arithmetic_questions_call_the_calculator(question: str, expression: str) -> None:
    """Arithmetic questions become a calculator tool use with the right expression."""
    assert extract_expression(question) == expression
    plan = plan_response(_body(question))
    assert _tool_calls(plan) == [("calculator", {"expression": expression})]
    assert plan.stop_reason == "tool_use"
    assert not any(isinstance(s, EmitText) for s in plan.steps)


@pytest.mark.parametrize("question", ["What is 42?", "Tell me about 2024", "Is -5 cold?"])
def test_numbers_without_an_operator_are_not_arithmetic(question: str) -> None:
    """A number alone is not an arithmetic question."""
    assert extract_expression(question) is None


def test_no_calculator_offered_means_a_text_answer() -> None:
    """Without a calculator in toolConfig, arithmetic gets a text answer."""
    plan = plan_response(_body("What is 2 + 3?", tools=False))
    assert _tool_calls(plan) == []
    assert plan.stop_reason == "end_turn"
    assert len(_text_deltas(plan)) == 12


def test_tool_input_is_streamed_in_about_three_fragments() -> None:
    """A tool use streams its JSON input in three fragments between start and stop."""
    plan = plan_response(_body("What is the square root of 144?"))
    fragments = [s for s in plan.steps if isinstance(s, EmitToolInput)]
    assert len(fragments) == 3
    assert [type(s) for s in plan.steps] == [
        StartMessage, StartToolUse, EmitToolInput, EmitToolInput, EmitToolInput,
        StopBlock, StopMessage, ReportUsage,
    ]  # fmt: skip
    assert _usage(plan).output_tokens == 3


# --- tool results ------------------------------------------------------------------------------


def test_tool_result_for_a_square_root_question() -> None:
    """A square-root result is answered in a full sentence."""
    plan = plan_response(_follow_up("What is the square root of 144?", "12"))
    assert _text(plan) == "The square root of 144 is 12."
    assert plan.stop_reason == "end_turn"


def test_tool_result_for_another_question() -> None:
    """Any other single result is answered generically."""
    assert _text(plan_response(_follow_up("What is 2 + 3 * 4?", "14"))) == "The result is 14."


def test_tool_error_is_reported() -> None:
    """An errored tool result is reported as a failure."""
    plan = plan_response(_follow_up("What is 1/0?", "division by zero", status="error"))
    assert _text(plan) == "The tool failed: division by zero."


def test_several_tool_results() -> None:
    """Several results are listed together."""
    body = _follow_up("[emu:tools=2] add", "2")
    body["messages"][-1]["content"].append(
        {"toolResult": {"toolUseId": "t2", "content": [{"json": 4}], "status": "success"}}
    )
    assert _text(plan_response(body)) == "The results are 2 and 4."


def test_tool_directives_do_not_repeat_after_a_tool_result() -> None:
    """tool= and tools= act only on the first turn."""
    for directive in ("[emu:tool=search]", "[emu:tools=3]"):
        plan = plan_response(_follow_up(f"{directive} go", "done"))
        assert _tool_calls(plan) == []
        assert _text(plan) == "The result is done."


def test_loop_calls_the_calculator_again_after_a_result() -> None:
    """loop keeps calling the calculator after every result."""
    plan = plan_response(_follow_up("[emu:loop] What is 2 + 2?", "4"))
    assert _tool_calls(plan) == [("calculator", {"expression": "1+1"})]
    assert plan.stop_reason == "tool_use"


# --- tool directives ------------------------------------------------------------------------


def test_tool_directive_calls_the_named_tool_with_empty_input() -> None:
    """tool=NAME calls that tool with {}."""
    plan = plan_response(_body("[emu:tool=web_search] What is 2 + 2?"))
    assert _tool_calls(plan) == [("web_search", {})]
    assert plan.stop_reason == "tool_use"


def test_tool_directive_names_several_tools_and_their_input() -> None:
    """tool=A,B calls each with the tool_input directive's object; a bad tool_input gives {}."""
    plan = plan_response(
        _body('Please [emu:tool=calculator,delete_bucket] [emu:tool_input={"expression": "6*7"}]')
    )
    assert _tool_calls(plan) == [
        ("calculator", {"expression": "6*7"}),
        ("delete_bucket", {"expression": "6*7"}),
    ]
    for bad in ("[1, 2", "not json", '"text"'):
        plan = plan_response(_body(f"[emu:tool=calculator] [emu:tool_input={bad}]"))
        assert _tool_calls(plan) == [("calculator", {})]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('{"city": "Paris", "days": 2}', {"city": "Paris", "days": 2}),
        ("{not json", {}),
        ('["a list"', {}),
        ("3", {}),
    ],
)
def test_tool_input_directive_gives_the_call_its_input(value: str, expected: dict[str, Any]) -> None:
    """tool_input=JSON is the named tool's input when it is a JSON object, else {}."""
    plan = plan_response(_body(f"[emu:tool=get_weather] [emu:tool_input={value}] Weather?"))
    assert _tool_calls(plan) == [("get_weather", expected)]


def test_tools_directive_makes_parallel_calculator_calls() -> None:
    """tools=N makes N calculator calls in one message."""
    plan = plan_response(_body("[emu:tools=3] do some sums"))
    assert _tool_calls(plan) == [
        ("calculator", {"expression": "1+1"}),
        ("calculator", {"expression": "2+2"}),
        ("calculator", {"expression": "3+3"}),
    ]
    starts = [s for s in plan.steps if isinstance(s, StartToolUse)]
    assert [s.index for s in starts] == [0, 1, 2]
    assert len({s.tool_use_id for s in starts}) == 3
    assert all(s.tool_use_id.startswith("tooluse_") for s in starts)
    assert plan.stop_reason == "tool_use"


def test_loop_directive_on_the_first_turn() -> None:
    """loop starts with a calculator call too."""
    assert _tool_calls(plan_response(_body("[emu:loop] hello"))) == [("calculator", {"expression": "1+1"})]


def test_tool_use_ids_are_deterministic_and_depend_on_the_conversation() -> None:
    """Tool-use ids repeat for the same request and differ between turns."""

    def first_id(plan: Plan) -> str:
        return next(s.tool_use_id for s in plan.steps if isinstance(s, StartToolUse))

    one = plan_response(_body("[emu:loop] hi"))
    assert first_id(one) == first_id(plan_response(_body("[emu:loop] hi")))
    assert first_id(one) != first_id(plan_response(_follow_up("[emu:loop] hi", "2")))


# --- stop reasons and limits -----------------------------------------------------------------


def test_max_tokens_directive_cuts_after_five_deltas() -> None:
    """max_tokens cuts the answer after five deltas."""
    plan = plan_response(_body("[emu:max_tokens] Tell me a long story"))
    assert len(_text_deltas(plan)) == 5
    assert plan.stop_reason == "max_tokens"
    assert _usage(plan).output_tokens == 5


def test_inference_max_tokens_is_honoured() -> None:
    """inferenceConfig.maxTokens cuts only a longer answer."""
    plan = plan_response(_body("Hello", inferenceConfig={"maxTokens": 4}))
    assert len(_text_deltas(plan)) == 4
    assert plan.stop_reason == "max_tokens"
    roomy = plan_response(_body("Hello", inferenceConfig={"maxTokens": 100}))
    assert len(_text_deltas(roomy)) == 12
    assert roomy.stop_reason == "end_turn"


@pytest.mark.parametrize("reason", ["stop_sequence", "guardrail_intervened", "content_filtered", "end_turn"])
def test_stop_directive_sets_the_stop_reason(reason: str) -> None:
    """stop=REASON ends the text answer with REASON."""
    assert plan_response(_body(f"[emu:stop={reason}] Hello")).stop_reason == reason


def test_stop_directive_applies_to_the_answer_after_a_tool_result() -> None:
    """stop=REASON also applies to the final answer after a tool."""
    plan = plan_response(_follow_up("[emu:stop=stop_sequence] What is 1 + 1?", "2"))
    assert plan.stop_reason == "stop_sequence"


# --- failures -------------------------------------------------------------------------------


def test_fail_directive_raises_after_the_given_deltas() -> None:
    """fail=EXC with fail_after=K raises after K deltas and ends there."""
    plan = plan_response(_body("[emu:fail=modelStreamErrorException] [emu:fail_after=2] Hi"))
    assert len(_text_deltas(plan)) == 2
    assert isinstance(plan.steps[-1], RaiseException)
    assert plan.steps[-1].exception_type == "modelStreamErrorException"
    assert not any(isinstance(s, (StopMessage, ReportUsage)) for s in plan.steps)


def test_throttle_is_short_for_a_throttling_exception_after_three_deltas() -> None:
    """throttle raises throttlingException after the default three deltas."""
    plan = plan_response(_body("[emu:throttle] Hi"))
    assert len(_text_deltas(plan)) == 3
    failure = plan.steps[-1]
    assert isinstance(failure, RaiseException)
    assert failure.exception_type == "throttlingException"


def test_fail_after_zero_fails_right_after_message_start() -> None:
    """fail_after=0 raises before any content."""
    plan = plan_response(_body("[emu:fail=internalServerException] [emu:fail_after=0] Hi"))
    assert [type(s) for s in plan.steps] == [StartMessage, RaiseException]


def test_pascal_case_exception_name_is_accepted() -> None:
    """A PascalCase exception name is turned into botocore's camelCase."""
    plan = plan_response(_body("[emu:fail=ServiceUnavailableException] Hi"))
    failure = plan.steps[-1]
    assert isinstance(failure, RaiseException)
    assert failure.exception_type == "serviceUnavailableException"


def test_fail_applies_to_every_turn_of_the_conversation() -> None:
    """fail also hits the follow-up turn after a tool result."""
    plan = plan_response(_follow_up("[emu:throttle] What is 2 + 2?", "4"))
    assert isinstance(plan.steps[-1], RaiseException)


def test_fail_with_fewer_deltas_than_asked_fails_before_the_stop() -> None:
    """A short answer still fails, just before its stop."""
    plan = plan_response(_body("[emu:throttle] [emu:fail_after=50] [emu:tokens=4] Hi"))
    assert len(_text_deltas(plan)) == 4
    assert isinstance(plan.steps[-1], RaiseException)
    assert not any(isinstance(s, StopMessage) for s in plan.steps)


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (429, "ThrottlingException"),
        (500, "InternalServerException"),
        (503, "ServiceUnavailableException"),
        (400, "ValidationException"),
    ],
)
def test_http_directive_answers_before_any_stream(status: int, error_type: str) -> None:
    """http=STATUS maps to the restJson error type, on every turn."""
    plan = plan_response(_body(f"[emu:http={status}] Hi"))
    assert plan.steps == ()
    assert plan.http_error is not None
    assert (plan.http_error.status, plan.http_error.error_type) == (status, error_type)
    follow_up = plan_response(_follow_up(f"[emu:http={status}] What is 1 + 1?", "2"))
    assert follow_up.http_error == plan.http_error


def test_out_of_range_http_status_is_ignored() -> None:
    """A non-error status is ignored."""
    assert plan_response(_body("[emu:http=200] Hi")).http_error is None


@pytest.mark.parametrize("body", [None, [], "text", {}, {"messages": "hi"}, {"messages": []}])
def test_invalid_bodies_are_validation_errors(body: Any) -> None:
    """Bodies without a messages list are 400 ValidationException."""
    plan = plan_response(body)
    assert plan.http_error is not None
    assert (plan.http_error.status, plan.http_error.error_type) == (400, "ValidationException")


# --- reasoning, pacing, usage --------------------------------------------------------------


def test_reasoning_block_comes_before_the_text() -> None:
    """reasoning adds a signed reasoning block at index 0, before the text."""
    plan = plan_response(_body("[emu:reasoning] Hello"))
    reasoning = [s for s in plan.steps if isinstance(s, EmitReasoning)]
    signatures = [s for s in plan.steps if isinstance(s, EmitSignature)]
    assert len(reasoning) > 1 and len(signatures) == 1
    assert {s.index for s in reasoning} == {0} and signatures[0].index == 0
    first_text = next(i for i, s in enumerate(plan.steps) if isinstance(s, EmitText))
    assert plan.steps.index(signatures[0]) < plan.steps.index(StopBlock(0)) < first_text
    assert {s.index for s in plan.steps if isinstance(s, EmitText)} == {1}
    assert _usage(plan).output_tokens == len(reasoning) + 12


def test_pacing_overrides_are_read() -> None:
    """ttft= and tps= override pacing per request."""
    plan = plan_response(_body("[emu:ttft=250] [emu:tps=40.5] Hello"))
    assert (plan.ttft_ms, plan.tokens_per_second) == (250.0, 40.5)
    plain = plan_response(_body("Hello"))
    assert (plain.ttft_ms, plain.tokens_per_second) == (None, None)


def test_input_tokens_count_words_and_tool_specs() -> None:
    """Input tokens are words everywhere plus a flat cost per tool spec."""
    body = _follow_up("What is the square root of 144?", "12")
    body["system"] = [{"text": "You are terse."}]
    # 7 question words + 1 ("{}") tool input + 1 result word + 3 system words + one tool spec.
    assert count_input_tokens(body) == 7 + 1 + 1 + 3 + TOKENS_PER_TOOL_SPEC
    assert _usage(plan_response(body)).input_tokens == count_input_tokens(body)
