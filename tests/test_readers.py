"""evaluation.readers: each probe's weight decay chosen on the validation examples alone, and the attentive probe
finding the token that carries the label where a linear probe on the mean token does not."""

import pytest
import torch

from evaluation.attentive_probe import AttentivePooling, fit_attentive_classifier, predict_tokens
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


def sets_and_labels(count: int = 8):
    generator = torch.Generator().manual_seed(0)
    return torch.randn(count, 5, 4, generator=generator), torch.arange(count) % 2


@pytest.mark.parametrize("change, words", [
    ({"tokens": "nan"}, "tokens hold NaN or infinite values in 1 of 8 sets (the first: set 3)"),
    ({"tokens": "inf"}, "tokens hold NaN or infinite values in 1 of 8 sets (the first: set 3)"),
    ({"tokens": "none"}, "tokens must be (N, T, D) token sets with N, T and D at least 1, got shape (0, 5, 4)"),
    ({"tokens": "no token"}, "got shape (8, 0, 4)"),
    ({"labels": "float"}, "labels must be (N,) whole numbers"),
    ({"labels": "out of range"}, "labels must lie in 0..num_classes - 1 = 1, got 0 to 2"),
    ({"steps": 0}, "steps must be a whole number, 1 or more, got 0"),
    ({"steps": -5}, "steps must be a whole number, 1 or more, got -5"),
    ({"heads": 0}, "heads must be a whole number, 1 or more, got 0"),
    ({"batch_size": 0}, "batch_size must be a whole number, 1 or more, got 0"),
    ({"lr": float("nan")}, "lr must be a finite number above 0"),
    ({"weight_decay": -1.0}, "weight_decay must be a finite number, 0 or more"),
])
def test_the_attentive_probe_refuses_what_it_cannot_fit_on(change, words):
    """Each of these ran before: one NaN token gave a NaN probe answering class 0 for every set, steps 0 an untrained
    probe, heads or batch_size 0 and no token sets a probe of nothing."""
    tokens, labels = sets_and_labels()
    settings = {name: value for name, value in change.items() if name not in ("tokens", "labels")}
    if change.get("tokens") in ("nan", "inf"):
        tokens[3, 2, 1] = float(change["tokens"])
    elif change.get("tokens") == "none":
        tokens, labels = tokens[:0], labels[:0]
    elif change.get("tokens") == "no token":
        tokens = tokens[:, :0]
    if change.get("labels") == "float":
        labels = labels.float()
    elif change.get("labels") == "out of range":
        labels = labels.clone()
        labels[0] = 2
    with pytest.raises(ValueError) as error:
        fit_attentive_classifier(tokens, labels, 2, steps=settings.pop("steps", 2), **settings)
    assert words in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_a_set_whose_mask_keeps_no_token_is_refused_and_a_nan_token_is_not_answered_class_0():
    tokens, labels = sets_and_labels()
    probe = fit_attentive_classifier(tokens, labels, 2, steps=3)
    mask = torch.ones(8, 5, dtype=torch.bool)
    mask[2] = False
    with pytest.raises(ValueError, match="mask keeps no token of set 2: an attentive probe pools at least one token"):
        probe(tokens, mask)
    mask[2, 4] = True
    assert torch.isfinite(probe(tokens, mask)).all()  # a set of one token is read
    tokens[5, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="the first: set 5"):
        predict_tokens(probe, tokens)
