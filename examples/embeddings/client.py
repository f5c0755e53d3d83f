"""Embed a few sentences through a running Corral (make run-embeddings) and compare them: once
with the `openai` package against OpenAI's `/v1/embeddings`, once on Corral's own `/infer` route,
and check that both give the same vectors.

examples/embeddings/.venv/bin/python examples/embeddings/client.py [BASE_URL]
"""

import json
import sys
import urllib.request

import openai

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
sentences = [
    "A cat sits on the mat.",
    "A kitten is resting on a rug.",
    "The stock market fell sharply today.",
]

# OpenAI's API: each input string is one job; the three share a batch.
client = openai.OpenAI(base_url=base + "/v1", api_key="unused")
answer = client.embeddings.create(model="all-MiniLM-L6-v2", input=sentences)
vectors = [item.embedding for item in answer.data]

# Corral's own route: one {"text": ...} per item.
request = urllib.request.Request(
    base + "/infer",
    data=json.dumps([{"text": s} for s in sentences]).encode(),
    headers={"content-type": "application/json", "x-corral-items": "many"},
)
with urllib.request.urlopen(request) as response:
    native = [item["embedding"] for item in json.load(response)]
# OpenAI's vectors are float32; the two calls may also batch differently (about 1e-7 apart).
assert all(abs(a - b) < 1e-5 for u, v in zip(vectors, native) for a, b in zip(u, v))

for i in range(len(sentences)):
    for j in range(i + 1, len(sentences)):
        similarity = sum(a * b for a, b in zip(vectors[i], vectors[j]))
        print(f"{similarity:.3f}  {sentences[i]!r} ~ {sentences[j]!r}")
