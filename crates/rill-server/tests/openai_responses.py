"""The official `openai` Python client's Responses API against a running `rill serve`
(SmolLM2-135M-Instruct): whole and streamed, instructions, previous_response_id, function
tools with a function_call_output round trip (whole and streamed), text.format, and errors.

usage: python openai_responses.py BASE_URL API_KEY
"""

import json
import sys

import openai

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=600)
model = "smollm2-135m"
INSTRUCTIONS = "You are a concise assistant. Answer in one short sentence, without any preamble."

# Whole.
r = client.responses.create(model=model, instructions=INSTRUCTIONS, input="What is the capital of France?", temperature=0, max_output_tokens=40)
assert r.object == "response" and r.status == "completed", r
assert "Paris" in r.output_text, r
assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r
print("whole:", r.output_text)

# Streamed: the same text; the SDK's event accumulation gives the final response.
deltas = []
with client.responses.stream(model=model, instructions=INSTRUCTIONS, input="What is the capital of France?", temperature=0, max_output_tokens=40) as s:
    for event in s:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
    final = s.get_final_response()
assert "".join(deltas) == r.output_text == final.output_text, (deltas, final)
print("streamed:", len(deltas), "deltas")

# Cut by max_output_tokens: incomplete.
r_cut = client.responses.create(model=model, input="Tell me a long story.", temperature=0, max_output_tokens=5)
assert r_cut.status == "incomplete" and r_cut.incomplete_details.reason == "max_output_tokens", r_cut

# A conversation continued from a stored response, and the stored response fetched.
r2 = client.responses.create(model=model, input="And of Germany?", previous_response_id=r.id, temperature=0, max_output_tokens=40)
assert r2.status == "completed" and r2.usage.input_tokens > r.usage.input_tokens, r2
assert client.responses.retrieve(r.id).output_text == r.output_text
print("continued:", r2.output_text)

# Function tools: a call, then its output back.
tools = [{
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
r = client.responses.create(model=model, input=ask, tools=tools, tool_choice="required", temperature=0)
calls = [o for o in r.output if o.type == "function_call"]
assert calls and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments), r
print("function_call:", calls[0].arguments)
with client.responses.stream(model=model, input=ask, tools=tools, tool_choice="required", parallel_tool_calls=False, temperature=0) as s:
    streamed = s.get_final_response()
streamed_calls = [o for o in streamed.output if o.type == "function_call"]
assert len(streamed_calls) == 1 and streamed_calls[0].arguments == calls[0].arguments, streamed
follow = ask + [calls[0], {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}]
r3 = client.responses.create(model=model, input=follow, tools=tools, tool_choice="none", temperature=0, max_output_tokens=60)
assert r3.output[0].type == "message" and r3.output_text, r3
print("after function_call_output:", r3.output_text)

# Structured output.
schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}
r = client.responses.create(model=model, input="What is the capital of France?", text={"format": {"type": "json_schema", "name": "city", "schema": schema}}, temperature=0, max_output_tokens=60)
assert set(json.loads(r.output_text)) == {"city"}, r

# Embeddings (the client asks for base64 by default and decodes it).
e = client.embeddings.create(model=model, input=["The capital of France is Paris.", "Paris is in France.", "Bananas are yellow."])
vectors = [d.embedding for d in e.data]
assert len(vectors) == 3 and all(abs(sum(x * x for x in v) - 1) < 1e-3 for v in vectors), e
dot = lambda u, v: sum(a * b for a, b in zip(u, v))
assert dot(vectors[0], vectors[1]) > dot(vectors[0], vectors[2]), "related sentences should be closer"
floats = client.embeddings.create(model=model, input="Bananas are yellow.", encoding_format="float")
assert max(abs(a - b) for a, b in zip(floats.data[0].embedding, vectors[2])) < 1e-6
print("embeddings:", len(vectors[0]), "dimensions")

# Errors in OpenAI's shape.
try:
    client.responses.create(model=model, input="x", previous_response_id="resp_unknown")
    raise AssertionError("an unknown previous_response_id was accepted")
except openai.NotFoundError as e:
    assert e.body["param"] == "previous_response_id", e.body
try:
    client.responses.create(model=model, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}])
    raise AssertionError("an image was accepted")
except openai.BadRequestError as e:
    assert "text only" in e.body["message"], e.body
print("ok")
