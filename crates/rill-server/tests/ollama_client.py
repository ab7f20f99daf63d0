"""The official `ollama` Python client against a running `rill serve` (SmolLM2-135M-Instruct):
list, show, ps, chat and generate (whole and streamed), `format`, tools, options, and errors.

usage: python ollama_client.py BASE_URL API_KEY
"""

import json
import sys

import ollama

base, key = sys.argv[1], sys.argv[2]
client = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"})
GREEDY = {"temperature": 0, "num_predict": 40}
QUESTION = [
    {"role": "system", "content": "You are a concise assistant. Answer in one short sentence, without any preamble."},
    {"role": "user", "content": "What is the capital of France?"},
]

models = client.list().models
assert [m.model for m in models] == ["smollm2-135m:latest"], models
assert models[0].details.format == "gguf" and models[0].size > 0 and len(models[0].digest) == 64, models
shown = client.show("smollm2-135m")
assert "completion" in shown.capabilities and shown.template, shown
assert client.ps().models[0].context_length > 0

# Chat, whole and streamed: the same text.
r = client.chat(model="smollm2-135m", messages=QUESTION, options=GREEDY)
assert r.done and r.done_reason == "stop" and "Paris" in r.message.content, r
assert r.prompt_eval_count > 0 and r.eval_count > 0 and r.total_duration > 0, r
pieces = [p.message.content for p in client.chat(model="smollm2-135m:latest", messages=QUESTION, options=GREEDY, stream=True)]
assert "".join(pieces) == r.message.content, (pieces, r)
print("chat:", r.message.content)

# Cut by num_predict.
r = client.chat(model="smollm2-135m", messages=QUESTION, options={"temperature": 0, "num_predict": 3})
assert r.done_reason == "length" and r.eval_count == 3, r

# Generate: templated and raw, with a stop string.
r = client.generate(model="smollm2-135m", prompt="What is the capital of France?", system=QUESTION[0]["content"], options=GREEDY)
assert "Paris" in r.response and r.done_reason == "stop", r
r = client.generate(model="smollm2-135m", prompt="The capital of France is", raw=True, options={"temperature": 0, "num_predict": 20, "stop": ["."]})
assert "." not in r.response and r.response.strip(), r
pieces = [p.response for p in client.generate(model="smollm2-135m", prompt="The capital of France is", raw=True, options={"temperature": 0, "num_predict": 20, "stop": ["."]}, stream=True)]
assert "".join(pieces) == r.response, (pieces, r)
print("generate:", r.response)

# format: "json" and a schema.
r = client.chat(model="smollm2-135m", messages=[{"role": "user", "content": "Name a city."}], format="json", options={"temperature": 0})
assert isinstance(json.loads(r.message.content), dict), r
schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}
r = client.chat(model="smollm2-135m", messages=[{"role": "user", "content": "Name a city."}], format=schema, options={"temperature": 0})
assert set(json.loads(r.message.content)) == {"city"}, r


# Tools: the client builds the schema from a function.
def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
      city: the city
    """
    return "Sunny, 21 C"


ask = [{"role": "user", "content": "What is the weather in Paris?"}]
r = client.chat(model="smollm2-135m", messages=ask, tools=[get_weather], options={"temperature": 0})
assert r.message.tool_calls and r.message.tool_calls[0].function.name == "get_weather", r
assert "city" in r.message.tool_calls[0].function.arguments, r
follow = ask + [r.message, {"role": "tool", "content": get_weather(**r.message.tool_calls[0].function.arguments), "tool_name": "get_weather"}]
r2 = client.chat(model="smollm2-135m", messages=follow, options={"temperature": 0, "num_predict": 40})
assert r2.done, r2
print("tool call:", r.message.tool_calls[0].function.arguments)

# Embeddings.
e = client.embed(model="smollm2-135m", input=["The capital of France is Paris.", "Bananas are yellow."])
assert len(e.embeddings) == 2 and len(e.embeddings[0]) > 100, e
legacy = client.embeddings(model="smollm2-135m", prompt="Bananas are yellow.")
assert max(abs(a - b) for a, b in zip(legacy.embedding, e.embeddings[1])) < 1e-6

# Errors in Ollama's shape.
try:
    client.chat(model="not-served", messages=QUESTION)
    raise AssertionError("an unknown model was served")
except ollama.ResponseError as e:
    assert e.status_code == 404 and "not-served" in e.error, e
try:
    client.chat(model="smollm2-135m", messages=QUESTION, options={"temperature": 9})
    raise AssertionError("a temperature of 9 was accepted")
except ollama.ResponseError as e:
    assert e.status_code == 400 and "temperature" in e.error, e
print("ok")
