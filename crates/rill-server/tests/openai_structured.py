"""Structured output and tool calls through the official `openai` client (SmolLM2-135M-Instruct).

usage: python openai_structured.py BASE_URL API_KEY
Exits 0 when every check passes; prints what it checked.
"""

import json
import sys
from typing import List, Literal

import openai
from pydantic import BaseModel, Field

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=600)
model = client.models.list().data[0].id


# parse() with a Pydantic model: the client sends response_format json_schema (strict) and
# parses the answer back into the model.
class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=150)
    languages: List[Literal["English", "French", "German", "Spanish"]] = Field(max_length=3)


r = client.chat.completions.parse(
    model=model,
    messages=[{"role": "user", "content": "Describe a polyglot person as JSON."}],
    response_format=Person,
    temperature=0,
    max_tokens=120,
)
p = r.choices[0].message.parsed
assert isinstance(p, Person), r
assert r.choices[0].finish_reason == "stop", r
print("parse:", p)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current time in a timezone",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_call(call, name):
    assert call.type == "function" and call.id.startswith("call_"), call
    assert call.function.name == name, call
    args = json.loads(call.function.arguments)
    assert isinstance(args, dict), args
    if name == "get_weather":
        assert isinstance(args["city"], str), args
    return args


# required and named: a call, from the first token.
for choice, name in [("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")]:
    r = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, temperature=0, max_tokens=100
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert c.message.tool_calls, c
    for call in c.message.tool_calls:
        check_call(call, name or call.function.name)
    print("tool_choice", choice, "->", [(t.function.name, t.function.arguments) for t in c.message.tool_calls])

# auto: the model decides (SmolLM2 calls the weather tool for this question).
r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=100)
c = r.choices[0]
assert c.finish_reason == "tool_calls" and c.message.content is None, c
args = check_call(c.message.tool_calls[0], "get_weather")
print("auto ->", args)

# Streamed: the client assembles the calls from the deltas; the same call as whole.
with client.beta.chat.completions.stream(
    model=model, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=100
) as s:
    final = s.get_final_completion()
fc = final.choices[0]
assert fc.finish_reason == "tool_calls", fc
assert fc.message.tool_calls[0].function.arguments == c.message.tool_calls[0].function.arguments, fc
chunks = list(client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=100, stream=True))
first = [ch.choices[0].delta.tool_calls[0] for ch in chunks if ch.choices and ch.choices[0].delta.tool_calls]
assert first[0].id and first[0].function.name == "get_weather", first[0]
assert all(d.id is None and d.function.name is None for d in first[1:]), first
print("stream: ok,", len(first), "tool-call deltas")

# The round trip: the call and its result in the history, then an answer in text.
call = c.message.tool_calls[0]
history = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"city": "Paris", "temperature_c": 21, "sky": "sunny"})},
]
r = client.chat.completions.create(model=model, messages=history, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=60)
c = r.choices[0]
assert c.finish_reason == "stop" and c.message.content and not c.message.tool_calls, c
assert "tool_calls" not in c.message.content and not c.message.content.startswith("{"), c
print("round trip:", repr(c.message.content))

# tool_choice naming an unknown tool is a 400.
try:
    client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    raise AssertionError("an unknown tool was accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "tool_choice.function.name", e.body
print("ok")
