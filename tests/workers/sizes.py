"""A worker for tests at real sizes: each item (raw bytes) is answered with its length and the
lengths of every item in its batch, so a test sees how many bytes each batch carried."""

import corral


class Sizes(corral.Worker):
    def forward(self, batch):
        sizes = [len(item) for item in batch]
        return [{"size": size, "batch": sizes} for size in sizes]


if __name__ == "__main__":
    Sizes.run()
