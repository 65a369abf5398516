"""The task benchmarks' teacher passes, cached on disk: a dense teacher run once per canvas and kept, so that larger
runs, reruns and the pilot cost the teacher once.

A pass is keyed by the teacher's weights (a SHA-256 of its config and every parameter), the canvases' arguments
(variant, split, count, seed, background, digit size, strokes, canvas size) and the resolution the teacher ran at.
Each pass is one safetensors file under the cache folder, written through corevision_hf.atomic (a name made for it,
renamed when complete); a file that cannot be read is computed again (and replaced), never trusted. `pass_record`
gives a pass as the task's lines read it: the features of the linear probe, the tokens of the attentive one, the maps.
"""

import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from corevision_hf.atomic import atomic_path
from evaluation.sparse_digits import CELL
from training.teacher import MAP_QUERIES, teacher_targets_and_maps


def teacher_fingerprint(teacher) -> str:
    """SHA-256 of the teacher's config and parameters, in order: two teachers share a cache entry only when they
    compute the same thing."""
    digest = hashlib.sha256(teacher.config.to_json_string(use_diff=False).encode())
    for name, tensor in teacher.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def resized(pixels: torch.Tensor, size: int) -> torch.Tensor:
    """Pixels downsized to `size` px (bicubic, antialiased), as a dense ViT at a lower resolution sees the canvas."""
    return F.interpolate(pixels, size=(size, size), mode="bicubic", align_corners=False, antialias=True)


@torch.inference_mode()
def compute_pass(teacher, split, size: int, batch_size: int) -> dict:
    """The teacher on every canvas of `split` at `size` px: "cls" (N, D) float32, "patches" (N, P, D) float16, and at
    the canvas size each "map_<query>" (N, G * G) of training.teacher's where targets, from the same forward."""
    canvas = split.images.shape[1]
    out = {"cls": [], "patches": [], **{f"map_{q}": [] for q in MAP_QUERIES if size == canvas}}
    for _, pixels in split.batches(batch_size):
        if size == canvas:
            grid = (canvas // CELL, canvas // CELL)
            cls, patches, maps = teacher_targets_and_maps(teacher, pixels, grid, MAP_QUERIES)
            for query in MAP_QUERIES:
                out[f"map_{query}"].append(maps[query].float())
        else:
            hidden = teacher(resized(pixels, size)).last_hidden_state
            cls, patches = hidden[:, 0], hidden[:, 1 + getattr(teacher.config, "num_register_tokens", 0):]
        out["cls"].append(cls.float())
        out["patches"].append(patches.half())
    return {name: torch.cat(parts).contiguous() for name, parts in out.items()}


def pass_record(tensors: dict, keep_patches: bool = True) -> dict:
    """A teacher pass (compute_pass's tensors) as the lines read it: "features" (N, 2D) [CLS ; mean patch], "maps" by
    query, and "cls", "patches" when `keep_patches`."""
    record = {"features": torch.cat([tensors["cls"], tensors["patches"].float().mean(1)], dim=-1),
              "maps": {query: tensors[f"map_{query}"] for query in MAP_QUERIES if f"map_{query}" in tensors}}
    if keep_patches:
        record.update(cls=tensors["cls"], patches=tensors["patches"])
    return record


def tokens_of(record: dict) -> torch.Tensor:
    """(N, 1 + P, D) float16 [CLS ; patches] of a teacher pass: what the attentive probe reads."""
    return torch.cat([record["cls"].half().unsqueeze(1), record["patches"]], dim=1)


class TeacherPasses:
    """Cached teacher passes in `folder` for one teacher (`fingerprint`): `get(split, key, size)`."""

    def __init__(self, folder: Path, teacher, batch_size: int):
        self.folder, self.teacher, self.batch_size = Path(folder), teacher, batch_size
        self.fingerprint = teacher_fingerprint(teacher)

    def path(self, key: dict, size: int) -> Path:
        entry = json.dumps({"teacher": self.fingerprint, **key, "size": size}, sort_keys=True)
        return self.folder / f"{hashlib.sha256(entry.encode()).hexdigest()[:32]}.safetensors"

    def get(self, split, key: dict, size: int) -> dict:
        """The teacher's pass over `split` (whose canvases `key` names) at `size` px: read from the cache when it is
        there and readable, else computed and stored."""
        path = self.path(key, size)
        tensors = self.read(path)
        if tensors is None or len(tensors["cls"]) != len(split):
            tensors = compute_pass(self.teacher, split, size, self.batch_size)
            self.write(path, tensors)
        return tensors

    @staticmethod
    def read(path: Path) -> dict | None:
        if not path.is_file() or path.is_symlink():
            return None
        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError):
            return None  # a partial or foreign file: computed again

    def write(self, path: Path, tensors: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as temporary:
            save_file(tensors, temporary, metadata={"teacher": self.fingerprint})
