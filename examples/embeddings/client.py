"""Embed a few sentences through a running Corral (make run-embeddings) and compare them.

examples/embeddings/.venv/bin/python examples/embeddings/client.py [URL]
"""

import json
import sys
import urllib.request

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/infer"
sentences = [
    "A cat sits on the mat.",
    "A kitten is resting on a rug.",
    "The stock market fell sharply today.",
]
request = urllib.request.Request(
    url,
    data=json.dumps([{"text": s} for s in sentences]).encode(),
    headers={"content-type": "application/json", "x-corral-items": "many"},
)
with urllib.request.urlopen(request) as response:
    vectors = [answer["embedding"] for answer in json.load(response)]
for i in range(len(sentences)):
    for j in range(i + 1, len(sentences)):
        similarity = sum(a * b for a, b in zip(vectors[i], vectors[j]))
        print(f"{similarity:.3f}  {sentences[i]!r} ~ {sentences[j]!r}")
