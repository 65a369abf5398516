"""LookWhere: learn where to look and what to see (arXiv 2505.18051).

A shallow *selector* looks at a low-resolution copy of the image and scores every high-resolution patch; an
*extractor* embeds and processes only the top-k patches, reusing the selector's CLS and register tokens. The
full-resolution image is never processed: the extractor's cost follows k, not the image size.

Hub-copied: this file imports only torch, transformers and its sibling files (configuration, budget). A hub repo holds
one model's files, so the few helpers both models need are repeated here, each marked "# Copied from" its VECA
source as transformers marks its copies; tools/check_copies.py keeps them equal (`--fix` rewrites them).
"""

import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import Chunk, WeightConverter, WeightRenaming
from transformers.backbone_utils import BackboneMixin, filter_output_hidden_states
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BackboneOutput,
    BaseModelOutput,
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    SemanticSegmenterOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import logging
from transformers.utils.generic import TransformersKwargs, can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .budget_lookwhere import check_inputs, patch_selection
from .configuration_lookwhere import LookWhereConfig


logger = logging.get_logger(__name__)


@dataclass
class LookWhereModelOutput(BaseModelOutputWithPooling):
    r"""
    last_hidden_state (`torch.FloatTensor`):
        With the dense fill (default), `(batch_size, 1 + num_registers + Hp * Wp, hidden_size)` laid out like a
        `Dinov2WithRegistersModel` output at the same resolution: [CLS ; registers ; all patch tokens], the cells that
        were not kept filled by inverse-distance weighting of their nearest kept cells. Without it,
        `(batch_size, 1 + num_registers + k, hidden_size)`: [CLS ; registers ; the kept tokens in `selected_indices`
        order].
    pooler_output (`torch.FloatTensor` of shape `(batch_size, hidden_size)`):
        The extractor's CLS token after the final norm.
    selected_indices (`torch.LongTensor` of shape `(batch_size, k)`):
        Row-major indices of the kept high-resolution patches, ascending, then -1 in the slots an image does not use
        (a padded batch of mixed sizes, or `k_mass`, where k is the batch's largest count).
    selector_map (`torch.FloatTensor` of shape `(batch_size, Hp * Wp)`):
        The selector's logits for every high-resolution patch.
    patch_tokens (`torch.FloatTensor` of shape `(batch_size, Hp * Wp, hidden_size)`):
        With the dense fill, the patch tokens of `last_hidden_state` alone, row-major on the patch grid (a view, not
        a copy): DINOv2's `last_hidden_state[:, 1:]` here is `last_hidden_state[:, 1 + num_registers:]`. None
        without the fill.
    num_kept (`torch.LongTensor` of shape `(batch_size,)`):
        The patches each image kept: its entries of `selected_indices` that are not -1.
    """

    selected_indices: torch.LongTensor | None = None
    selector_map: torch.FloatTensor | None = None
    patch_tokens: torch.FloatTensor | None = None
    num_kept: torch.LongTensor | None = None


class LookWherePatchEmbeddings(nn.Module):
    """Non-overlapping patches -> tokens, for the whole image or for chosen patches only."""

    def __init__(self, config: LookWhereConfig):
        super().__init__()
        self.patch_size = config.patch_size
        self.projection = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, Hp * Wp, D)."""
        return self.projection(pixel_values).flatten(2).transpose(1, 2)

    def embed_selected(self, pixel_values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W), (B, k) row-major patch indices -> (B, k, D), touching only the k chosen patches."""
        batch_size, channels, height, width = pixel_values.shape
        p = self.patch_size
        grid_width = width // p
        patches = pixel_values.view(batch_size, channels, height // p, p, grid_width, p).permute(0, 2, 4, 1, 3, 5)
        batch_index = torch.arange(batch_size, device=indices.device)[:, None]
        selected = patches[batch_index, indices // grid_width, indices % grid_width]  # (B, k, C, p, p)
        weight = self.projection.weight
        return F.linear(selected.flatten(2).to(weight.dtype), weight.flatten(1), self.projection.bias)


# Copied from corevision_hf.veca.modeling_veca.resize_position_table
def resize_position_table(table: torch.Tensor, grid: tuple[int, int], antialias: bool) -> torch.Tensor:
    """(1, G * G, D) learned positions -> (1, Hp * Wp, D) by DINOv2's bicubic resize (align_corners=False, in
    float32), unchanged if the grid is G x G."""
    side = int(table.shape[1] ** 0.5)
    if (side, side) == tuple(grid):
        return table
    square = table.float().reshape(1, side, side, -1).permute(0, 3, 1, 2).contiguous()  # (1, D, G, G)
    resized = F.interpolate(square, size=grid, mode="bicubic", align_corners=False, antialias=antialias)
    return resized.flatten(2).transpose(1, 2).to(table.dtype)


# Copied from corevision_hf.veca.modeling_veca.cubic_filter
def cubic_filter(x: torch.Tensor, a: float) -> torch.Tensor:
    """Keys' cubic convolution kernel with parameter `a` (torch: -0.75, and -0.5 when antialiasing), zero beyond 2."""
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


# Copied from corevision_hf.veca.modeling_veca.interpolation_weights
def interpolation_weights(
    source: torch.Tensor, target: torch.Tensor, source_extent: int, target_extent: int, mode: str, antialias: bool
) -> torch.Tensor:
    """The weights of `F.interpolate(mode="bilinear" | "bicubic", align_corners=False, antialias=...)` along one axis,
    per image: from each image's `source` cells to its `target` cells ((B,) tensors), as (B, target_extent,
    source_extent) matrices, zero beyond them. Computed on the device from the sizes, in torch's float32 arithmetic
    (its source index is one fused multiply-add), so they equal torch's to about 1e-6 (bilinear: exactly)."""
    source, target = source.float()[:, None, None], target.float()[:, None, None]
    scale = source / target
    out = torch.arange(target_extent, dtype=torch.float32, device=source.device)[None, :, None]
    cells = torch.arange(source_extent, dtype=torch.float32, device=source.device)[None, None, :]
    if antialias:  # PIL's filters, widened by the scale when shrinking, normalised over the image's own cells
        invscale = torch.where(scale >= 1, 1.0 / scale, torch.ones_like(scale))
        x = (cells - scale * (out + 0.5) + 0.5) * invscale
        weights = cubic_filter(x, -0.5) if mode == "bicubic" else (1 - x.abs()).clamp(min=0)
        weights = weights * (cells < source)
        total = weights.sum(dim=-1, keepdim=True)
        weights = weights / torch.where(total > 0, total, torch.ones_like(total))
    elif mode == "bilinear":
        position = torch.addcmul(torch.full_like(scale, -0.5), scale, out + 0.5).clamp(min=0)
        low = torch.minimum(position.floor(), source - 1)
        fraction = (position - low).clamp(0, 1)
        weights = (cells == low) * (1 - fraction) + (cells == torch.minimum(low + 1, source - 1)) * fraction
    else:  # the four nearest cells, the image's border cells repeated
        position = torch.addcmul(torch.full_like(scale, -0.5), scale, out + 0.5)
        low = position.floor()
        t = position - low
        taps = zip((-1, 0, 1, 2), (t + 1, t, 1 - t, 2 - t))
        weights = sum((cells == (low + tap).clamp(min=0).minimum(source - 1)) * cubic_filter(x, -0.75)
                      for tap, x in taps)
    return weights * (out < target)


# Copied from corevision_hf.veca.modeling_veca.resize_in_images
def resize_in_images(
    images: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor, size: tuple[int, int], mode: str,
    antialias: bool,
) -> torch.Tensor:
    """`F.interpolate` of each image of a padded batch on its own: (B or 1, C, H, W) images whose top-left `sources`
    (B, 2) cells are their content -> (B, C, *size), each image's content resized to its `targets` (B, 2) at the top
    left, zero elsewhere, in float32. Two matrix products with per-image weights: no host-side loop over the images."""
    rows = interpolation_weights(sources[:, 0], targets[:, 0], images.shape[-2], size[0], mode, antialias)
    columns = interpolation_weights(sources[:, 1], targets[:, 1], images.shape[-1], size[1], mode, antialias)
    return rows[:, None] @ images.float() @ columns[:, None].transpose(-1, -2)


# Copied from corevision_hf.veca.modeling_veca.eager_attention_forward
def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


class LookWhereAttention(nn.Module):
    """Multi-head self-attention, DINOv2's, with DINOv3's separate q / k / v / o projections."""

    def __init__(self, config: LookWhereConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.is_causal = False
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`attention_mask` (B, 1, 1, L), additive: the keys of an image's unused slots in a padded batch."""
        batch_size, seq_len, _ = hidden_states.shape
        shape = (batch_size, seq_len, self.num_heads, self.head_dim)
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2)  # (B, H, L, head_dim)
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query,
            key,
            value,
            None if attention_mask is None else attention_mask.to(query.dtype),
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        return self.o_proj(attn_output.reshape(batch_size, seq_len, -1).contiguous()), attn_weights


class LookWhereLayerScale(nn.Module):
    def __init__(self, config: LookWhereConfig):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.full((config.hidden_size,), float(config.layerscale_value)))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states * self.lambda1


# Copied from corevision_hf.veca.modeling_veca.VecaMLP with Veca->LookWhere
class LookWhereMLP(nn.Module):
    def __init__(self, config: LookWhereConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACT2FN[config.hidden_act]
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(hidden_states)))


# The packed SwiGLU of timm's `SwiGLUPacked`, Franca's MLP.
# Copied from corevision_hf.veca.modeling_veca.VecaSwiGLU with Veca->LookWhere
class LookWhereSwiGLU(nn.Module):
    """fc1: D -> 2h, silu(u) * v, fc2: h -> D."""

    def __init__(self, config: LookWhereConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, 2 * config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        u, v = self.fc1(hidden_states).chunk(2, dim=-1)
        return self.fc2(F.silu(u) * v)


# Copied from corevision_hf.veca.modeling_veca.VecaDropPath with Veca->LookWhere
class LookWhereDropPath(nn.Module):
    """Stochastic depth per sample; identity at eval or when the rate is 0."""

    def __init__(self, drop_prob: float):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return hidden_states
        keep_prob = 1 - self.drop_prob
        mask = hidden_states.new_empty((hidden_states.shape[0],) + (1,) * (hidden_states.ndim - 1)).bernoulli_(keep_prob)
        return hidden_states * mask / keep_prob


class LookWhereLayer(GradientCheckpointingLayer):
    """A DINOv2 block: pre-norm attention and MLP, each with LayerScale."""

    def __init__(self, config: LookWhereConfig, drop_path_rate: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = LookWhereAttention(config)
        self.layer_scale1 = LookWhereLayerScale(config)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = LookWhereSwiGLU(config) if config.use_swiglu_ffn else LookWhereMLP(config)
        self.layer_scale2 = LookWhereLayerScale(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.drop_path = LookWhereDropPath(drop_path_rate)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attn_output, _ = self.attention(self.norm1(hidden_states), attention_mask=attention_mask, **kwargs)
        hidden_states = hidden_states + self.drop_path(self.layer_scale1(self.dropout(attn_output)))
        mlp_output = self.mlp(self.norm2(hidden_states))
        return hidden_states + self.drop_path(self.layer_scale2(self.dropout(mlp_output)))


def make_layers(config: LookWhereConfig, depth: int) -> nn.ModuleList:
    return nn.ModuleList(LookWhereLayer(config, config.drop_path_rate * i / max(1, depth - 1)) for i in range(depth))


class LookWhereSelectorEmbeddings(nn.Module):
    """The selector's input tokens, as DINOv3's `DINOv3ViTEmbeddings`: a low-resolution copy of the image, its patch
    tokens with their positions, after the CLS and register tokens."""

    def __init__(self, config: LookWhereConfig):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.patch_embeddings = LookWherePatchEmbeddings(config)
        self.cls_token = nn.Parameter(torch.empty(1, 1, d))  # its position embedding is folded in
        self.register_tokens = nn.Parameter(torch.empty(1, config.num_register_tokens, d))
        self.position_embeddings = nn.Parameter(torch.empty(1, config.selector_grid_size**2, d))

    def forward(self, pixel_values: torch.Tensor, image_grids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, H, W) high-res images -> (B, 1 + R + g * g, D) tokens [CLS ; registers ; low-res patches]. With
        `image_grids` (B, 2), each image's patch grid in a padded batch, each image's own content is resized."""
        size = self.config.selector_image_size
        # In float32: CPU kernels for antialiased resizing take no bf16 / fp16. F.interpolate where one size serves the
        # batch (fewer operations, and ONNX export maps it to Resize); per-image weights in a padded batch.
        if image_grids is None:
            low_res = F.interpolate(
                pixel_values.float(), size=(size, size), mode="bilinear", align_corners=False,
                antialias=self.config.selector_antialias,
            )
        else:
            low_res = resize_in_images(pixel_values.float(), image_grids * self.config.patch_size,
                                       torch.full_like(image_grids, size), (size, size), "bilinear",
                                       self.config.selector_antialias)
        low_res = low_res.to(pixel_values.dtype)
        patches = self.patch_embeddings(low_res) + self.position_embeddings
        prefix = torch.cat([self.cls_token, self.register_tokens], dim=1).expand(pixel_values.shape[0], -1, -1)
        return torch.cat([prefix.to(patches.dtype), patches], dim=1)


class LookWhereSelector(nn.Module):
    """The "where": a shallow ViT on a low-resolution copy, with a map head scoring every high-resolution patch.
    Returns its post-norm CLS + register tokens, handed to the extractor, and the selector map."""

    def __init__(self, config: LookWhereConfig):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.embeddings = LookWhereSelectorEmbeddings(config)
        self.layers = make_layers(config, config.selector_depth)
        self.norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        m, r = config.map_upsampling, config.map_head_ratio
        self.map_head = nn.Sequential(nn.Linear(d, r * d), ACT2FN[config.map_head_act], nn.Linear(r * d, m * m))

    def forward(
        self,
        pixel_values: torch.Tensor,
        grid: tuple[int, int],
        image_grids: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C, H, W) high-res images, the high-res patch grid (Hp, Wp) ->
        global tokens (B, 1 + R, D) and selector map logits (B, Hp * Wp). With `image_grids` (B, 2), each image's
        patch grid in a padded batch, each image's own content is resized (the copy, the map), as if it ran alone;
        the map is 0 on padding cells."""
        batch_size = pixel_values.shape[0]
        hidden_states = self.embeddings(pixel_values, image_grids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, **kwargs)
        hidden_states = self.norm(hidden_states)

        num_prefix = 1 + self.config.num_register_tokens
        g, m = self.config.selector_grid_size, self.config.map_upsampling
        cells = self.map_head(hidden_states[:, num_prefix:])  # (B, g * g, m * m): an m x m block per patch
        fine_map = cells.view(batch_size, g, g, m, m).permute(0, 1, 3, 2, 4).reshape(batch_size, 1, g * m, g * m)
        if image_grids is None:
            selector_map = F.interpolate(fine_map.float(), size=grid, mode="bilinear", align_corners=False,
                                         antialias=self.config.selector_map_antialias).to(fine_map.dtype)
        else:
            selector_map = resize_in_images(fine_map, torch.full_like(image_grids, g * m), image_grids, grid,
                                            "bilinear", self.config.selector_map_antialias).to(fine_map.dtype)
        return hidden_states[:, :num_prefix], selector_map.flatten(1)


# Weights are 1 / (d + FILL_EPSILON), as the authors': finite at a kept cell's own distance 0.
FILL_EPSILON = 1e-8


def nearest_kept_cells(
    indices: torch.Tensor, priority: torch.Tensor, grid: tuple[int, int], num_nearest: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For every cell of the grid, its n = min(`num_nearest`, k) nearest kept cells: (B, N, n) positions in `indices`
    (B, k) and their (B, N, n) Euclidean distances in grid units, nearest first. Equidistant kept cells are ordered
    by `priority` (B, k), a permutation of 0..k-1, lower first. A slot that holds no cell (index -1: one an image of
    a padded batch does not use) comes after every kept cell, at an infinite distance.

    Each (cell, kept cell) pair gets the integer key `k * squared distance + priority`, all different, so the result
    never depends on how topk breaks ties. A squared distance is a row term plus a column term, so the (B, N, k)
    int64 keys, the only large tensor, take one broadcast addition."""
    k = indices.shape[1]
    height, width = grid
    unused = indices < 0
    rows = torch.arange(height, device=indices.device)[None, :, None]
    cols = torch.arange(width, device=indices.device)[None, :, None]
    rank = priority + unused * (k * (height**2 + width**2))  # past any squared distance on the grid
    row_keys = k * (rows - (indices // width)[:, None]) ** 2 + rank[:, None]  # (B, Hp, k)
    col_keys = k * (cols - (indices % width)[:, None]) ** 2  # (B, Wp, k)
    keys = (row_keys[:, :, None] + col_keys[:, None]).flatten(1, 2)  # (B, Hp * Wp, k)
    num_nearest = min(num_nearest, k)
    keys, nearest = keys.topk(num_nearest, dim=-1, largest=False)
    distances = torch.div(keys, k, rounding_mode="floor").float().sqrt()
    return nearest, distances.masked_fill(unused.gather(1, nearest.flatten(1)).view_as(nearest), float("inf"))


def inverse_distance_fill(
    kept: torch.Tensor,
    indices: torch.Tensor,
    grid: tuple[int, int],
    num_neighbors: int,
    priority: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scatter kept tokens back to the grid and fill every other cell by inverse-distance weighting
    (1 / (d + 1e-8), normalised) of its `num_neighbors` nearest kept cells, distances in grid units.
    (B, k, D) tokens at (B, k) row-major indices -> (B, Hp * Wp, D); kept cells keep their own value.

    Grid distances tie all the time (a cell's 5th and 6th nearest kept cells are often equidistant), so which
    neighbours count is decided exactly: by distance, then by `priority` (B, k), a permutation of 0..k-1, lower
    first. The model passes the selector's score rank, so an equidistant tie goes to the higher-scored patch: the
    authors' `upsample_grid_nn` with a stable sort. Their own call sorts with an unstable `argsort`, whose choice
    among equidistant cells follows the sort routine; everywhere else the two agree. Default priority: index order."""
    return DenseFill(indices, grid, num_neighbors, priority)(kept)


class DenseFill:
    """The inverse-distance fill of one set of kept cells, built once and applied to any number of token tensors
    (the output and every hidden state): (B, k, D) kept tokens -> (B, Hp * Wp, D). See `inverse_distance_fill`."""

    def __init__(self, indices: torch.Tensor, grid: tuple[int, int], num_neighbors: int, priority: torch.Tensor | None):
        batch_size, k = indices.shape
        if priority is None:
            priority = torch.arange(k, device=indices.device).expand(batch_size, -1)
        nearest, distances = nearest_kept_cells(indices, priority, grid, num_neighbors)  # (B, N, n)
        weights = 1.0 / (distances + FILL_EPSILON)  # 0 for unused slots
        self.weights = (weights / weights.sum(dim=-1, keepdim=True)).flatten(0, 1)  # (B * N, n)
        # Neighbours as rows of the (B * k, D) kept tokens, so one gather serves the whole batch: (B * N, n).
        self.neighbours = (nearest + k * torch.arange(batch_size, device=indices.device)[:, None, None]).flatten(0, 1)
        self.num_cells = grid[0] * grid[1]
        # Where each kept token goes; unused slots go to a spare cell past the grid, dropped afterwards.
        self.destinations = torch.where(indices >= 0, indices, self.num_cells)

    def __call__(self, kept: torch.Tensor) -> torch.Tensor:
        batch_size, k, dim = kept.shape
        tokens = kept.float().reshape(-1, dim)  # weighted sums in float32 whatever the tokens' dtype
        # One weighted gather per neighbour, accumulated in place: no (B, N, n, D) intermediate. F.embedding, whose
        # backward sums in a fixed order on GPU too (index_select's adds atomically there).
        dense = tokens.new_zeros(self.neighbours.shape[0], dim)
        for neighbour, weight in zip(self.neighbours.unbind(1), self.weights.unbind(1)):
            dense.addcmul_(F.embedding(neighbour, tokens), weight[:, None])
        dense = torch.cat([dense.view(batch_size, -1, dim), dense.new_zeros(batch_size, 1, dim)], dim=1).to(kept.dtype)
        return dense.scatter(1, self.destinations[..., None].expand(-1, -1, dim), kept)[:, : self.num_cells]


def fill_hidden_states(fill: Callable, hidden_states: tuple) -> tuple:
    """`fill` applied to each hidden state; the entries a list-valued `output_hidden_states` did not select stay
    None."""
    return tuple(None if state is None else fill(state) for state in hidden_states)


# Copied from corevision_hf.veca.modeling_veca.chosen_blocks
def chosen_blocks(n, depth: int) -> list[int]:
    """DINOv2's block choice: the last n blocks for an int n, else the listed 0-based indices (negative from the end)."""
    if isinstance(n, numbers.Integral) and not isinstance(n, bool):
        if not 1 <= n <= depth:
            raise ValueError(f"n={n} blocks: this model has {depth}, so choose 1..{depth} (or a list of block indices).")
        return list(range(depth - n, depth))
    indices = list(n) if isinstance(n, (list, tuple, range)) else None
    if not indices or any(isinstance(i, bool) or not isinstance(i, numbers.Integral) or not -depth <= i < depth for i in indices):
        raise ValueError(f"n={n!r}: give a number of last blocks, or a list of block indices in 0..{depth - 1}.")
    return [i % depth for i in indices]


# Copied from corevision_hf.veca.modeling_veca.grids_from_mask
def grids_from_mask(pixel_mask: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Each image's patch grid (rows, columns), (B, 2), in a batch padded at the bottom and right as the image
    processor pads it: `pixel_mask` (B, H, W) is nonzero on each image and zero on its padding. An all-0 mask, which
    the processor never makes, reads as its top-left patch (an image of no patch would give NaN)."""
    patch_mask = pixel_mask[:, ::patch_size, ::patch_size] != 0  # (B, Hp, Wp)
    return torch.stack([patch_mask[:, :, 0].sum(dim=1), patch_mask[:, 0].sum(dim=1)], dim=1).clamp(min=1)


# Copied from corevision_hf.veca.modeling_veca.additive_key_mask
def additive_key_mask(keep: torch.Tensor) -> torch.Tensor:
    """(B, L) True for the keys each query may attend to -> (B, 1, 1, L) float32 mask added to the attention scores:
    0, or float32's lowest value, which the softmax turns into a weight of exactly 0."""
    mask = torch.zeros(keep.shape, device=keep.device).masked_fill(~keep, torch.finfo(torch.float32).min)
    return mask[:, None, None]


# State-dict keys written by earlier versions of this model -> today's, applied by transformers when a checkpoint is
# loaded: (old, new) patterns, or (old, [new, ...]) for a fused tensor split in equal row blocks. Add a line per rename.
LEGACY_KEYS = [
    ("attention.qkv", ["attention.q_proj", "attention.k_proj", "attention.v_proj"]),  # fused (q; k; v) rows
    ("attention.proj", "attention.o_proj"),
    ("selector.patch_embeddings.", "selector.embeddings.patch_embeddings."),  # the embeddings own their weights
    ("selector.cls_token", "selector.embeddings.cls_token"),
    ("selector.register_tokens", "selector.embeddings.register_tokens"),
    ("selector.position_embeddings", "selector.embeddings.position_embeddings"),
    ("extractor.patch_embeddings.", "extractor.embeddings.patch_embeddings."),
    ("extractor.position_embeddings", "extractor.embeddings.position_embeddings"),
    ("extractor.prefix_tokens", "extractor.embeddings.prefix_tokens"),
]


# Copied from corevision_hf.veca.modeling_veca.LoadOnly
class LoadOnly:
    """A key conversion that saving does not undo (transformers reverses conversions on save): new checkpoints are
    written with today's names. transformers has no public way for a model to make its conversions load-only
    (`save_pretrained(save_original_format=False)` is each caller's choice), so this overrides
    `WeightTransform.reverse_transform`, which `core_model_loading.revert_weight_conversion` calls on save;
    tests/test_transformers_internals.py fails when either changes."""

    def reverse_transform(self) -> WeightRenaming:
        return WeightRenaming(self.target_patterns[0], self.target_patterns[0])  # renames nothing


# Copied from corevision_hf.veca.modeling_veca.LegacyRenaming
class LegacyRenaming(LoadOnly, WeightRenaming):
    pass


# Copied from corevision_hf.veca.modeling_veca.LegacySplit
class LegacySplit(LoadOnly, WeightConverter):
    pass


# transformers' public registry of checkpoint conversions: a custom-code model gets the conversions registered under
# its model_type by name (and no built-in model's of that name). Overwritten, not added to: the package's module and a
# hub copy of it may both be imported (tests/test_transformers_internals.py checks the registry's behaviour).
register_checkpoint_conversion_mapping(
    "lookwhere",
    [LegacySplit(old, new, operations=[Chunk(dim=0)]) if isinstance(new, list) else LegacyRenaming(old, new)
     for old, new in LEGACY_KEYS],
    overwrite=True,
)


class LookWherePreTrainedModel(PreTrainedModel):
    config: LookWhereConfig
    base_model_prefix = "lookwhere"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["LookWhereLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # recorded by the extractor, from its own blocks: the selector's are internal
    _can_record_outputs = {
        "hidden_states": LookWhereLayer,
        "attentions": LookWhereAttention,
    }

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, LookWhereLayerScale):
            init.constant_(module.lambda1, self.config.layerscale_value)
        elif isinstance(module, LookWhereSelectorEmbeddings):
            for tensor in (module.cls_token, module.register_tokens, module.position_embeddings):
                init.trunc_normal_(tensor, mean=0.0, std=std)
        elif isinstance(module, LookWhereExtractorEmbeddings):
            # from_pretrained marks what it loaded: loaded positions beside missing prefix tokens are a checkpoint saved
            # with the selector's prefix, whose extractor would read random tokens.
            loaded = getattr(module.position_embeddings, "_is_hf_initialized", False)
            if loaded and module.prefix_tokens is not None and not getattr(module.prefix_tokens, "_is_hf_initialized",
                                                                            False):
                raise ValueError(
                    "extractor_prefix='extractor', but this checkpoint has no extractor prefix tokens (it reads the "
                    "selector's, extractor_prefix='selector'): load it without extractor_prefix, or make an own-prefix "
                    "model from its teacher with corevision_hf's lookwhere_from_teacher and extractor_prefix='extractor'."
                )
            for tensor in (module.position_embeddings, module.prefix_tokens):
                if tensor is not None:
                    init.trunc_normal_(tensor, mean=0.0, std=std)


class LookWhereExtractorEmbeddings(nn.Module):
    """The extractor's input tokens, as DINOv3's `DINOv3ViTEmbeddings`: the kept high-resolution patches, each with its
    position, after the prefix (the selector's global tokens, or the extractor's own, `prefix_tokens`). The table is
    resized by `resize_positions`, which `corevision_hf.optimize_for_cpu` replaces."""

    def __init__(self, config: LookWhereConfig):
        super().__init__()
        self.config = config
        self.antialias = config.interpolate_antialias
        self.patch_embeddings = LookWherePatchEmbeddings(config)
        self.position_embeddings = nn.Parameter(torch.empty(1, config.grid_size**2, config.hidden_size))
        # Its own global tokens, CLS (its position folded in) and registers, unless it reads the selector's.
        self.prefix_tokens = (nn.Parameter(torch.empty(1, 1 + config.num_register_tokens, config.hidden_size))
                              if config.extractor_prefix == "extractor" else None)

    def forward(
        self,
        pixel_values: torch.Tensor,
        indices: torch.Tensor,
        prefix_tokens: torch.Tensor | None = None,
        image_grids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, C, H, W) images, (B, k) kept patch indices (-1 in a slot an image does not use, which embeds cell 0),
        (B, P, D) prefix tokens (the selector's global tokens; None with `extractor_prefix="extractor"`, whose prefix
        is the extractor's own) -> tokens (B, P + k, D); positions come from each image's own grid with `image_grids`
        (B, 2)."""
        p = self.config.patch_size
        grid = (pixel_values.shape[2] // p, pixel_values.shape[3] // p)
        if (prefix_tokens is None) == (self.prefix_tokens is None):
            raise ValueError(
                f"extractor_prefix={self.config.extractor_prefix!r}: the extractor reads "
                + ("the selector's global tokens; pass them as prefix_tokens." if self.prefix_tokens is None
                   else "its own prefix tokens; pass prefix_tokens=None.")
            )
        if prefix_tokens is None:
            prefix_tokens = self.prefix_tokens.expand(pixel_values.shape[0], -1, -1)
        indices = indices.clamp(min=0)
        # Rows are taken with F.embedding: its backward sums each row's gradients in a fixed order on CPU and GPU,
        # where advanced indexing's (index_put_ with accumulate) adds them in parallel, different bits every run.
        if image_grids is None:
            positions = F.embedding(indices, self.resize_positions(grid)[0])  # (B, k, D)
        else:
            side = int(self.position_embeddings.shape[1] ** 0.5)
            table = self.position_embeddings.transpose(1, 2).unflatten(-1, (side, side))  # (1, D, G, G)
            tables = resize_in_images(table, torch.full_like(image_grids, side), image_grids, grid, "bicubic",
                                      self.antialias).flatten(2).transpose(1, 2)  # (B, Hp * Wp, D), float32
            rows = indices + tables.shape[1] * torch.arange(indices.shape[0], device=indices.device)[:, None]
            positions = F.embedding(rows, tables.flatten(0, 1)).to(table.dtype)
        # Positions are added per patch before anything mixes tokens, so the order of kept tokens does not matter.
        tokens = self.patch_embeddings.embed_selected(pixel_values, indices) + positions
        return torch.cat([prefix_tokens.to(tokens.dtype), tokens], dim=1)

    def resize_positions(self, grid: tuple[int, int]) -> torch.Tensor:
        """The position table on a (Hp, Wp) grid: (1, Hp * Wp, D)."""
        return resize_position_table(self.position_embeddings, grid, self.antialias)


class LookWhereExtractor(LookWherePreTrainedModel):
    """The "what": a full-depth ViT on the kept high-resolution patches only, after the selector's global tokens (or
    its own). Its blocks' outputs and attentions are the model's `hidden_states` and `attentions`."""

    def __init__(self, config: LookWhereConfig):
        super().__init__(config)
        self.embeddings = LookWhereExtractorEmbeddings(config)
        self.layers = make_layers(config, config.num_hidden_layers)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_init()

    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        pixel_values: torch.Tensor,
        indices: torch.Tensor,
        prefix_tokens: torch.Tensor | None = None,
        image_grids: torch.Tensor | None = None,
        unused_slots: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        """(B, C, H, W) images, (B, k) kept patch indices, (B, P, D) prefix tokens (the selector's global tokens; None
        with `extractor_prefix="extractor"`, whose prefix is the extractor's own) -> last_hidden_state (B, P + k, D),
        normalised. With `image_grids` (B, 2), each image's patch grid in a padded batch, positions come from each
        image's own grid. With `image_grids` or `unused_slots`, slots an image does not use (index -1) are attended by
        no token."""
        hidden_states = self.embeddings(pixel_values, indices, prefix_tokens, image_grids)
        attention_mask = None
        if image_grids is not None or unused_slots:  # no token attends to a slot an image does not use
            kept = indices >= 0
            prefix = kept.new_ones(kept.shape[0], hidden_states.shape[1] - kept.shape[1])
            attention_mask = additive_key_mask(torch.cat([prefix, kept], dim=1))
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutput(last_hidden_state=self.norm(hidden_states))


class LookWhereModel(LookWherePreTrainedModel):
    def __init__(self, config: LookWhereConfig):
        super().__init__(config)
        config.validate_fields()  # again: from_pretrained(..., field=value) sets fields after the config was checked
        self.selector = LookWhereSelector(config)
        self.extractor = LookWhereExtractor(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.extractor.embeddings.patch_embeddings.projection

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor,
        k: int | None = None,
        k_ratio: float | None = None,
        fill_dense: bool = True,
        max_gflops: float | None = None,
        pixel_mask: torch.Tensor | None = None,
        k_mass: float | torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> LookWhereModelOutput:
        r"""
        pixel_values (`torch.FloatTensor` of shape `(batch_size, num_channels, height, width)`):
            Normalised high-resolution images; height and width any multiples of `patch_size`.
        pixel_mask (`torch.Tensor` of shape `(batch_size, height, width)`, *optional*):
            For images of different sizes padded at the bottom and right into one batch (the image processor returns
            it with such a batch): nonzero on each image, zero on its padding. Each image is selected from, embedded
            and filled as it is alone: the selector sees its own content, k follows its own grid (`k_ratio`; a `k` or
            a target is resolved on the padded grid and capped at the image's patches), nothing is kept from or
            filled from padding. `selected_indices` are row-major on the padded grid, -1 in the slots an image does
            not use (last); the tokens of padding cells are meaningless.
        k (`int`, *optional*):
            Patches kept per image, 1..Hp * Wp; default `config.default_k` if set.
        k_ratio (`float`, *optional*):
            Fraction of the high-resolution grid kept, in (0, 1]; default `config.k_ratio`. Give k or k_ratio. It keeps
            floor(k_ratio * Hp * Wp) patches, at least 1, exact for decimal ratios (`kept_for_ratio`).
        max_gflops (`float`, *optional*):
            Target cost instead of k: the largest k whose analytic GFLOPs per image (`corevision_hf.lookwhere_flops`)
            at this size fit; default `config.default_max_gflops` (after `config.default_k`, before `config.k_ratio`).
        k_mass (`float` or `torch.Tensor`, *optional*):
            A budget per image instead: each image keeps the fewest patches, best first, whose softmax(selector_map)
            mass over its own cells reaches `k_mass`, in (0, 1] (at least 1 patch; 1 keeps them all), so a plain image
            keeps few and a busy one many; a (batch_size,) tensor gives one mass per image. `k` or `k_ratio` given with
            it caps each image's count; `max_gflops` may not come with it. Default `config.default_k_mass` (set alone:
            it wins over `config.k_ratio`). The batch keeps its largest count and marks each image's unused slots -1
            in `selected_indices`; `num_kept` says what each image used, and each image gets the features it gets
            alone. Without a cap that largest count is read to the host once, to size the selection (the only host
            read of a forward; none with a cap, unless `k_mass` is a tensor, whose values are checked in that read).
        fill_dense (`bool`, *optional*, defaults to `True`):
            Fill every grid cell (DINOv2-style `last_hidden_state` and `hidden_states`); `False` skips the fill when
            only the image-level output or the kept tokens are needed.
        """
        check_inputs(self.config, pixel_values, pixel_mask, kwargs,
                     ("k", "k_ratio", "fill_dense", "max_gflops", "pixel_mask", "k_mass"))
        grid = (pixel_values.shape[2] // self.config.patch_size, pixel_values.shape[3] // self.config.patch_size)
        image_grids = None if pixel_mask is None else grids_from_mask(pixel_mask, self.config.patch_size)
        select = patch_selection(self.config, pixel_values.shape[0], grid, image_grids, k, k_ratio, max_gflops, k_mass)
        pixel_values = pixel_values.to(self.get_input_embeddings().weight.dtype)

        # Where: the selector scores every high-resolution patch from a low-resolution copy.
        global_tokens, selector_map = self.selector(pixel_values, grid, image_grids)
        # Select: top-k is not differentiable; the selector learns from its map loss and through the global tokens.
        selected_indices, num_kept, unused_slots = select(selector_map)
        # What: the extractor embeds and runs the kept patches only, after the selector's global tokens (or, with
        # extractor_prefix="extractor", its own).
        prefix_tokens = global_tokens if self.config.extractor_prefix == "selector" else None
        extracted = self.extractor(pixel_values, selected_indices, prefix_tokens, image_grids, unused_slots,
                                   return_dict=True, **kwargs)
        outputs = LookWhereModelOutput(
            last_hidden_state=extracted.last_hidden_state,
            pooler_output=extracted.last_hidden_state[:, 0],
            hidden_states=extracted.hidden_states,
            attentions=extracted.attentions,
            selected_indices=selected_indices,
            num_kept=num_kept,
            selector_map=selector_map,
        )
        if fill_dense:  # back onto the full grid, as a dense ViT lays out its tokens
            fill = self.dense_fill(selected_indices, selector_map, grid)
            outputs.last_hidden_state = fill(outputs.last_hidden_state)
            outputs.patch_tokens = outputs.last_hidden_state[:, 1 + self.config.num_register_tokens :]
            if outputs.hidden_states is not None:
                outputs.hidden_states = fill_hidden_states(fill, outputs.hidden_states)
        return outputs

    def dense_fill(
        self, selected_indices: torch.Tensor, selector_map: torch.Tensor, grid: tuple[int, int]
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The dense fill of one selection (a call's `selected_indices` and `selector_map`, (B, k) and (B, Hp * Wp)) on
        its (Hp, Wp) grid: a function from any (B, 1 + R + k, D) tokens of that call (the output, a hidden state, a
        normalised one) to (B, 1 + R + Hp * Wp, D). Equidistant kept cells rank by selector score, as in the authors'
        code."""
        unused = selected_indices < 0  # slots an image of a padded batch does not use rank last
        scores = selector_map.gather(1, selected_indices.clamp(min=0)).masked_fill(unused, float("-inf"))
        score_rank = scores.argsort(dim=-1, descending=True).argsort(dim=-1)
        fill = DenseFill(selected_indices, grid, self.config.num_fill_neighbors, score_rank)
        num_prefix = 1 + self.config.num_register_tokens
        return lambda tokens: torch.cat([tokens[:, :num_prefix], fill(tokens[:, num_prefix:])], dim=1)

    def get_intermediate_layers(
        self,
        pixel_values: torch.Tensor,
        n: int | list[int] = 1,
        reshape: bool = False,
        return_class_token: bool = False,
        norm: bool = True,
        k: int | None = None,
        k_ratio: float | None = None,
        pixel_mask: torch.Tensor | None = None,
        k_mass: float | torch.Tensor | None = None,
    ) -> tuple:
        """DINOv2's `get_intermediate_layers` on the filled grid: the patch tokens after the last `n` extractor blocks
        (an int) or after the blocks of these 0-based indices (a list), through the final norm if `norm` (before the
        fill, as for `last_hidden_state`). Returns a tuple with one (B, Hp * Wp, D) tensor per block, (B, D, Hp, Wp)
        maps if `reshape`, or (patch tokens, (B, D) CLS) pairs if `return_class_token`."""
        outputs = self(pixel_values, k=k, k_ratio=k_ratio, fill_dense=False, pixel_mask=pixel_mask, k_mass=k_mass,
                       output_hidden_states=True, return_dict=True)
        blocks = outputs.hidden_states[1:]  # [0] is the embedding output
        num_prefix = 1 + self.config.num_register_tokens
        grid = (pixel_values.shape[2] // self.config.patch_size, pixel_values.shape[3] // self.config.patch_size)
        fill = self.dense_fill(outputs.selected_indices, outputs.selector_map, grid)
        layers = []
        for index in chosen_blocks(n, len(blocks)):
            # Normalised before the fill, as last_hidden_state is: the last block with norm=True gives its patches.
            hidden_state = fill(self.extractor.norm(blocks[index]) if norm else blocks[index])
            patches = hidden_state[:, num_prefix:]
            if reshape:
                patches = patches.transpose(1, 2).reshape(patches.shape[0], -1, *grid)
            layers.append((patches, hidden_state[:, 0]) if return_class_token else patches)
        return tuple(layers)


class LookWhereTaskModel(LookWherePreTrainedModel):
    """The base of the task heads: fine-tuning trains the extractor and the head, as the method does, and the selector
    stays frozen (no gradients, eval mode) unless `config.freeze_selector` is False. `from_pretrained` replaces every
    parameter after `__init__` and ends with `eval()`, and the Trainer calls `train()` each step: both land in `train`,
    which freezes it again."""

    def __init__(self, config: LookWhereConfig):
        super().__init__(config)
        self.lookwhere = LookWhereModel(config)
        if not config.freeze_selector:
            logger.warning_once("freeze_selector=False: the selector is fine-tuned with the extractor and the head.")
        self.train(self.training)

    def train(self, mode: bool = True):
        # No public hook runs after from_pretrained has replaced the parameters (which resets requires_grad) but
        # its closing model.eval(), which lands here; tests/test_transformers_internals.py fails if it stops doing so.
        super().train(mode)
        if self.config.freeze_selector:
            self.lookwhere.selector.requires_grad_(False).eval()
        return self


class LookWhereForImageClassification(LookWhereTaskModel):
    """LookWhere with a linear classifier on the extractor's CLS token; `hidden_states` filled onto the grid, as the
    base model's. The selector stays frozen by default."""

    def __init__(self, config: LookWhereConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.classifier = nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor,
        labels: torch.Tensor | None = None,
        k: int | None = None,
        k_ratio: float | None = None,
        k_mass: float | torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ImageClassifierOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            Class indices for the cross-entropy loss (mean-squared error when `num_labels == 1`).
        """
        outputs = self.lookwhere(pixel_values, k=k, k_ratio=k_ratio, k_mass=k_mass, fill_dense=False, return_dict=True,
                                 **kwargs)
        logits = self.classifier(outputs.pooler_output)
        loss = self.loss_function(labels, logits, self.config, **kwargs) if labels is not None else None
        hidden_states = outputs.hidden_states
        if hidden_states is not None:  # filled onto the grid, as the base model gives them (the logits need no fill)
            grid = (pixel_values.shape[2] // self.config.patch_size, pixel_values.shape[3] // self.config.patch_size)
            fill = self.lookwhere.dense_fill(outputs.selected_indices, outputs.selector_map, grid)
            hidden_states = fill_hidden_states(fill, hidden_states)
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=hidden_states, attentions=outputs.attentions
        )


class LookWhereForSemanticSegmentation(LookWhereTaskModel):
    """LookWhere with a per-patch linear head on the filled grid; logits upsampled to the input size.
    The selector stays frozen by default."""

    def __init__(self, config: LookWhereConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor,
        labels: torch.Tensor | None = None,
        k: int | None = None,
        k_ratio: float | None = None,
        pixel_mask: torch.Tensor | None = None,
        k_mass: float | torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SemanticSegmenterOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, height, width)`, *optional*):
            Per-pixel class indices; `config.semantic_loss_ignore_index` (255) is ignored, and so is padding.
        """
        outputs = self.lookwhere(pixel_values, k=k, k_ratio=k_ratio, fill_dense=True, pixel_mask=pixel_mask,
                                 k_mass=k_mass, return_dict=True, **kwargs)
        batch_size, _, height, width = pixel_values.shape
        patch = self.config.patch_size
        patch_logits = self.classifier(outputs.patch_tokens)  # (B, Hp * Wp, labels)
        patch_logits = patch_logits.transpose(1, 2).reshape(batch_size, -1, height // patch, width // patch)
        logits = F.interpolate(patch_logits, size=(height, width), mode="bilinear", align_corners=False)
        loss = None
        if labels is not None:
            ignore = self.config.semantic_loss_ignore_index
            if pixel_mask is not None:
                labels = labels.masked_fill(pixel_mask == 0, ignore)
            loss = F.cross_entropy(logits, labels, ignore_index=ignore)
        return SemanticSegmenterOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class LookWhereBackbone(BackboneMixin, LookWhereTaskModel):
    """LookWhere feature maps at chosen extractor layers ("stem", "stage1", ...) on the filled grid, for
    dense-prediction heads: (B, D, Hp, Wp). The selector stays frozen by default."""

    def __init__(self, config: LookWhereConfig):
        super().__init__(config)
        self.num_features = [config.hidden_size] * (config.num_hidden_layers + 1)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.lookwhere.get_input_embeddings()

    @can_return_tuple
    @filter_output_hidden_states
    def forward(
        self,
        pixel_values: torch.Tensor,
        k: int | None = None,
        k_ratio: float | None = None,
        k_mass: float | torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BackboneOutput:
        outputs = self.lookwhere(pixel_values, k=k, k_ratio=k_ratio, k_mass=k_mass, fill_dense=False, return_dict=True,
                                 **kwargs)
        batch_size, _, height, width = pixel_values.shape
        grid_height, grid_width = height // self.config.patch_size, width // self.config.patch_size
        dense = self.lookwhere.dense_fill(outputs.selected_indices, outputs.selector_map, (grid_height, grid_width))
        num_prefix = 1 + self.config.num_register_tokens

        feature_maps = []
        for stage, hidden_state in zip(self.stage_names, outputs.hidden_states):
            if stage not in self.out_features:
                continue
            if self.config.apply_layernorm:  # before the fill, as for last_hidden_state
                hidden_state = self.lookwhere.extractor.norm(hidden_state)
            patch_tokens = dense(hidden_state)[:, num_prefix:]
            if self.config.reshape_hidden_states:
                patch_tokens = patch_tokens.transpose(1, 2).reshape(batch_size, -1, grid_height, grid_width)
            feature_maps.append(patch_tokens)
        hidden_states = fill_hidden_states(dense, outputs.hidden_states)  # on the grid, as the model gives them
        return BackboneOutput(feature_maps=tuple(feature_maps), hidden_states=hidden_states, attentions=outputs.attentions)


__all__ = [
    "LookWherePreTrainedModel",
    "LookWhereModel",
    "LookWhereModelOutput",
    "LookWhereForImageClassification",
    "LookWhereForSemanticSegmentation",
    "LookWhereBackbone",
]
