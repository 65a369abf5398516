"""What LookWhere's extractor reads on cells chosen by its selector or by another rule, the features the benchmarks
probe: the selector's global tokens and maps (`selector_maps_of`), [CLS ; mean kept patch] and the kept tokens
(`lookwhere_features`, `extracted_features`), the model's own per-image budget (`k_mass_features`), and the pooled
output and filled patch tokens of a LookWhere whose kept cells come from other scores (`chosen_features`)."""

import torch

from corevision_hf import LookWhereModel
from evaluation.canvases import Split
from evaluation.sparse_digits import CELL


@torch.inference_mode()
def selector_maps_of(model, split: Split, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The selector's global tokens (N, 1 + R, D) and maps (N, G * G) of every canvas."""
    grid = (split.images.shape[1] // CELL,) * 2
    tokens, maps = zip(*(model.selector(pixels, grid, None) for _, pixels in split.batches(batch_size)))
    return torch.cat(tokens), torch.cat(maps).float()


def extracted(model, pixels: torch.Tensor, chosen: torch.Tensor, global_tokens: torch.Tensor) -> torch.Tensor:
    """LookWhere's extractor output (B, 1 + R + k, D) on the `chosen` (B, k) cells, after the selector's global tokens
    (B, 1 + R, D) where the extractor reads them (`extractor_prefix="selector"`), else after its own."""
    prefix_tokens = global_tokens if model.config.extractor_prefix == "selector" else None
    return model.extractor(pixels, chosen, prefix_tokens).last_hidden_state


def extracted_features(model, pixels: torch.Tensor, chosen: torch.Tensor, global_tokens: torch.Tensor
                       ) -> torch.Tensor:
    """(B, 2D) [CLS ; mean kept patch] of LookWhere's extractor on the `chosen` (B, k) cells."""
    return pooled(model, extracted(model, pixels, chosen, global_tokens))


def pooled(model, hidden: torch.Tensor) -> torch.Tensor:
    """(B, 2D) [CLS ; mean patch] of LookWhere's extractor output (B, 1 + R + k, D)."""
    return torch.cat([hidden[:, 0], hidden[:, 1 + model.config.num_register_tokens:].mean(1)], dim=-1).float()


@torch.inference_mode()
def lookwhere_features(model, split: Split, chosen: torch.Tensor, global_tokens: torch.Tensor, batch_size: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 2D) [CLS ; mean kept patch] and (N, 1 + k, D) float16 [CLS ; kept patches] of LookWhere's extractor on
    the `chosen` (N, k) cells of every canvas."""
    features, tokens = [], []
    for rows, pixels in split.batches(batch_size):
        hidden = extracted(model, pixels, chosen[rows], global_tokens[rows])
        features.append(pooled(model, hidden))
        tokens.append(torch.cat([hidden[:, :1], hidden[:, 1 + model.config.num_register_tokens:]], dim=1).half())
    return torch.cat(features), torch.cat(tokens)


@torch.inference_mode()
def k_mass_features(model, split: Split, k_mass: float, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 2D) features of LookWhere's own per-canvas budget `k_mass` (the mean of each canvas's kept tokens), and
    (N,) the patches each kept."""
    features, kept = [], []
    for _, pixels in split.batches(batch_size):
        output = model(pixels, k_mass=k_mass, fill_dense=False)
        tokens = output.last_hidden_state[:, 1 + model.config.num_register_tokens:]
        used = (output.selected_indices >= 0).unsqueeze(-1)
        mean = (tokens * used).sum(1) / used.sum(1)
        features.append(torch.cat([output.pooler_output, mean], dim=-1).float())
        kept.append(output.num_kept)
    return torch.cat(features), torch.cat(kept)


def chosen_features(model: LookWhereModel, pixels: torch.Tensor, k: int, scores_of, batch_size: int = 8) -> tuple:
    """Pooled output and filled patch tokens of a LookWhere whose extractor keeps the top-k cells of
    `scores_of(selector_map, photo indices)` instead of its selector's: the selector's global tokens, the extractor
    and the fill are the model's own (`LookWhereModel.selector`, `.extractor`, `.dense_fill`)."""
    grid = (pixels.shape[-2] // 14, pixels.shape[-1] // 14)
    num_prefix = 1 + model.config.num_register_tokens
    outputs, patches = [], []
    for first in range(0, len(pixels), batch_size):
        pixel_values = pixels[first : first + batch_size]
        global_tokens, selector_map = model.selector(pixel_values, grid, None)
        scores = scores_of(selector_map, torch.arange(first, first + len(pixel_values)))
        chosen = scores.topk(k, dim=-1).indices.sort(dim=-1).values
        tokens = extracted(model, pixel_values, chosen, global_tokens)
        filled = model.dense_fill(chosen, scores, grid)(tokens)
        outputs.append(filled[:, 0].float())
        patches.append(filled[:, num_prefix:].float())
    return torch.cat(outputs), torch.cat(patches)
