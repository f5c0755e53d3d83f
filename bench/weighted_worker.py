"""The weights benchmark's worker: items `{"text": ...}`, weighed by the length of their text
(`weight = "/text"`), and a batch that costs 2 ms + 5 µs per character + 20 ms × (characters /
1024)², spent sleeping — a model whose memory traffic grows with the batch's total length, as a
transformer's does with its tokens."""

import time

import corral


class Weighted(corral.Worker):
    weight = "/text"

    def forward(self, batch: list) -> list:
        characters = sum(len(item.get("text", "")) for item in batch)
        time.sleep(0.002 + 0.000005 * characters + 0.020 * (characters / 1024) ** 2)
        return [len(item.get("text", "")) for item in batch]


if __name__ == "__main__":
    Weighted.run()
