"""The official `anthropic` Python client against a running `rill serve` (SmolLM2-135M-Instruct):
Messages whole and streamed, tools with a tool_result round trip (whole and streamed),
count_tokens, structured output, and Anthropic's error shapes. The 2026 SDK sends no
`temperature`; `extra_body` carries it for repeatable answers.

usage: python anthropic_client.py BASE_URL API_KEY
"""

import json
import sys

import anthropic

base, key = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=600)
model = "smollm2-135m"
GREEDY = {"temperature": 0}
SYSTEM = "You are a concise assistant. Answer in one short sentence, without any preamble."
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]

# Whole.
m = client.messages.create(model=model, max_tokens=40, system=SYSTEM, messages=QUESTION, extra_body=GREEDY)
assert m.type == "message" and m.role == "assistant", m
assert m.content[0].type == "text" and "Paris" in m.content[0].text, m
assert m.stop_reason == "end_turn", m
assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0, m
print("whole:", m.content[0].text)

# Streamed: the same text, the same stop reason; the final message the SDK assembles.
with client.messages.stream(model=model, max_tokens=40, system=SYSTEM, messages=QUESTION, extra_body=GREEDY) as s:
    pieces = list(s.text_stream)
    final = s.get_final_message()
assert "".join(pieces) == m.content[0].text, (pieces, m)
assert final.content[0].text == m.content[0].text and final.stop_reason == "end_turn", final
print("streamed:", len(pieces), "deltas")

# A max_tokens far past the context is a cap (the SDK streams requests that large).
with client.messages.stream(model=model, max_tokens=64000, messages=QUESTION, extra_body=GREEDY) as s:
    capped = s.get_final_message()
assert capped.stop_reason in ("end_turn", "max_tokens"), capped
print("64000 max_tokens:", capped.stop_reason)

# Stop sequences.
m = client.messages.create(model=model, max_tokens=40, system=SYSTEM, messages=QUESTION, stop_sequences=["Paris"], extra_body=GREEDY)
assert m.stop_reason == "stop_sequence" and m.stop_sequence == "Paris", m

# Tools: a call, then its result back.
tools = [{
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
m = client.messages.create(model=model, max_tokens=200, tools=tools, tool_choice={"type": "any"}, messages=ask, extra_body=GREEDY)
uses = [b for b in m.content if b.type == "tool_use"]
assert m.stop_reason == "tool_use" and uses, m
assert uses[0].name == "get_weather" and isinstance(uses[0].input, dict) and "city" in uses[0].input, m
print("tool_use:", uses[0].input)
with client.messages.stream(model=model, max_tokens=200, tools=tools, tool_choice={"type": "tool", "name": "get_weather"}, messages=ask, extra_body=GREEDY) as s:
    streamed = s.get_final_message()
streamed_uses = [b for b in streamed.content if b.type == "tool_use"]
assert streamed.stop_reason == "tool_use" and len(streamed_uses) == 1, streamed
assert streamed_uses[0].input == uses[0].input, (streamed, m)
follow = ask + [
    {"role": "assistant", "content": m.content},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 21 C"}]},
]
m2 = client.messages.create(model=model, max_tokens=60, tools=tools, tool_choice={"type": "none"}, messages=follow, extra_body=GREEDY)
assert m2.stop_reason in ("end_turn", "max_tokens") and m2.content[0].type == "text", m2
print("after tool_result:", m2.content[0].text)

# Structured output (output_config.format).
schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}
m = client.messages.create(model=model, max_tokens=60, messages=QUESTION, output_config={"format": {"type": "json_schema", "schema": schema}}, extra_body=GREEDY)
doc = json.loads(m.content[0].text)
assert set(doc) == {"city"}, m

# count_tokens.
n = client.messages.count_tokens(model=model, system=SYSTEM, messages=QUESTION)
assert n.input_tokens > 10, n

# Errors in Anthropic's shape.
try:
    client.messages.create(model=model, max_tokens=10, messages=[])
    raise AssertionError("an empty messages list was accepted")
except anthropic.BadRequestError as e:
    assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
try:
    client.messages.create(model="not-served", max_tokens=10, messages=QUESTION)
    raise AssertionError("an unknown model was served")
except anthropic.NotFoundError as e:
    assert e.body["error"]["type"] == "not_found_error", e.body
try:
    anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(model=model, max_tokens=5, messages=QUESTION)
    raise AssertionError("a wrong key was accepted")
except anthropic.AuthenticationError as e:
    assert e.body["error"]["type"] == "authentication_error", e.body
print("ok")
