"""The plainest worker, started by tests that connect workers themselves: echoes each item, and
prints one line once it is connected-to-be (so the test knows it started)."""

import corral


class Echo(corral.Worker):
    def forward(self, batch):
        return batch


if __name__ == "__main__":
    print("starting", flush=True)
    Echo.run()
