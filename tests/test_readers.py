"""evaluation.readers: each probe's weight decay chosen on the validation examples alone, and the attentive probe
finding the token that carries the label where a linear probe on the mean token does not."""

import torch

from evaluation.attentive_probe import AttentivePooling
from evaluation.probes import fit_linear_classifier
from evaluation.readers import attentive_probe, probe


def test_the_probe_chooses_its_decay_on_the_validation_canvases_alone():
    torch.manual_seed(0)
    features = torch.randn(40, 6)
    labels = torch.arange(40) % 10
    test_features = torch.randn(5, 6)
    first = probe(features, labels, test_features, val=10, decays=[1e-4, 1e-1])
    relabelled = labels.clone()
    relabelled[-10:] = (relabelled[-10:] + 1) % 10  # other validation labels can change the choice...
    second = probe(features, relabelled, test_features, val=10, decays=[1e-4, 1e-1])
    assert first["val_accuracy"] != second["val_accuracy"]
    # ...but never the head: it is fitted on the others alone (one scale for all), and it makes the line's predictions
    head = fit_linear_classifier(features[:30], labels[:30], 10, weight_decay=first["weight_decay"],
                                 per_feature=False)
    assert torch.equal(head(test_features), first["head"](test_features))
    assert torch.equal(first["predictions"], head(test_features).argmax(-1))


def test_the_attentive_probe_reads_the_token_that_carries_the_label():
    """Ten classes, each a direction in one token among 12 noise tokens at a random place: the mean token dilutes it
    12 times, attention finds it. Both probes are fitted on 240 sets, scored on 60 others."""
    generator = torch.Generator().manual_seed(0)
    count, tokens, width = 300, 12, 16
    labels = torch.arange(count) % 10
    sets = 0.5 * torch.randn(count, tokens, width, generator=generator)
    where = torch.randint(tokens, (count,), generator=generator)
    sets[torch.arange(count), where, :10] += 3 * torch.eye(10)[labels]
    sets[torch.arange(count), where, 10] += 4  # the marker a query can attend to
    attentive = attentive_probe(sets[:240], labels[:240], sets[240:], val=40, decays=[1e-3], seed=0)
    linear = probe(sets[:240].mean(1), labels[:240], sets[240:].mean(1), val=40, decays=[1e-3])
    attentive_accuracy = (attentive["predictions"] == labels[240:]).float().mean()
    linear_accuracy = (linear["predictions"] == labels[240:]).float().mean()
    assert attentive_accuracy >= 0.9 and attentive_accuracy >= linear_accuracy + 0.2
    again = attentive_probe(sets[:240], labels[:240], sets[240:], val=40, decays=[1e-3], seed=0)
    assert torch.equal(again["predictions"], attentive["predictions"])  # the same bits twice


def test_an_attentive_probe_starts_as_the_mean_token():
    tokens = torch.randn(3, 5, 4)
    probe = AttentivePooling(torch.zeros(4), torch.tensor(1.0), 2, heads=2)
    torch.testing.assert_close(probe.pool(tokens), torch.full((3, 2, 5), 0.2))
    mask = torch.tensor([[True, True, False, False, False]] * 3)
    torch.testing.assert_close(probe.pool(tokens, mask)[..., :2], torch.full((3, 2, 2), 0.5))
