"""Send a few scans to the pipeline example (make run-pipeline) and print what it read.

.venv/bin/python examples/pipeline/client.py [URL]
"""

import json
import sys
import urllib.request

from sklearn.datasets import load_digits

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/infer"
digits = load_digits()
for image, truth in zip(digits.images[:5], digits.target[:5]):
    # The data set's 0 (white) to 16 (black), as a scanner's 0 (black) to 255 (white).
    scan = [[round(255 - value * 255 / 16) for value in row] for row in image]
    request = urllib.request.Request(
        url,
        data=json.dumps({"image": scan}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        answer = json.load(response)
    print(f"true {truth}, predicted {answer['label']} (p={max(answer['probabilities']):.3f})")
