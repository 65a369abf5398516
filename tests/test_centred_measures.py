"""Centred cosine and R^2 (corevision_hf.agreement): the mean token scores 0, the teacher 1, and R^2 is the hand sum."""

import torch

from corevision_hf.agreement import agreement, per_image_agreement, r_squared


def _targets(generator, images=5, patches=7, width=6):
    offset = torch.randn(width, generator=generator) * 4  # a large shared mean: raw cosine rewards it
    cls = offset + torch.randn(images, width, generator=generator)
    tokens = offset + torch.randn(images, patches, width, generator=generator)
    return cls, tokens, (cls.mean(0), tokens.mean((0, 1)))


def test_the_centre_scores_zero_and_the_teacher_one():
    generator = torch.Generator().manual_seed(0)
    cls, tokens, centre = _targets(generator)
    constant = per_image_agreement(centre[0].expand_as(cls), centre[1].expand_as(tokens), (cls, tokens), centre)
    assert constant["cls_cosine"].mean() > 0.8  # what the raw measure gives the mean token
    for name in ("cls_centred_cosine", "patch_centred_cosine", "patch_r2"):
        assert torch.equal(constant[name], torch.zeros(len(cls))), name
    assert agreement(centre[0].expand_as(cls), centre[1].expand_as(tokens), (cls, tokens), centre)["cls_r2"] == 0.0
    itself = per_image_agreement(cls, tokens, (cls, tokens), centre)
    for name in ("cls_centred_cosine", "patch_centred_cosine", "patch_r2"):
        torch.testing.assert_close(itself[name], torch.ones(len(cls)), rtol=0, atol=1e-6)


def test_r2_and_centred_cosine_by_hand():
    generator = torch.Generator().manual_seed(1)
    cls, tokens, centre = _targets(generator, images=3, patches=4, width=5)
    student_cls, student = cls + torch.randn(cls.shape, generator=generator), tokens * 0.5
    values = per_image_agreement(student_cls, student, (cls, tokens), centre)
    for i in range(3):
        sse = sum(float((student[i, p, d] - tokens[i, p, d]) ** 2) for p in range(4) for d in range(5))
        sst = sum(float((tokens[i, p, d] - centre[1][d]) ** 2) for p in range(4) for d in range(5))
        assert abs(values["patch_r2"][i].item() - (1 - sse / sst)) < 1e-5
        a, b = student[i, 0] - centre[1], tokens[i, 0] - centre[1]
        first = float(a @ b / (a.norm() * b.norm()))
        rest = torch.nn.functional.cosine_similarity(student[i, 1:] - centre[1], tokens[i, 1:] - centre[1], dim=-1)
        assert abs(values["patch_centred_cosine"][i].item() - (first + rest.sum().item()) / 4) < 1e-6
    pooled = agreement(student_cls, student, (cls, tokens), centre)["cls_r2"]
    hand = 1 - ((student_cls - cls) ** 2).sum() / ((cls - centre[0]) ** 2).sum()
    assert abs(pooled - hand.item()) < 1e-6
    assert r_squared(torch.tensor(1.0), torch.tensor(0.0)).item() == 0.0
