"""A worker with a slow warm-up: it holds its warm-up until the file WARM_GATE exists (when set;
the test creates it once it has seen the proxy not ready), and fails it when WARM_FAIL is set.
With WARM_PIDFILE set, it writes its pid there as its warm-up starts."""

import os
import time

import corral


class Warm(corral.Worker):
    examples = ({"warm": True},)

    def forward(self, batch):
        if any(isinstance(item, dict) and item.get("warm") for item in batch):
            pidfile = os.environ.get("WARM_PIDFILE")
            if pidfile:
                with open(pidfile + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.rename(pidfile + ".tmp", pidfile)
            gate = os.environ.get("WARM_GATE")
            while gate and not os.path.exists(gate):
                time.sleep(0.005)  # polling for the file the test creates
            if os.environ.get("WARM_FAIL"):
                raise RuntimeError("could not load the model")
        return batch


if __name__ == "__main__":
    Warm.run()
