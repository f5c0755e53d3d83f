"""The optional tracing hooks cost nothing for jobs the proxy does not trace: no import of
`opentelemetry`, and the same shared no-op context for every hook."""

import subprocess
import sys

from corral import _tracing

UNTRACED = {"id": b"\x01" * 16, "timeout_ms": 1000, "payload": b"\x01"}


def test_untraced_jobs_get_the_shared_no_op():
    assert _tracing.item(UNTRACED, "preprocess") is _tracing._NOTHING
    assert _tracing.batch([UNTRACED, UNTRACED]) is _tracing._NOTHING


def test_untraced_batches_never_import_opentelemetry():
    code = (
        "import sys\n"
        "from corral import Worker, _tracing\n"
        "job = {'id': b'1' * 16, 'timeout_ms': 1000, 'payload': b'\\x01'}\n"
        "with _tracing.batch([job]), _tracing.item(job, 'preprocess'):\n"
        "    pass\n"
        "print('opentelemetry' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
