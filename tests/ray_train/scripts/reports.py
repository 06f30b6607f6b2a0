"""A Ray Train callback that keeps what every worker reported, for the tests to read."""

import json

import ray.train


class Reports(ray.train.UserCallback):
    """Appends every report (a list: each worker's metrics, by rank) to a JSON-lines file; it
    runs in Ray's controller, on this machine."""

    def __init__(self, path: str) -> None:
        self.path = path

    def after_report(self, run_context, metrics, checkpoint) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
