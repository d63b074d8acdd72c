"""``graphstore-train --loader-workers N``: sampler processes beside each rank train to the same loss, epoch by
epoch, as the rank's own loader threads."""

from __future__ import annotations

import pytest

from tests.training.conftest import metrics, run_train

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


@pytest.mark.parametrize("task", ["node", "link"])
def test_loader_workers_train_to_the_loss_of_the_ranks_own_threads(synthetic2, tmp_path, task):
    losses = []
    for flags in ([], ["--loader-workers", 1]):  # one sampler process a rank: the fewest processes to start
        out = tmp_path / f"m{len(losses)}.json"
        # --eval-every 3 of 2 epochs: no evaluation (the training losses are compared)
        # a link batch holds 3 times its size in seeds (source, destination, negative): fewer, larger batches
        done = run_train(synthetic2, "--nproc", 2, "--epochs", 2, "--task", task, "--fanout", "5,5",
                         "--batch-size", 128 if task == "node" else 512, "--eval-every", 3, "--metrics-out", out,
                         *flags)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stderr.count("no stored link split") <= 1, "a sampler process repeats its rank's warnings"
        losses.append([e["loss"] for e in metrics(out)["epochs"]])
    assert len(losses[0]) == 2 and losses[1] == losses[0]
