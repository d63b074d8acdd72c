"""Evaluation cadence (--eval-every) and subset (--eval-max-batches): which epochs evaluate, over how much."""

from __future__ import annotations

import pytest

from graphstore.errors import InvalidInputError
from training.config import TrainConfig
from training.loop.evaluation import EvalPlan, evaluate, limited


@pytest.mark.parametrize("every,cap,epochs,kinds", [
    (1, 0, 3, ["full", "full", "full"]),
    (2, 0, 5, [None, "full", None, "full", "full"]),
    (3, 4, 7, [None, None, "subset", None, None, "subset", "full"]),
    (10, 0, 3, [None, None, "full"]),  # a cadence longer than the run: the final evaluation only
    (1, 2, 1, ["full"]),  # the last epoch is complete whatever the cap
])
def test_which_epochs_evaluate(every, cap, epochs, kinds):
    plan = EvalPlan(every, cap, epochs)
    assert [plan.kind(e) for e in range(epochs)] == kinds
    for e in range(epochs):  # the next evaluation named after a skipped epoch is one that happens
        nxt = plan.next_after(e)
        assert nxt > e + 1 or e == epochs - 1
        assert plan.kind(nxt - 1) is not None


class _Loader:
    """A loader whose iterators count the batches they made and whether they were closed."""

    def __init__(self, n):
        self.n, self.made, self.closed = n, 0, 0

    def __iter__(self):
        loader = self

        class It:
            def __iter__(self):
                return self

            def __next__(self):
                if loader.made >= loader.n:
                    raise StopIteration
                loader.made += 1
                return loader.made

            def close(self):
                loader.closed += 1

        return It()


def test_limited_takes_the_first_batches_and_closes_the_prefetcher():
    loader = _Loader(10)
    assert list(limited(loader, 3)) == [1, 2, 3]
    assert loader.closed == 1 and loader.made <= 4  # stopped early, not drained
    loader = _Loader(5)
    assert list(limited(loader, 0)) == [1, 2, 3, 4, 5] and loader.closed == 1


class _Task:
    metric = "acc"

    def __init__(self):
        self.seen = {}

    def evaluate(self, model, batches):
        got = list(batches)
        return float(len(got))


def test_evaluate_fields_for_each_kind():
    loaders = {"val": _Loader(6), "test": _Loader(6)}
    out = evaluate(_Task(), None, loaders, "subset", 2)
    assert out["evaluation"] == "subset" and out["val_acc"] == 2.0 and out["test_acc"] == 2.0
    assert out["eval_seconds"] >= 0
    loaders = {"val": _Loader(6), "test": _Loader(6)}
    assert evaluate(_Task(), None, loaders, "full", 2)["val_acc"] == 6.0  # the cap is for subsets only
    skipped = evaluate(_Task(), None, {"val": _Loader(6)}, None, 2)
    assert skipped["evaluation"] == "none" and "val_acc" not in skipped


@pytest.mark.parametrize("field,value", [("eval_every", 0), ("eval_every", -1), ("eval_every", 1.5),
                                         ("eval_every", True), ("eval_max_batches", -1), ("eval_max_batches", "2"),
                                         ("threads", 0)])
def test_bad_values_refused_naming_the_flag(field, value):
    flag = "--" + field.replace("_", "-")
    with pytest.raises(InvalidInputError, match=flag):
        TrainConfig(dataset="ds", **{field: value})
