"""Ask a running Corral (make run) to classify a few digits from scikit-learn's data set.

.venv/bin/python examples/digits/client.py [URL]
"""

import json
import sys
import urllib.request

from sklearn.datasets import load_digits

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/infer"
digits = load_digits()
for image, truth in zip(digits.data[:5], digits.target[:5]):
    request = urllib.request.Request(
        url,
        data=json.dumps({"pixels": image.tolist()}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        answer = json.load(response)
    print(f"true {truth}, predicted {answer['label']} (p={max(answer['probabilities']):.3f})")
