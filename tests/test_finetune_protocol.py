"""evaluation.finetune_protocol: the epoch chosen on validation, and the early stop after --finetune-patience epochs."""

import argparse

import pytest
import torch

from evaluation import finetune_protocol
from evaluation.finetune_protocol import FineTuned, finetune

WRITE_RUN = finetune_protocol.write_run


class Points:
    """A split of 2-D points for `finetune`: the pixels are the points themselves."""

    def __init__(self, points: torch.Tensor, labels: torch.Tensor):
        self.points, self.labels = points, labels

    def __len__(self) -> int:
        return len(self.labels)

    def pixels(self, rows) -> torch.Tensor:
        return self.points[rows]


@pytest.mark.parametrize("patience", [None, 1, 2])
def test_fine_tuning_stops_after_patience_epochs_without_a_better_validation_accuracy(patience):
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(48) % 2
    points = torch.randn(48, 2, generator=generator) + 2.0 * labels[:, None]  # two overlapping clusters
    backbone = torch.nn.Linear(2, 2)
    head = torch.nn.Linear(2, 2)
    with torch.no_grad():  # the start: a head that reads the wrong axis sign, well below what training reaches
        head.weight.copy_(-torch.eye(2)), head.bias.zero_(), backbone.weight.copy_(torch.eye(2)), backbone.bias.zero_()
    model = FineTuned(lambda net, rows, pixels, seed: net(pixels), backbone, head)
    args = argparse.Namespace(finetune_lr=1e-3, batch_size=8, finetune_epochs=12, finetune_patience=patience, seed=0)
    split = Points(points, labels)
    result = finetune(model, split, split, args, val=16)
    history = result["val_accuracy"]
    best = max(range(len(history)), key=lambda epoch: (history[epoch], -epoch))  # the first best
    assert result["epoch"] == best
    if patience is None:
        assert len(history) == 13 and not result["stopped_early"]
    else:  # it ran until `patience` epochs in a row had not beaten the best, and not one epoch more
        stop = next((epoch for epoch in range(1, 13)
                     if epoch - max(range(epoch + 1), key=lambda e: (history[e], -e)) >= patience), 12)
        assert len(history) - 1 == stop and result["stopped_early"] == (stop < 12)
    assert history[best] > history[0]  # it learnt: the start was not kept


class Killed(Exception):
    """The run's end where a kill would have stopped it."""


def points_run(tmp_path, monkeypatch, stop_after: int | None = None, identity: dict | None = None, patience=3):
    """`finetune` on the two clusters with a Resume file, stopped (Killed) once epoch `stop_after` is kept; its result
    and the kept epoch's weights."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(48) % 2
    points = torch.randn(48, 2, generator=generator) + 2.0 * labels[:, None]
    torch.manual_seed(0)
    model = FineTuned(lambda net, rows, pixels, seed: torch.nn.functional.dropout(net(pixels), 0.2, net.training),
                      torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    args = argparse.Namespace(finetune_lr=3e-3, batch_size=8, finetune_epochs=12, finetune_patience=patience, seed=0)
    write = WRITE_RUN  # the module's own: a wrapper set by an earlier call is not called again

    def killed_after(resume, key, run, *rest):
        write(resume, key, run, *rest)
        if len(run["history"]) - 1 == stop_after:
            raise Killed

    monkeypatch.setattr(finetune_protocol, "write_run", killed_after)
    split = Points(points, labels)
    resume = finetune_protocol.Resume(tmp_path / "line" / "state.pt", identity or {"line": "a"})
    return {**finetune(model, split, split, args, val=16, resume=resume), "weights": model.state_dict()}


def test_a_killed_fine_tuning_goes_on_from_its_last_epoch_to_the_same_bits(tmp_path, monkeypatch):
    """A run killed after epoch 3 and started again resumes after epoch 3 (the dense teacher's run takes hours here)
    and ends where a run never stopped ends: the same validation history, kept epoch and test answers (the random
    order and dropout's draws restored too). Another run's file is not resumed."""
    whole = points_run(tmp_path / "whole", monkeypatch, patience=None)
    with pytest.raises(Killed):
        points_run(tmp_path / "killed", monkeypatch, stop_after=3, patience=None)
    resumed = points_run(tmp_path / "killed", monkeypatch, patience=None)
    assert resumed["resumed_after_epoch"] == 3 and whole["resumed_after_epoch"] is None
    assert resumed["val_accuracy"] == whole["val_accuracy"] and resumed["epoch"] == whole["epoch"]
    assert torch.equal(resumed["predictions"], whole["predictions"])
    assert all(torch.equal(resumed["weights"][name], value) for name, value in whole["weights"].items())
    again = points_run(tmp_path / "killed", monkeypatch, patience=None)  # a finished run: only the test answers
    assert again["resumed_after_epoch"] == 12 and torch.equal(again["predictions"], whole["predictions"])
    other = points_run(tmp_path / "killed", monkeypatch, identity={"line": "b"}, patience=None)
    assert other["resumed_after_epoch"] is None and other["val_accuracy"] == whole["val_accuracy"]


def test_the_schedule_says_how_far_an_early_stop_left_it_from_annealing(tmp_path, monkeypatch):
    """The cosine spans --finetune-epochs whatever patience does: a run of every epoch ends near 0, one stopped early
    ends higher, and the JSON says which."""
    whole = points_run(tmp_path / "whole", monkeypatch, patience=None)["schedule"]
    assert whole["steps_run"] == whole["over_steps"] == 12 * 4 and whole["last_lr_over_peak"] < 0.01
    stopped = points_run(tmp_path / "stopped", monkeypatch, patience=1)
    assert stopped["stopped_early"] and stopped["schedule"]["steps_run"] < 48
    assert stopped["schedule"]["last_lr_over_peak"] > 0.01
