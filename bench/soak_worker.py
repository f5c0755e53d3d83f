"""The soak's large-frame worker: each item names its own output size, so that inputs and
outputs of up to 4 MiB travel independently.

An item ``{"nonce": n, "blob": "...", "reply_bytes": k}`` is answered
``{"nonce": n, "blob_len": len(blob), "reply": "y" * k}``; anything else is echoed (the harness's
readiness probe). A batch takes 1–5 ms, so a busy stage queues full batches and sends them ahead.
"""

import random
import time

import corral


class Sizes(corral.Worker):
    def forward(self, batch):
        time.sleep(random.uniform(0.001, 0.005))
        return [self.answer(item) for item in batch]

    @staticmethod
    def answer(item):
        if not isinstance(item, dict) or "reply_bytes" not in item:
            return item
        return {
            "nonce": item["nonce"],
            "blob_len": len(item["blob"]),
            "reply": "y" * item["reply_bytes"],
        }


if __name__ == "__main__":
    Sizes.run()
