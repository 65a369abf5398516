"""evaluation.finetune_protocol: the epoch chosen on validation, and the early stop after --finetune-patience epochs."""

import argparse

import pytest
import torch

from evaluation.finetune_protocol import FineTuned, finetune


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
