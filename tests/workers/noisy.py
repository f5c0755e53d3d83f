"""The scripted worker, plus output on request, for the output-forwarding tests.

An item `{"print_hex": "..."}` writes those bytes to stdout (newline included if wanted) before
the batch is answered; `{"print_run": n}` writes n bytes of `#` with no newline, as a progress bar
drawn with `\\r` does; `{"print_both": n}` writes n numbered lines to stdout and n to stderr,
alternating, each flushed at once (Corral forwards the two pipes on tasks of their own). Everything
else is as in scripted.py.
"""

import sys

from scripted import Scripted


class Noisy(Scripted):
    def forward(self, batch):
        for item in batch:
            if isinstance(item, dict) and "print_hex" in item:
                sys.stdout.buffer.write(bytes.fromhex(item["print_hex"]))
            if isinstance(item, dict) and "print_run" in item:
                chunk = b"#" * (1 << 20)
                left = item["print_run"]
                while left > 0:
                    sys.stdout.buffer.write(chunk[:left])
                    left -= len(chunk)
            if isinstance(item, dict) and "print_both" in item:
                for n in range(item["print_both"]):
                    for name, stream in (("out", sys.stdout), ("err", sys.stderr)):
                        stream.buffer.write(f"{name} {n}\n".encode())
                        stream.buffer.flush()
        sys.stdout.buffer.flush()
        return super().forward(batch)


if __name__ == "__main__":
    Noisy.run()
