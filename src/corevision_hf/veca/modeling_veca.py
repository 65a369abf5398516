"""VECA: Visual Elastic Core Attention (arXiv 2605.12491).

A ViT whose patches never attend to each other. An ordered bank of learned core tokens is the only route
between patches: cores attend to the active cores and all patches, patches attend to the active cores only.
Attention cost is linear in the number of patches, and the number of active cores is chosen per call.

Hub-copied: this file imports only torch, transformers and its sibling files (configuration, budget).
"""

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.backbone_utils import BackboneMixin, filter_output_hidden_states
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import Chunk, WeightConverter, WeightRenaming
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BackboneOutput,
    BaseModelOutput,
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils.generic import TransformersKwargs, can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .budget_veca import cores_to_keep
from .configuration_veca import VecaConfig


@dataclass
class VecaModelOutput(BaseModelOutputWithPooling):
    r"""
    last_hidden_state (`torch.FloatTensor` of shape `(batch_size, num_cores + num_patches, hidden_size)`):
        Final normalised tokens laid out as [active cores ; patches]; the patch tokens are the last `Hp * Wp`.
    pooler_output (`torch.FloatTensor` of shape `(batch_size, hidden_size)`):
        Core 0 after the final norm, the image-level token.
    core_coordinates (`torch.FloatTensor` of shape `(batch_size, num_cores, 2)`):
        Final (x, y) coordinates of the active cores in (-1, 1), image-relative.
    patch_tokens (`torch.FloatTensor` of shape `(batch_size, Hp * Wp, hidden_size)`):
        The patch tokens of `last_hidden_state` alone, row-major on the patch grid (a view, not a copy): DINOv2's
        `last_hidden_state[:, 1:]` here is `last_hidden_state[:, num_cores:]`.
    """

    core_coordinates: torch.FloatTensor | None = None
    patch_tokens: torch.FloatTensor | None = None


class VecaPatchEmbeddings(nn.Module):
    """Non-overlapping patches -> tokens: (B, C, H, W) -> (B, Hp * Wp, D), optionally layer-normalised."""

    def __init__(self, config: VecaConfig):
        super().__init__()
        self.projection = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
        )
        self.norm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.patch_embedding_norm else nn.Identity()
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.norm(self.projection(pixel_values).flatten(2).transpose(1, 2))


def resize_position_table(table: torch.Tensor, grid: tuple[int, int], antialias: bool) -> torch.Tensor:
    """(1, G * G, D) learned positions -> (1, Hp * Wp, D) by DINOv2's bicubic resize (align_corners=False, in
    float32), unchanged if the grid is G x G."""
    side = int(table.shape[1] ** 0.5)
    if (side, side) == tuple(grid):
        return table
    square = table.float().reshape(1, side, side, -1).permute(0, 3, 1, 2).contiguous()  # (1, D, G, G)
    resized = F.interpolate(square, size=grid, mode="bicubic", align_corners=False, antialias=antialias)
    return resized.flatten(2).transpose(1, 2).to(table.dtype)


def cubic_filter(x: torch.Tensor, a: float) -> torch.Tensor:
    """Keys' cubic convolution kernel with parameter `a` (torch: -0.75, and -0.5 when antialiasing), zero beyond 2."""
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


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


def farthest_point_coordinates(
    num_points: int, num_candidates: int, extent: float, seed: int
) -> torch.Tensor:
    """Spread-out 2D points, (num_points, 2): farthest-point sampling of uniform candidates in [-extent, extent]^2,
    starting from the candidate nearest the origin, so point 0 sits near the centre and every prefix is spread."""
    generator = torch.Generator().manual_seed(seed)
    candidates = (torch.rand(max(num_candidates, num_points), 2, generator=generator) * 2 - 1) * extent
    chosen = [int(candidates.norm(dim=1).argmin())]
    distance = (candidates - candidates[chosen[0]]).norm(dim=1)
    for _ in range(num_points - 1):
        chosen.append(int(distance.argmax()))
        distance = torch.minimum(distance, (candidates - candidates[chosen[-1]]).norm(dim=1))
    return candidates[chosen]


class VecaCoreBank(nn.Module):
    """The ordered bank of learned core tokens and their 2D coordinates. A budget is an active prefix."""

    def __init__(self, config: VecaConfig):
        super().__init__()
        self.cores = nn.Parameter(torch.empty(1, config.num_cores, config.hidden_size))
        # Stored as atanh(coordinate) and used as tanh(raw), so coordinates stay inside (-1, 1).
        self.coordinates = nn.Parameter(torch.empty(config.num_cores, 2))

    def forward(self, batch_size: int, num_cores: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the first `num_cores` cores (B, C, D) and their raw coordinates (B, C, 2) in float32."""
        cores = self.cores[:, :num_cores].expand(batch_size, -1, -1)
        coordinates = self.coordinates[:num_cores].float().expand(batch_size, -1, -1)
        return cores, coordinates


class VecaEmbeddings(nn.Module):
    """Pixels -> the encoder's input tokens, as DINOv3's `DINOv3ViTEmbeddings`: the active cores of the bank, then the
    patch tokens. With `config.position_embedding_grid`, a learned absolute position table of G x G patches (a ViT
    teacher's, DINOv2's) is added to the patch tokens, resized bicubically to each grid as DINOv2 resizes its own."""

    def __init__(self, config: VecaConfig):
        super().__init__()
        self.config = config
        self.patch_embeddings = VecaPatchEmbeddings(config)
        grid = config.position_embedding_grid
        self.position_embeddings = nn.Parameter(torch.empty(1, grid**2, config.hidden_size)) if grid else None
        self.core_bank = VecaCoreBank(config)

    def forward(
        self, pixel_values: torch.Tensor, num_cores: int, image_grids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, C, H, W) images -> [active cores ; patch tokens] (B, C + N, D) and the cores' raw coordinates (B, C, 2),
        float32. With `image_grids` (B, 2), each image's patch grid in a padded batch, each image's positions are
        those of its own grid."""
        batch_size, _, height, width = pixel_values.shape
        grid = (height // self.config.patch_size, width // self.config.patch_size)
        patches = self.patch_embeddings(pixel_values.to(self.patch_embeddings.projection.weight.dtype))
        if self.position_embeddings is not None:
            patches = patches + self.positions(grid, image_grids).to(patches.dtype)
        cores, core_coordinates = self.core_bank(batch_size, num_cores)
        return torch.cat([cores.to(patches.dtype), patches], dim=1), core_coordinates

    def positions(self, grid: tuple[int, int], image_grids: torch.Tensor | None = None) -> torch.Tensor:
        """The position table on a (Hp, Wp) grid, (1, Hp * Wp, D); with `image_grids` (B, 2), each image's (rows,
        columns) in a padded batch, (B, Hp * Wp, D): each image's table on its own grid at the top left, zero on its
        padding."""
        antialias = self.config.position_embedding_antialias
        if image_grids is None:
            return resize_position_table(self.position_embeddings, grid, antialias)
        side = int(self.position_embeddings.shape[1] ** 0.5)
        table = self.position_embeddings.transpose(1, 2).unflatten(-1, (side, side))  # (1, D, G, G)
        tables = resize_in_images(table, torch.full_like(image_grids, side), image_grids, grid, "bicubic", antialias)
        return tables.flatten(2).transpose(1, 2).to(self.position_embeddings.dtype)


class VecaCoordinateHead(nn.Module):
    """Moves the cores with the image content: raw <- raw + alpha * Linear(x_cores), before every block but the first."""

    def __init__(self, config: VecaConfig):
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, 2)
        self.alpha = nn.Parameter(torch.full((1,), float(config.coordinate_head_init)))

    def forward(self, raw_coordinates: torch.Tensor, cores: torch.Tensor) -> torch.Tensor:
        return raw_coordinates + (self.alpha * self.proj(cores)).float()


def rope_inverse_frequencies(config: VecaConfig) -> torch.Tensor:
    """(head_dim / 4,) inverse periods 1 / theta^(2i / (head_dim / 2)), highest frequency first; a
    `rope_zero_fraction` of them, at the `rope_zero_from` end, are zero."""
    head_dim = config.hidden_size // config.num_attention_heads
    num_frequencies = head_dim // 4
    exponents = torch.arange(num_frequencies, dtype=torch.float32) * 2 / (head_dim // 2)
    inv_freq = 1.0 / config.rope_theta**exponents
    num_zeroed = round(config.rope_zero_fraction * num_frequencies)
    if num_zeroed:  # infinite period: these pairs are never rotated
        if config.rope_zero_from == "low":
            inv_freq[num_frequencies - num_zeroed :] = 0.0
        else:
            inv_freq[:num_zeroed] = 0.0
    return inv_freq


class VecaRotaryEmbedding(nn.Module):
    """2D axial RoPE. Rotations are unit complex numbers, one per (even, odd) pair of a head: the first head_dim / 4
    pairs turn with x, the next head_dim / 4 with y. Its forward gives the patches' rotations, from their centres on
    the grid (shifted and rescaled in training, as DINOv3's `DINOv3ViTRopePositionEmbedding` does); `rotations` turns
    any coordinates, the cores' as they move, into rotations."""

    inv_freq: torch.Tensor

    def __init__(self, config: VecaConfig):
        super().__init__()
        self.config = config
        self.register_buffer("inv_freq", rope_inverse_frequencies(config), persistent=False)

    def angles(self, coordinates: torch.Tensor) -> torch.Tensor:
        """(..., 2) coordinates in (x, y) order -> (..., head_dim / 2) float32 rotation angles."""
        return (2 * math.pi * coordinates.float()[..., None] * self.inv_freq).flatten(-2)

    def rotations(self, coordinates: torch.Tensor) -> torch.Tensor:
        """(..., 2) coordinates in (x, y) order -> (..., head_dim / 2) complex64 rotations."""
        angles = self.angles(coordinates)
        return torch.polar(torch.ones_like(angles), angles)

    def forward(self, grid: tuple[int, int], image_grids: torch.Tensor | None = None) -> torch.Tensor:
        """The patches' rotations on a (Hp, Wp) grid: (1, Hp * Wp, head_dim / 2), or (B, Hp * Wp, head_dim / 2) with
        `image_grids` (B, 2), each image's centres relative to its own grid in a padded batch."""
        coordinates = patch_center_coordinates(*grid, self.inv_freq.device, image_grids)
        if self.training:
            coordinates = augment_patch_coordinates(coordinates, self.config.pos_embed_shift,
                                                    self.config.pos_embed_rescale)
        rotations = self.rotations(coordinates)
        return rotations if image_grids is not None else rotations[None]


def patch_center_coordinates(
    height: int, width: int, device: torch.device, image_grids: torch.Tensor | None = None
) -> torch.Tensor:
    """(height * width, 2) patch centres (i + 0.5) / n * 2 - 1 in (x, y) order, rows first like the patch tokens.
    With `image_grids` (B, 2), each image's (rows, columns) in a padded batch: (B, height * width, 2), each image's
    centres relative to its own grid (padding cells fall outside (-1, 1))."""
    ys = torch.arange(height, device=device, dtype=torch.float32) + 0.5
    xs = torch.arange(width, device=device, dtype=torch.float32) + 0.5
    if image_grids is None:
        grid_y, grid_x = torch.meshgrid(ys / height * 2 - 1, xs / width * 2 - 1, indexing="ij")
        return torch.stack([grid_x, grid_y], dim=-1).flatten(0, 1)
    ys = ys / image_grids[:, :1] * 2 - 1  # (B, height)
    xs = xs / image_grids[:, 1:] * 2 - 1  # (B, width)
    grid_x, grid_y = xs[:, None, :].expand(-1, height, -1), ys[:, :, None].expand(-1, -1, width)
    return torch.stack([grid_x, grid_y], dim=-1).flatten(1, 2)


def augment_patch_coordinates(coordinates: torch.Tensor, shift: float | None, rescale: float | None) -> torch.Tensor:
    """Training-time augmentation: one uniform shift per axis, then one log-uniform rescale in [1/rescale, rescale]."""
    if shift:
        coordinates = coordinates + torch.empty(2, device=coordinates.device).uniform_(-shift, shift)
    if rescale:
        log_range = math.log(rescale)
        coordinates = coordinates * torch.empty(1, device=coordinates.device).uniform_(-log_range, log_range).exp()
    return coordinates


def apply_rotary(qk: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Rotate queries and keys together: (B, L, 2, H, head_dim) by (B, L, head_dim / 2) complex rotations, each
    (even, odd) pair of a head as one complex number: one multiply, several times faster on CPU than rotate-half."""
    compute_dtype = qk.dtype if qk.dtype in (torch.float32, torch.float64) else torch.float32
    pairs = torch.view_as_complex(qk.to(compute_dtype).unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * rotations[:, :, None, None, :].to(pairs.dtype)).flatten(-2).to(qk.dtype)


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


class VecaCorePeripheryAttention(nn.Module):
    """Core-periphery attention as two dense attention calls, no mask:
    cores attend to [active cores ; patches], patches attend to the active cores only."""

    def __init__(self, config: VecaConfig):
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
        num_cores: int,
        rotations: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`attention_mask` (B, 1, 1, L), additive: the cores' mask over [cores ; patches] in a padded batch."""
        batch_size, seq_len, hidden_size = hidden_states.shape
        shape = (batch_size, seq_len, self.num_heads, self.head_dim)
        query_key = torch.stack([self.q_proj(hidden_states).view(shape), self.k_proj(hidden_states).view(shape)], 2)
        query, key = apply_rotary(query_key, rotations).unbind(2)
        value = self.v_proj(hidden_states).view(shape)
        query, key, value = (x.transpose(1, 2) for x in (query, key, value))  # (B, H, L, head_dim)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        dropout = self.dropout if self.training else 0.0
        core_keys, core_values = key[:, :, :num_cores], value[:, :, :num_cores]
        if attention_mask is not None:
            attention_mask = attention_mask.to(query.dtype)
        core_output, core_weights = attention_interface(
            self, query[:, :, :num_cores], key, value, attention_mask, dropout=dropout, scaling=self.scaling, **kwargs
        )
        patch_output, patch_weights = attention_interface(
            self, query[:, :, num_cores:], core_keys, core_values, None, dropout=dropout, scaling=self.scaling, **kwargs
        )
        attn_output = torch.cat([core_output, patch_output], dim=1).reshape(batch_size, seq_len, hidden_size)
        attn_output = self.o_proj(attn_output)

        attn_weights = None
        if core_weights is not None and patch_weights is not None:
            # The joint (L x L) map, for visualisation: patch rows are zero outside the active cores.
            attn_weights = core_weights.new_zeros(batch_size, self.num_heads, seq_len, seq_len)
            attn_weights[:, :, :num_cores] = core_weights
            attn_weights[:, :, num_cores:, :num_cores] = patch_weights
        return attn_output, attn_weights


class VecaSwiGLU(nn.Module):
    """fc1: D -> 2h, silu(u) * v, fc2: h -> D."""

    def __init__(self, config: VecaConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, 2 * config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        u, v = self.fc1(hidden_states).chunk(2, dim=-1)
        return self.fc2(F.silu(u) * v)


class VecaMLP(nn.Module):
    def __init__(self, config: VecaConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACT2FN[config.hidden_act]
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(hidden_states)))


class VecaDropPath(nn.Module):
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


class VecaLayer(GradientCheckpointingLayer):
    """Pre-norm block shared by cores and patches: core-periphery attention, then the MLP (SwiGLU, or plain)."""

    def __init__(self, config: VecaConfig, drop_path_rate: float = 0.0):
        super().__init__()
        self.chunk_size_feed_forward = config.chunk_size_feed_forward
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = VecaCorePeripheryAttention(config)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = VecaSwiGLU(config) if config.mlp_type == "swiglu" else VecaMLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.drop_path = VecaDropPath(drop_path_rate)

    def forward(
        self,
        hidden_states: torch.Tensor,
        num_cores: int,
        rotations: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attn_output, _ = self.attention(
            self.norm1(hidden_states), num_cores, rotations, attention_mask=attention_mask, **kwargs
        )
        hidden_states = hidden_states + self.drop_path(self.dropout(attn_output))
        # transformers' chunk_size_feed_forward (0 by default): the MLP over token chunks, the same result with less
        # peak memory; chunks of any length here, the last one shorter.
        chunk_size = self.chunk_size_feed_forward
        if not chunk_size or hidden_states.shape[1] <= chunk_size:
            mlp_output = self.mlp(self.norm2(hidden_states))
        else:
            mlp_output = torch.cat([self.mlp(self.norm2(chunk)) for chunk in hidden_states.split(chunk_size, dim=1)], 1)
        return hidden_states + self.drop_path(self.dropout(mlp_output))


def grids_from_mask(pixel_mask: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Each image's patch grid (rows, columns), (B, 2), in a batch padded at the bottom and right as the image
    processor pads it: `pixel_mask` (B, H, W) is nonzero on each image and zero on its padding. An all-0 mask, which
    the processor never makes, reads as its top-left patch (an image of no patch would give NaN)."""
    patch_mask = pixel_mask[:, ::patch_size, ::patch_size] != 0  # (B, Hp, Wp)
    return torch.stack([patch_mask[:, :, 0].sum(dim=1), patch_mask[:, 0].sum(dim=1)], dim=1).clamp(min=1)


def cells_in_images(image_grids: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(B, Hp * Wp) bool, row-major on the padded grid: whether each cell lies in its image's own (rows, columns)."""
    rows = torch.arange(grid[0], device=image_grids.device) < image_grids[:, :1]  # (B, Hp)
    columns = torch.arange(grid[1], device=image_grids.device) < image_grids[:, 1:]  # (B, Wp)
    return (rows[:, :, None] & columns[:, None, :]).flatten(1)


def additive_key_mask(keep: torch.Tensor) -> torch.Tensor:
    """(B, L) True for the keys each query may attend to -> (B, 1, 1, L) float32 mask added to the attention scores:
    0, or float32's lowest value, which the softmax turns into a weight of exactly 0."""
    mask = torch.zeros(keep.shape, device=keep.device).masked_fill(~keep, torch.finfo(torch.float32).min)
    return mask[:, None, None]


def core_key_mask(num_cores: int, image_grids: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """The cores' additive key mask in a padded batch, (B, 1, 1, C + Hp * Wp): the active cores and their own image's
    patches."""
    cells = cells_in_images(image_grids, grid)
    return additive_key_mask(torch.cat([cells.new_ones(cells.shape[0], num_cores), cells], dim=1))


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


# State-dict keys written by earlier versions of this model -> today's, applied by transformers when a checkpoint is
# loaded: (old, new) patterns, or (old, [new, ...]) for a fused tensor split in equal row blocks. Add a line per rename.
LEGACY_KEYS = [
    (r"(?<!encoder\.)layers\.", "encoder.layers."),  # the blocks and coordinate heads moved into the encoder
    (r"(?<!encoder\.)coordinate_heads\.", "encoder.coordinate_heads."),
    ("attention.qkv", ["attention.q_proj", "attention.k_proj", "attention.v_proj"]),  # fused (q; k; v) rows
    ("attention.proj", "attention.o_proj"),
    (r"(?<!embeddings\.)patch_embeddings\.", "embeddings.patch_embeddings."),  # the embeddings own their weights
    (r"(?<!embeddings\.)position_embeddings\.weight", "embeddings.position_embeddings"),
    (r"(?<!embeddings\.)core_bank\.", "embeddings.core_bank."),
]


class LoadOnly:
    """A key conversion that saving does not undo (transformers reverses conversions on save): new checkpoints are
    written with today's names. transformers has no public way for a model to make its conversions load-only
    (`save_pretrained(save_original_format=False)` is each caller's choice), so this overrides
    `WeightTransform.reverse_transform`, which `core_model_loading.revert_weight_conversion` calls on save;
    tests/test_transformers_internals.py fails when either changes."""

    def reverse_transform(self) -> WeightRenaming:
        return WeightRenaming(self.target_patterns[0], self.target_patterns[0])  # renames nothing


class LegacyRenaming(LoadOnly, WeightRenaming):
    pass


class LegacySplit(LoadOnly, WeightConverter):
    pass


# transformers' public registry of checkpoint conversions: a custom-code model gets the conversions registered under
# its model_type by name (and no built-in model's of that name). Overwritten, not added to: the package's module and a
# hub copy of it may both be imported (tests/test_transformers_internals.py checks the registry's behaviour).
register_checkpoint_conversion_mapping(
    "veca",
    [LegacySplit(old, new, operations=[Chunk(dim=0)]) if isinstance(new, list) else LegacyRenaming(old, new)
     for old, new in LEGACY_KEYS],
    overwrite=True,
)


class VecaPreTrainedModel(PreTrainedModel):
    config: VecaConfig
    base_model_prefix = "veca"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["VecaLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": VecaLayer, "attentions": VecaCorePeripheryAttention}

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        config = self.config
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, mean=0.0, std=config.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, VecaCoreBank):
            init.normal_(module.cores, mean=0.0, std=config.hidden_size**-0.5)
            coordinates = farthest_point_coordinates(
                config.num_cores,
                config.core_coordinate_init_candidates,
                config.core_coordinate_init_range,
                config.core_coordinate_init_seed,
            )
            init.copy_(module.coordinates, torch.atanh(coordinates))
        elif isinstance(module, VecaEmbeddings) and module.position_embeddings is not None:
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=config.initializer_range)
        elif isinstance(module, VecaCoordinateHead):
            init.constant_(module.alpha, config.coordinate_head_init)
        elif isinstance(module, VecaRotaryEmbedding):
            init.copy_(module.inv_freq, rope_inverse_frequencies(config))


@dataclass
class VecaEncoderOutput(BaseModelOutput):
    r"""
    core_coordinates (`torch.FloatTensor` of shape `(batch_size, num_cores, 2)`):
        Final (x, y) coordinates of the active cores in (-1, 1), image-relative.
    """

    core_coordinates: torch.FloatTensor | None = None


class VecaEncoder(VecaPreTrainedModel):
    """The blocks, with the coordinate heads that move the cores (and so their rotations) between them."""

    def __init__(self, config: VecaConfig):
        super().__init__(config)
        self.rotary_embedding = VecaRotaryEmbedding(config)
        self.coordinate_heads = nn.ModuleList(VecaCoordinateHead(config) for _ in range(config.num_hidden_layers - 1))
        depth = config.num_hidden_layers
        self.layers = nn.ModuleList(VecaLayer(config, config.drop_path_rate * i / max(1, depth - 1)) for i in range(depth))
        self.post_init()

    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        hidden_states: torch.Tensor,
        num_cores: int,
        core_coordinates: torch.Tensor,
        grid: tuple[int, int],
        image_grids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> VecaEncoderOutput:
        r"""
        hidden_states (`torch.FloatTensor` of shape `(batch_size, num_cores + num_patches, hidden_size)`):
            The active cores, then the patch tokens.
        core_coordinates (`torch.FloatTensor` of shape `(batch_size, num_cores, 2)`):
            The cores' raw (pre-tanh) coordinates, float32.
        grid (`tuple[int, int]`):
            The patch grid (Hp, Wp) of the patch tokens.
        image_grids (`torch.LongTensor` of shape `(batch_size, 2)`, *optional*):
            Each image's own patch grid in a padded batch: its patches are placed on it.
        attention_mask (`torch.FloatTensor` of shape `(batch_size, 1, 1, num_cores + num_patches)`, *optional*):
            Additive: the keys the cores attend to in a padded batch.
        """
        # Patch rotations are fixed for the whole forward; only the cores move between layers.
        patch_rotations = self.rotary_embedding(grid, image_grids).expand(hidden_states.shape[0], -1, -1)
        for index, layer in enumerate(self.layers):
            if index > 0:
                core_coordinates = self.coordinate_heads[index - 1](core_coordinates, hidden_states[:, :num_cores])
            core_rotations = self.rotary_embedding.rotations(torch.tanh(core_coordinates))
            hidden_states = layer(hidden_states, num_cores, torch.cat([core_rotations, patch_rotations], dim=1),
                                  attention_mask, **kwargs)
        return VecaEncoderOutput(last_hidden_state=hidden_states, core_coordinates=torch.tanh(core_coordinates))


class VecaModel(VecaPreTrainedModel):
    def __init__(self, config: VecaConfig):
        super().__init__(config)
        config.validate_fields()  # again: from_pretrained(..., field=value) sets fields after the config was checked
        self.embeddings = VecaEmbeddings(config)
        self.encoder = VecaEncoder(config)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.output_projection = (
            nn.Linear(config.hidden_size, config.output_projection_size)
            if config.output_projection_size
            else None
        )
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings.projection

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor,
        num_cores: int | None = None,
        max_gflops: float | None = None,
        pixel_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> VecaModelOutput:
        r"""
        pixel_values (`torch.FloatTensor` of shape `(batch_size, num_channels, height, width)`):
            Normalised images; height and width any multiples of `patch_size`.
        pixel_mask (`torch.Tensor` of shape `(batch_size, height, width)`, *optional*):
            For images of different sizes padded at the bottom and right into one batch (the image processor returns
            it with such a batch): nonzero on each image, zero on its padding. Each image's patch positions are
            those of its own grid and the cores never attend to padding, so every image gets the features it gets
            alone; the tokens of padding cells are meaningless.
        num_cores (`int`, *optional*):
            Active prefix of the core bank, 1..`config.num_cores` (default: `config.default_num_cores`, else
            `config.default_max_gflops`, else the whole bank).
        max_gflops (`float`, *optional*):
            Target cost instead of `num_cores`: the largest of `config.training_budgets` whose analytic GFLOPs per
            image (`corevision_hf.veca_flops`) at this size fit.
        """
        num_cores = cores_to_keep(self.config, pixel_values, pixel_mask, num_cores, max_gflops, kwargs)
        grid = (pixel_values.shape[2] // self.config.patch_size, pixel_values.shape[3] // self.config.patch_size)
        image_grids = None if pixel_mask is None else grids_from_mask(pixel_mask, self.config.patch_size)
        hidden_states, core_coordinates = self.embeddings(pixel_values, num_cores, image_grids)
        attention_mask = None if image_grids is None else core_key_mask(num_cores, image_grids, grid)
        encoder_outputs: VecaEncoderOutput = self.encoder(  # a dict even where the config asks for tuples
            hidden_states, num_cores, core_coordinates, grid, image_grids, attention_mask, return_dict=True, **kwargs
        )
        sequence_output = self.norm(encoder_outputs.last_hidden_state)
        if self.output_projection is not None:
            sequence_output = self.output_projection(sequence_output)
        return VecaModelOutput(
            last_hidden_state=sequence_output,
            pooler_output=sequence_output[:, 0],
            hidden_states=encoder_outputs.hidden_states,
            attentions=encoder_outputs.attentions,
            core_coordinates=encoder_outputs.core_coordinates,
            patch_tokens=sequence_output[:, num_cores:],
        )

    def get_intermediate_layers(
        self,
        pixel_values: torch.Tensor,
        n: int | list[int] = 1,
        reshape: bool = False,
        return_class_token: bool = False,
        norm: bool = True,
        num_cores: int | None = None,
        pixel_mask: torch.Tensor | None = None,
    ) -> tuple:
        """DINOv2's `get_intermediate_layers`: the patch tokens after the last `n` blocks (an int) or after the blocks
        of these 0-based indices (a list), through the final norm and the output projection (when the config has
        `output_projection_size`) if `norm`, so that the last block gives `patch_tokens` and core 0 `pooler_output`;
        without `norm`, the blocks' raw tokens (hidden_size wide). Returns a tuple with one (B, Hp * Wp, D) tensor per
        block, (B, D, Hp, Wp) maps if `reshape`, or (patch tokens, (B, D) core 0) pairs if `return_class_token`."""
        outputs = self(pixel_values, num_cores=num_cores, pixel_mask=pixel_mask, output_hidden_states=True,
                       return_dict=True)
        blocks = outputs.hidden_states[1:]  # [0] is the embedding output
        active_cores = outputs.core_coordinates.shape[1]
        grid = (pixel_values.shape[2] // self.config.patch_size, pixel_values.shape[3] // self.config.patch_size)
        layers = []
        for index in chosen_blocks(n, len(blocks)):
            hidden_state = blocks[index]
            if norm:  # as forward ends
                hidden_state = self.norm(hidden_state)
                if self.output_projection is not None:
                    hidden_state = self.output_projection(hidden_state)
            patches = hidden_state[:, active_cores:]
            if reshape:
                patches = patches.transpose(1, 2).reshape(patches.shape[0], -1, *grid)
            layers.append((patches, hidden_state[:, 0]) if return_class_token else patches)
        return tuple(layers)


class VecaForImageClassification(VecaPreTrainedModel):
    """VECA with a linear classifier on [core 0 ; mean patch token] (the mean over each image's own patches in a
    padded batch)."""

    def __init__(self, config: VecaConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.veca = VecaModel(config)
        width = config.output_projection_size or config.hidden_size
        self.classifier = nn.Linear(2 * width, config.num_labels) if config.num_labels > 0 else nn.Identity()
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor,
        labels: torch.Tensor | None = None,
        num_cores: int | None = None,
        pixel_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ImageClassifierOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            Class indices for the cross-entropy loss (mean-squared error when `num_labels == 1`).
        """
        outputs: VecaModelOutput = self.veca(pixel_values, num_cores=num_cores, pixel_mask=pixel_mask, return_dict=True,
                                             **kwargs)
        patch_tokens = outputs.patch_tokens
        if pixel_mask is None:
            mean_patch = patch_tokens.mean(dim=1)
        else:
            grids = grids_from_mask(pixel_mask, self.config.patch_size)
            patch = self.config.patch_size
            cells = cells_in_images(grids, (pixel_values.shape[2] // patch, pixel_values.shape[3] // patch))
            mean_patch = (patch_tokens * cells[..., None]).sum(dim=1) / grids.prod(dim=1, keepdim=True)
        features = torch.cat([outputs.pooler_output, mean_patch], dim=-1)
        logits = self.classifier(features)
        loss = self.loss_function(labels, logits, self.config, **kwargs) if labels is not None else None
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class VecaBackbone(BackboneMixin, VecaPreTrainedModel):
    """VECA feature maps at chosen layers ("stem", "stage1", ...) for dense-prediction heads: (B, D, Hp, Wp), D the
    hidden size at every stage (`num_features`): the final norm applies (`apply_layernorm`), the output projection does
    not (`get_intermediate_layers` applies both)."""

    def __init__(self, config: VecaConfig):
        super().__init__(config)
        self.veca = VecaModel(config)
        self.num_features = [config.hidden_size] * (config.num_hidden_layers + 1)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.veca.get_input_embeddings()

    @can_return_tuple
    @filter_output_hidden_states
    def forward(
        self, pixel_values: torch.Tensor, num_cores: int | None = None, **kwargs: Unpack[TransformersKwargs]
    ) -> BackboneOutput:
        outputs: VecaModelOutput = self.veca(pixel_values, num_cores=num_cores, return_dict=True, **kwargs)
        batch_size, _, height, width = pixel_values.shape
        grid_height, grid_width = height // self.config.patch_size, width // self.config.patch_size
        active_cores = outputs.core_coordinates.shape[1]

        feature_maps = []
        for stage, hidden_state in zip(self.stage_names, outputs.hidden_states):
            if stage not in self.out_features:
                continue
            if self.config.apply_layernorm:
                hidden_state = self.veca.norm(hidden_state)
            patch_tokens = hidden_state[:, active_cores:]
            if self.config.reshape_hidden_states:
                patch_tokens = patch_tokens.transpose(1, 2).reshape(batch_size, -1, grid_height, grid_width)
            feature_maps.append(patch_tokens)
        return BackboneOutput(
            feature_maps=tuple(feature_maps), hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = [
    "VecaPreTrainedModel",
    "VecaModel",
    "VecaModelOutput",
    "VecaForImageClassification",
    "VecaBackbone",
]
