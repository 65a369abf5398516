"""Agreement with the teacher on a folder of photos, the quality benchmark's measurement (benchmarks.distill_quality):
`PhotoSet` holds the photos as the model cards load them, the teacher's targets and attention map at each resolution
and, at the teacher-free size, augmented views and correspondence pairs; it scores a model per photo on every measure
of METRICS (corevision_hf.agreement), on the cells each of SELECTIONS keeps (LookWhere), and teacher-free
(evaluation.teacher_free). The reference lines: the teacher run at a smaller size (`teacher_at`) and the constant
predictor (`constant_agreement`)."""

import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from corevision_hf import LookWhereModel
from corevision_hf.agreement import features, per_image_agreement, teacher_targets
from corevision_hf.images import open_image
from corevision_hf.lookwhere.budget_lookwhere import kept_for_ratio
from evaluation import teacher_free
from evaluation.lookwhere_features import chosen_features
from evaluation.probes import image_files, load_image
from evaluation.quality_students import gflops
from evaluation.selections import centre_scores
from training.teacher import teacher_targets_and_map

# Per photo: raw CLS and patch cosine, the centred cosines and patch R^2 (corevision_hf.agreement; the centre is the
# teacher's mean token over every training crop, so the constant predictor scores 0 on the last three).
METRICS = ("cls", "patch", "cls_centred", "patch_centred", "patch_r2")
RAW = ("cls", "patch")
MEASURE_KEYS = {"cls": "cls_cosine", "patch": "patch_cosine", "cls_centred": "cls_centred_cosine",
                "patch_centred": "patch_centred_cosine", "patch_r2": "patch_r2"}
# The selector's worth: LookWhere's extractor run on the patches each of these chooses, at the same k.
SELECTIONS = ("selector", "random", "centre", "oracle")
SELECTION_K_RATIO = 0.1
TEACHER_FREE_METRICS = ("top1", "map", "correspondence")


class PhotoSet:
    """The evaluation images of a folder of photos: per resolution the photos as the model cards load them, the
    teacher's targets and attention map (the oracle selection); at the teacher-free size, the augmented views and the
    correspondence pairs. `centre`: the teacher's mean (CLS, patch) tokens over the training crops, which the centred
    measures subtract from both sides."""

    def __init__(self, folder: Path, teacher, resolutions: list[int], teacher_free_size: int | None, args,
                 centre: tuple | None = None):
        self.paths = image_files(str(folder))
        self.centre, self.random_draws = centre, args.random_draws
        self.pixels = {r: torch.stack([load_image(p, r) for p in self.paths]) for r in resolutions}
        self.targets, self.teacher_maps = {}, {}
        with torch.inference_mode():
            for r in resolutions:
                grid = (r // 14, r // 14)
                cls, patches, self.teacher_maps[r] = teacher_targets_and_map(teacher, self.pixels[r], grid,
                                                                             args.map_queries)
                self.targets[r] = (cls, patches)
        self.teacher_free_size = teacher_free_size
        if teacher_free_size:
            images = [open_image(p) for p in self.paths]
            self.views = torch.cat([teacher_free.augmented_views(im, args.views, teacher_free_size, 1000 + i)
                                    for i, im in enumerate(images)])
            self.view_photo = torch.arange(len(images)).repeat_interleave(args.views)
            pairs = [teacher_free.correspondence_pair(im, teacher_free_size, 14, 2000 + args.pairs * i + j)
                     for i, im in enumerate(images) for j in range(args.pairs)]
            self.view_a, self.view_b, self.true = (torch.stack(parts) for parts in zip(*pairs))
            self.pair_photo = torch.arange(len(images)).repeat_interleave(args.pairs)

    def agreement(self, model, budget: dict, resolution: int) -> dict[str, list[float]]:
        """{metric: [per photo]} of `model` at `budget` against the teacher, for every metric of METRICS."""
        pooled, patches = features(model, self.pixels[resolution], budget, 8, "cpu", torch.float32)
        return self.scores(pooled, patches, resolution)

    def scores(self, pooled: torch.Tensor, patches: torch.Tensor, resolution: int) -> dict[str, list[float]]:
        values = per_image_agreement(pooled, patches, self.targets[resolution], self.centre)
        return {metric: values[key].tolist() for metric, key in MEASURE_KEYS.items() if key in values}  # raw: no centre

    @torch.inference_mode()
    def selections(self, model, resolution: int, k_ratio: float) -> dict[str, dict[str, list[float]]]:
        """LookWhere's extractor on the patches each choice of SELECTIONS keeps, k = `k_ratio` of the grid, the grid
        filled from them as the model fills it: {choice: {metric: [per photo]}}. "selector": the model's own top-k
        (its forward, to rounding); "random": uniform random patches, the mean of --random-draws draws; "centre": the
        k cells nearest the grid's centre; "oracle": the teacher's own attention map (the map target)."""
        grid = (resolution // 14, resolution // 14)
        k = kept_for_ratio(k_ratio, grid[0] * grid[1])
        centre = centre_scores(grid)
        out = {}
        for choice in SELECTIONS:
            draws = self.random_draws if choice == "random" else 1
            per_draw = []
            for draw_index in range(draws):
                def scores_of(selector_map, photos):
                    if choice == "selector":
                        return selector_map
                    if choice == "oracle":
                        return self.teacher_maps[resolution][photos].to(selector_map)
                    if choice == "centre":
                        return centre.to(selector_map).expand(len(photos), -1)
                    generator = torch.Generator().manual_seed(10_000 * draw_index + resolution)
                    return torch.rand(len(self.paths), grid[0] * grid[1], generator=generator)[photos].to(selector_map)
                pooled, patches = chosen_features(model, self.pixels[resolution], k, scores_of)
                per_draw.append(self.scores(pooled, patches, resolution))
            out[choice] = {m: [statistics.fmean(d[m][p] for d in per_draw) for p in range(len(self.paths))]
                           for m in per_draw[0]}
        return out

    def teacher_free(self, model=None, budget: dict | None = None) -> dict[str, list[float]]:
        """{"top1", "map", "correspondence": [per photo]} of `model` at `budget`; raw pixels when `model` is None."""
        if model is None:
            pooled = teacher_free.pixel_features(self.views)
            patches_a, patches_b = (teacher_free.pixel_patches(v, 14) for v in (self.view_a, self.view_b))
        else:
            pooled = features(model, self.views, budget, 16, "cpu", torch.float32)[0]
            patches_a, patches_b = (features(model, v, budget, 16, "cpu", torch.float32)[1]
                                    for v in (self.view_a, self.view_b))
        found = teacher_free.retrieval(pooled, self.view_photo)
        correct = teacher_free.correspondence_accuracy(patches_a, patches_b, self.true)
        per_photo = lambda values, photo: [values[photo == p].mean().item() for p in range(len(self.paths))]  # noqa: E731
        return {"top1": per_photo(found["top1"], self.view_photo), "map": per_photo(found["ap"], self.view_photo),
                "correspondence": per_photo(correct, self.pair_photo)}

    def measure(self, model, budgets: list[tuple[str, dict]]) -> dict:
        """{budget label: {"gflops": {res: GFLOPs}, "agreement": {res: {metric: [per photo]}}, "teacher_free": ...}},
        and for a LookWhere "selection": {res: `selections` at SELECTION_K_RATIO}. The model is measured in eval mode
        and put back in its mode (an untrained student is trained next)."""
        was_training = model.training
        model.eval()
        out = {}
        for label, budget in budgets:
            out[label] = {"gflops": {r: gflops(model, r, budget) for r in self.pixels},
                          "agreement": {r: self.agreement(model, budget, r) for r in self.pixels}}
            if self.teacher_free_size:
                out[label]["teacher_free"] = self.teacher_free(model, budget)
        if isinstance(model, LookWhereModel):
            out["selection"] = {r: self.selections(model, r, SELECTION_K_RATIO) for r in self.pixels}
        model.train(was_training)
        return out


@torch.inference_mode()
def teacher_at(teacher, photos: PhotoSet, size: int, resolution: int) -> dict[str, list[float]]:
    """The teacher run at `size` px against its own output at `resolution`: {"cls", "patch": [per photo]}, its patch
    grid resized (bilinear) to the full one."""
    pixels = torch.stack([load_image(p, size) for p in photos.paths])
    cls, patches = teacher_targets(teacher, pixels, (size // 14, size // 14))
    grid, full = size // 14, resolution // 14
    maps = patches.transpose(1, 2).reshape(len(pixels), -1, grid, grid)
    patches = F.interpolate(maps, size=(full, full), mode="bilinear", align_corners=False).flatten(2).transpose(1, 2)
    return photos.scores(cls, patches, resolution)


def constant_agreement(constant: tuple, photos: PhotoSet, resolution: int) -> dict[str, list[float]]:
    """The constant predictor (mean CLS, mean patch token) against the teacher: {metric: [per photo]} (0 on the
    centred measures when `constant` is the centre)."""
    cls, patch = constant
    count, grid = len(photos.paths), (resolution // 14) ** 2
    return photos.scores(cls.expand(count, -1), patch.expand(count, grid, -1), resolution)
