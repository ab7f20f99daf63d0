"""The official `openai` Python client against a running `rill serve` (SmolLM2-135M-Instruct).

usage: python openai_client.py BASE_URL API_KEY
Exits 0 when every check passes; prints what it checked.
"""

import math
import sys

import openai

base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=600)
QUESTION = [
    {"role": "system", "content": "You are a concise assistant. Answer in one short sentence, without any preamble."},
    {"role": "user", "content": "What is the capital of France?"},
]

# Models.
models = client.models.list()
ids = [m.id for m in models.data]
assert ids == ["smollm2-135m"], ids
model = ids[0]
assert client.models.retrieve(model).id == model

# Chat, whole.
r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24, temperature=0)
c = r.choices[0]
assert r.object == "chat.completion", r
assert c.message.role == "assistant"
assert "Paris" in c.message.content, c.message.content
assert c.finish_reason in ("stop", "length"), c.finish_reason
assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
whole = c.message.content
print("chat:", repr(whole))

# Chat, streamed with usage: the same text (greedy).
chunks = list(
    client.chat.completions.create(
        model=model,
        messages=QUESTION,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
)
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
assert text == whole, (text, whole)
assert chunks[0].choices[0].delta.role == "assistant"
finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
assert finals == [c.finish_reason], finals
assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
print("chat stream:", len(chunks), "chunks")

# The stream as the client's helper reads it.
with client.chat.completions.stream(model=model, messages=QUESTION, max_tokens=24, temperature=0) as s:
    final = s.get_final_completion()
assert final.choices[0].message.content == whole, final

# Log-probabilities: raw ones in OpenAI's fields; greedy takes the most likely raw token.
r = client.chat.completions.create(
    model=model, messages=QUESTION, max_tokens=8, temperature=0, logprobs=True, top_logprobs=5
)
content = r.choices[0].logprobs.content
assert len(content) == r.usage.completion_tokens, (len(content), r.usage)
for e in content:
    assert e.logprob <= 0 and len(e.top_logprobs) == 5, e
    assert e.top_logprobs[0].token == e.token, e
    assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6
    assert sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1.0 + 1e-4
    assert bytes(e.bytes).decode("utf-8", "replace") == e.token or e.token.startswith("bytes:")
    # rill's extension fields come through as extra attributes.
    assert e.model_extra["processed_logprob"] == 0.0, e.model_extra
print("logprobs:", [(e.token, round(e.logprob, 3)) for e in content])

# Sampling with a seed is reproducible; n choices differ.
kw = dict(model=model, messages=QUESTION, max_tokens=16, temperature=1.0, seed=42)
a = client.chat.completions.create(**kw)
b = client.chat.completions.create(**kw)
assert a.choices[0].message.content == b.choices[0].message.content
n = client.chat.completions.create(n=3, **kw)
assert [ch.index for ch in n.choices] == [0, 1, 2]
assert n.choices[0].message.content == a.choices[0].message.content
assert len({ch.message.content for ch in n.choices}) > 1, [ch.message.content for ch in n.choices]

# Extensions through extra_body: exactly max_tokens tokens.
r = client.chat.completions.create(
    model=model,
    messages=QUESTION,
    max_completion_tokens=20,
    extra_body={"ignore_eos": True, "min_tokens": 20, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1},
)
assert r.usage.completion_tokens == 20 and r.choices[0].finish_reason == "length", r

# Stop strings.
r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24, temperature=0, stop=["Paris"])
assert "Paris" not in r.choices[0].message.content and r.choices[0].finish_reason == "stop", r

# Completions, whole and streamed, with logprobs.
r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=3)
ch = r.choices[0]
assert r.object == "text_completion" and ch.text, r
assert len(ch.logprobs.tokens) == 8 == len(ch.logprobs.token_logprobs) == len(ch.logprobs.top_logprobs)
assert "".join(ch.logprobs.tokens) == ch.text
assert ch.logprobs.text_offset[0] == 0
for tok, lp, top in zip(ch.logprobs.tokens, ch.logprobs.token_logprobs, ch.logprobs.top_logprobs):
    assert lp <= 0 and top[tok] == lp and len(top) <= 3
streamed = "".join(
    c.choices[0].text
    for c in client.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True)
    if c.choices
)
assert streamed == ch.text, (streamed, ch.text)
batch = client.completions.create(model=model, prompt=["Once upon a time", "The sky is"], max_tokens=4, temperature=0)
assert [c.index for c in batch.choices] == [0, 1] and batch.choices[0].text == ch.text[: len(batch.choices[0].text)]
print("completions:", repr(ch.text))

# Errors become the client's exceptions.
def raises(exc, **kw):
    try:
        client.chat.completions.create(**{"model": model, "messages": QUESTION, "max_tokens": 4, **kw})
    except exc as e:
        return e
    raise AssertionError(f"{kw}: no {exc.__name__}")

e = raises(openai.BadRequestError, temperature=5)
assert e.status_code == 400 and e.body["param"] == "temperature", e.body
e = raises(openai.BadRequestError, max_tokens=100000)
assert e.body["code"] == "context_length_exceeded", e.body
e = raises(openai.NotFoundError, model="gpt-4o")
assert e.body["code"] == "model_not_found"
bad = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
try:
    bad.models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401
print("errors: ok")
print("ok")
