"""A worker with a slow warm-up (WARM_SECONDS, default 1), which fails when WARM_FAIL is set."""

import os
import time

import corral


class Warm(corral.Worker):
    examples = ({"warm": True},)

    def forward(self, batch):
        if any(isinstance(item, dict) and item.get("warm") for item in batch):
            time.sleep(float(os.environ.get("WARM_SECONDS", "1")))
            if os.environ.get("WARM_FAIL"):
                raise RuntimeError("could not load the model")
        return batch


if __name__ == "__main__":
    Warm.run()
