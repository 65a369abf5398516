"""Teacher-target cache: the teacher's outputs for one (crop, image) are computed once and reused.

For runs where the teacher dominates the cost (a large teacher, a small student, many epochs). Crops then repeat
with a period of `cycle` epochs (the data sees epoch `e % cycle`), so each image has `cycle` distinct crops and the
teacher runs `cycle` times per image in the whole run instead of once per epoch. Targets are stored in fp16, one
file per (crop epoch, image) under `folder`, shared by all processes.
"""

import json
import os

import torch
from safetensors.torch import load_file, save_file

from corevision_hf.atomic import atomic_path, write_text_atomically


class TeacherCache:
    def __init__(self, folder: str, cycle: int, fingerprint: dict):
        """`fingerprint`: whatever determines the targets (teacher, crop size, seed, cycle); a folder made for another
        fingerprint is refused rather than served."""
        self.folder, self.cycle = folder, cycle
        os.makedirs(folder, exist_ok=True)
        info_path = os.path.join(folder, "cache_info.json")
        fingerprint = {**fingerprint, "cycle": cycle}
        if os.path.exists(info_path):
            with open(info_path) as f:
                if json.load(f) != fingerprint:
                    raise ValueError(
                        f"{folder} holds teacher targets for other settings; delete it or use another --output-dir."
                    )
        else:
            write_text_atomically(info_path, json.dumps(fingerprint))

    def crop_epoch(self, epoch: int) -> int:
        """The epoch the data pipeline should draw crops for."""
        return epoch % self.cycle

    def _path(self, crop_epoch: int, index: int) -> str:
        return os.path.join(self.folder, f"{crop_epoch}_{index}.safetensors")

    def serve(self, compute, batch: dict) -> tuple:
        """`targets` for a training batch {"pixel_values", "index", "epoch"}."""
        return self.targets(compute, batch["pixel_values"], batch["index"], self.crop_epoch(batch["epoch"]))

    def targets(self, compute, pixel_values: torch.Tensor, indices: torch.Tensor, crop_epoch: int) -> tuple:
        """`compute(pixel_values) -> tuple of (B, ...) tensors`, served from the cache for images seen before.
        Returns the same tuple, in float32, on the device of `pixel_values`."""
        paths = [self._path(crop_epoch, int(i)) for i in indices]
        missing = [row for row, path in enumerate(paths) if not os.path.exists(path)]
        if missing:  # the teacher runs on the images it has not seen in this crop, only
            outputs = compute(pixel_values[missing])
            for position, row in enumerate(missing):
                # written whole, then renamed: another process may read the file while this one writes it
                tensors = {str(j): out[position].half().cpu().contiguous() for j, out in enumerate(outputs)}
                with atomic_path(paths[row]) as temporary:
                    save_file(tensors, temporary)
        stored = [load_file(path) for path in paths]  # the fp16 copies for all: a batch's targets are one precision
        return tuple(torch.stack([s[str(j)] for s in stored]).float().to(pixel_values.device)
                     for j in range(len(stored[0])))


def teacher_cache(args, dataset) -> TeacherCache | None:
    """--teacher-cache CYCLE: the run's cache under OUT/teacher_cache, with `dataset`'s crops repeating every CYCLE
    epochs; None without the flag. Raises ValueError for a stream (whose indices are positions, not images)."""
    if not args.teacher_cache:
        return None
    if args.streaming:
        raise ValueError("--teacher-cache needs a map-style dataset, whose indices name images: leave out --streaming.")
    fingerprint = {name: getattr(args, name) for name in ("teacher", "teacher_dtype", "data", "image_size", "augment",
                                                           "seed")}
    cache = TeacherCache(f"{args.output_dir}/teacher_cache", args.teacher_cache, fingerprint)
    set_epoch = dataset.set_epoch
    dataset.set_epoch = lambda epoch: set_epoch(cache.crop_epoch(epoch))  # crops repeat every CYCLE epochs
    return cache
