"""VECA configuration. Hub-copied: imports only transformers (no torch: a configuration is data)."""

from typing import TYPE_CHECKING

from transformers import PreTrainedConfig
from transformers.backbone_utils import BackboneConfigMixin


if TYPE_CHECKING:  # never run (the pipeline imports torch): a relative import has save_pretrained copy its file
    from .pipeline_veca import VecaImageFeatureExtractionPipeline  # noqa: F401

# The budget-aware pipeline that `hub_code_fields` names in `custom_pipelines`.
PIPELINE = "pipeline_veca.VecaImageFeatureExtractionPipeline"

# The names of transformers' activations (`transformers.activations.ACT2FN`, transformers 5.25), written out because
# importing ACT2FN imports torch; tests/test_config_validation.py holds them equal to ACT2FN's keys.
ACTIVATIONS = (
    "gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_accurate",
    "hardswish", "laplace", "leaky_relu", "linear", "mish", "quick_gelu", "relu", "relu2", "relu6", "sigmoid", "silu",
    "sqrtsoftplus", "swish", "tanh", "prelu", "xielu",
)


def swiglu_intermediate_size(hidden_size: int) -> int:
    """The SwiGLU MLP's hidden width for tokens of `hidden_size`: 8/3 of it, rounded down, so that its three matrices
    cost what a plain MLP's two do at 4x (Shazeer 2020). The VECA reference writes the ratio `mlp_ratio=2.66667` and
    takes `int(hidden_size * 2.66667)`, the same number below a width of 100,000."""
    return hidden_size * 8 // 3


# Reference sizes of the paper (all patch 16, a bank of 64 cores, SwiGLU MLP).
VECA_PRESETS = {
    "small": dict(hidden_size=384, num_attention_heads=6, num_hidden_layers=12,
                  intermediate_size=swiglu_intermediate_size(384)),
    "splus": dict(hidden_size=384, num_attention_heads=6, num_hidden_layers=12, intermediate_size=384 * 4),
    "base": dict(hidden_size=768, num_attention_heads=12, num_hidden_layers=12,
                 intermediate_size=swiglu_intermediate_size(768)),
    "large": dict(hidden_size=1024, num_attention_heads=16, num_hidden_layers=24,
                  intermediate_size=swiglu_intermediate_size(1024)),
}


# A larger bank is no longer "a few cores": attention would cost more than a dense ViT's at usual sizes.
MAX_CORES = 4096


# Hub code for every head (`hub_code_fields`).
AUTO_MAP = {
    "AutoConfig": "configuration_veca.VecaConfig",
    "AutoModel": "modeling_veca.VecaModel",
    "AutoModelForImageClassification": "modeling_veca.VecaForImageClassification",
    "AutoBackbone": "modeling_veca.VecaBackbone",
}


class VecaConfig(BackboneConfigMixin, PreTrainedConfig):
    r"""
    Configuration of a VECA (Visual Elastic Core Attention) vision transformer.

    Patches never attend to each other: an ordered bank of `num_cores` learned core tokens is the only route
    between them, and any prefix of the bank can be chosen at call time (`model(pixel_values, num_cores=16)`).

    Args:
        hidden_size (`int`, defaults to 768): width of every token.
        num_hidden_layers (`int`, defaults to 12): number of transformer blocks.
        num_attention_heads (`int`, defaults to 12): attention heads; `hidden_size / heads` must be divisible by 4
            (2D axial RoPE rotates pairs, half of them along x and half along y).
        intermediate_size (`int`, defaults to 2048): hidden size of the MLP (a SwiGLU's fc1 maps to twice this).
        mlp_type (`str`, defaults to `"swiglu"`): the MLP of every block: `"swiglu"` (fc1: D -> 2h, `silu(u) * v`,
            fc2: h -> D, the paper's) or `"plain"` (fc1: D -> h, `hidden_act`, fc2: h -> D, the MLP of DINOv2 and of
            DINOv3 ViT-S/B, 2/3 of a SwiGLU's cost at the same h).
        hidden_act (`str`, defaults to `"gelu"`): the plain MLP's activation, a name of transformers' `ACT2FN`.
        patch_size (`int`, defaults to 16): side of the square patches.
        num_channels (`int`, defaults to 3): input channels.
        image_size (`int`, defaults to 256): training resolution; the model runs at any multiple of `patch_size`.
        position_embedding_grid (`int`, *optional*): if set, a learned absolute position table of this many patches
            per side is added to the patch tokens, resized bicubically to other grids as DINOv2 resizes its own (a
            copy of a DINOv2 teacher's positions, `veca_from_teacher`); `None` (the paper's): RoPE places tokens alone.
        position_embedding_antialias (`bool`, defaults to `False`): antialias that resize. transformers'
            `Dinov2WithRegistersModel` does, `Dinov2Model` does not; `veca_from_teacher` follows its teacher.
        num_cores (`int`, defaults to 64): size of the core bank, the largest usable budget.
        default_num_cores (`int`, *optional*): the budget of a call that gives no `num_cores` (and of pipelines);
            1..`num_cores`, `None` for the whole bank. Set it at load time:
            `from_pretrained(..., default_num_cores=16)` or `pipeline(..., model_kwargs={"default_num_cores": 16})`.
        default_max_gflops (`float`, *optional*): instead of `default_num_cores`, a default target: calls that give no
            budget use the largest of `training_budgets` whose analytic GFLOPs per image fit, at each call's size.
        training_budgets (`list[int]`, *optional*): core budgets sampled by nested dropout during distillation;
            defaults to eight even steps up to `num_cores` ((8, 16, ..., 64) for a bank of 64).
        training_budget_weights (`list[float]`, *optional*): their relative sampling weights; defaults to
            (1, 1, 2, 2, 3, 3, 4, 4) as in the reference.
        rope_theta (`float`, defaults to 100.0): RoPE base; periods are `rope_theta ** (2i / (head_dim / 2))`.
        rope_zero_fraction (`float`, defaults to 0.125): fraction of the frequencies per axis set to zero (never
            rotated), `round(fraction * head_dim / 4)` of them.
        rope_zero_from (`str`, defaults to `"low"`): which end of the spectrum is zeroed, `"low"` (longest periods,
            the reference default) or `"high"` (shortest periods, a variant of the reference code).
        pos_embed_shift (`float`, defaults to 0.08): training-time uniform shift of patch coordinates, per axis.
        pos_embed_rescale (`float`, defaults to 2.0): training-time log-uniform rescale of patch coordinates in
            `[1/rescale, rescale]`. `None` or 0 turn either augmentation off.
        coordinate_head_init (`float`, defaults to 0.01): initial step size `alpha_l` of each coordinate head.
        core_coordinate_init_range (`float`, defaults to 0.95): core coordinates start inside `[-r, r]^2`.
        core_coordinate_init_candidates (`int`, defaults to 1000): candidate points for farthest-point sampling.
        core_coordinate_init_seed (`int`, defaults to 0): seed of those candidates.
        patch_embedding_norm (`bool`, defaults to `False`): a LayerNorm on the patch tokens right after the patch
            embedding (the reference's `patch_embed_use_ln`).
        layer_norm_eps (`float`, defaults to 1e-6): epsilon of every LayerNorm. Checkpoints converted from the
            reference code use 1e-5, PyTorch's default, as the reference does.
        hidden_dropout_prob (`float`, defaults to 0.0): dropout after the attention and MLP projections.
        attention_dropout (`float`, defaults to 0.0): dropout on attention probabilities.
        drop_path_rate (`float`, defaults to 0.0): stochastic depth rate.
        qkv_bias (`bool`, defaults to `True`): bias on the query, key and value projections.
        output_projection_size (`int`, *optional*): if set, a final Linear maps the normalised tokens to this width
            (used when distilling into a teacher of another width).
        initializer_range (`float`, defaults to 0.02): std of the truncated normal init of linear layers.
        out_features / out_indices: stages returned by [`VecaBackbone`] ("stem", "stage1", ...).
        apply_layernorm (`bool`, defaults to `True`): normalise the backbone feature maps with the final norm.
        reshape_hidden_states (`bool`, defaults to `True`): backbone returns (B, D, Hp, Wp) maps, else (B, N, D).
        chunk_size_feed_forward (`int`, defaults to 0): the MLP runs over chunks of this many tokens (0: all at
            once); the result is the same and peak memory at high resolution lower. `optimize_for_cpu` sets 1024.
    """

    model_type = "veca"

    def __init__(
        self,
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=2048,  # the transformer
        mlp_type="swiglu", hidden_act="gelu",  # its MLP
        patch_size=16, num_channels=3, image_size=256,  # the input
        position_embedding_grid=None, position_embedding_antialias=False,  # learned absolute positions (off)
        num_cores=64, default_num_cores=None, default_max_gflops=None,  # the core bank and the default budget
        training_budgets=None, training_budget_weights=None,  # nested dropout
        rope_theta=100.0, rope_zero_fraction=0.125, rope_zero_from="low",  # 2D axial RoPE
        pos_embed_shift=0.08, pos_embed_rescale=2.0,  # its training-time augmentation
        coordinate_head_init=0.01, core_coordinate_init_range=0.95, core_coordinate_init_candidates=1000,
        core_coordinate_init_seed=0,  # the cores' coordinates
        patch_embedding_norm=False, layer_norm_eps=1e-6, hidden_dropout_prob=0.0, attention_dropout=0.0,
        drop_path_rate=0.0, qkv_bias=True, output_projection_size=None, initializer_range=0.02,
        out_features=None, out_indices=None, apply_layernorm=True, reshape_hidden_states=True,  # the backbone
        **kwargs,
    ):
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.mlp_type = mlp_type
        self.hidden_act = hidden_act
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.image_size = image_size
        self.position_embedding_grid = position_embedding_grid
        self.position_embedding_antialias = position_embedding_antialias
        self.num_cores = num_cores
        self.default_num_cores = default_num_cores
        self.default_max_gflops = default_max_gflops
        self.training_budgets, self.training_budget_weights = training_schedule(
            num_cores, training_budgets, training_budget_weights
        )
        self.rope_theta = rope_theta
        self.rope_zero_fraction = rope_zero_fraction
        self.rope_zero_from = rope_zero_from
        self.pos_embed_shift = pos_embed_shift
        self.pos_embed_rescale = pos_embed_rescale
        self.coordinate_head_init = coordinate_head_init
        self.core_coordinate_init_range = core_coordinate_init_range
        self.core_coordinate_init_candidates = core_coordinate_init_candidates
        self.core_coordinate_init_seed = core_coordinate_init_seed
        self.patch_embedding_norm = patch_embedding_norm
        self.layer_norm_eps = layer_norm_eps
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_dropout = attention_dropout
        self.drop_path_rate = drop_path_rate
        self.qkv_bias = qkv_bias
        self.output_projection_size = output_projection_size
        self.initializer_range = initializer_range
        self.apply_layernorm = apply_layernorm
        self.reshape_hidden_states = reshape_hidden_states
        kwargs = self.checked_with_stages(kwargs, out_features, out_indices)
        super().__init__(**kwargs)
        chunk = self.chunk_size_feed_forward
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
            raise ValueError(f"chunk_size_feed_forward must be an int >= 0 (tokens per MLP chunk, 0: no chunks), got "
                             f"{chunk!r}.")

    def checked_with_stages(self, kwargs: dict, out_features, out_indices) -> dict:
        """The end of `__init__` before transformers' own: the fields checked (`validate_fields`), the backbone's
        stages set, and the `kwargs` for `PreTrainedConfig.__init__`, with the hub code fields when the class is
        registered for the Auto classes (saving then copies the hub files these name)."""
        if self._auto_class is not None:
            kwargs = hub_code_fields(kwargs)
        self.validate_fields()  # before the stage names, whose errors would hide a bad num_hidden_layers
        self.stage_names = ["stem"] + [f"stage{i}" for i in range(1, self.num_hidden_layers + 1)]
        self.set_output_features_output_indices(out_indices=out_indices, out_features=out_features)
        return kwargs

    def validate(self):
        """transformers' checks of a config (`PreTrainedConfig.validate`, which `save_pretrained` runs), then this
        model's (`validate_fields`), so that a field changed after construction is checked again on saving."""
        parent = getattr(super(), "validate", None)  # a transformers 5 release before strict configs has none
        if parent is not None:
            parent()
        self.validate_fields()

    def validate_fields(self):
        """A ValueError naming the first field out of range. Run on construction, by the model on `__init__` (as
        `from_pretrained(..., field=value)` sets fields after the config was built) and on saving (`validate`)."""
        check_fields(
            self,
            positive_ints=("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "patch_size",
                           "num_channels", "image_size", "num_cores", "core_coordinate_init_candidates"),
            positive_numbers=("rope_theta", "layer_norm_eps"),
            probabilities=("hidden_dropout_prob", "attention_dropout", "drop_path_rate"),
        )
        if self.num_cores > MAX_CORES:
            raise ValueError(
                f"num_cores={self.num_cores} (the core bank size) is out of range: choose 1..{MAX_CORES} (the paper uses 64)."
            )
        if not 0 < self.core_coordinate_init_range < 1:
            raise ValueError(
                f"core_coordinate_init_range must lie in (0, 1) (core coordinates live in (-1, 1)), got "
                f"{self.core_coordinate_init_range!r}."
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({self.num_attention_heads})."
            )
        if (self.hidden_size // self.num_attention_heads) % 4:
            raise ValueError(
                f"The head dimension hidden_size / num_attention_heads = {self.hidden_size // self.num_attention_heads} "
                "must be divisible by 4 for 2D axial RoPE; change hidden_size or num_attention_heads."
            )
        if self.rope_zero_from not in ("low", "high"):
            raise ValueError(f'rope_zero_from must be "low" or "high", got {self.rope_zero_from!r}.')
        if not 0 <= self.rope_zero_fraction <= 1:
            raise ValueError(f"rope_zero_fraction must lie in [0, 1], got {self.rope_zero_fraction}.")
        default = self.default_num_cores
        if default is not None and (isinstance(default, bool) or not isinstance(default, int) or not 1 <= default <= self.num_cores):
            raise ValueError(
                f"default_num_cores={default!r} is out of range: this model's core bank holds {self.num_cores} cores, "
                f"so choose 1..{self.num_cores} (None uses all of them)."
            )
        bad = [c for c in self.training_budgets if not 1 <= c <= self.num_cores]
        if bad:
            raise ValueError(f"training_budgets {bad} lie outside 1..num_cores={self.num_cores}: choose core counts the "
                             "bank holds.")
        if len(self.training_budgets) != len(self.training_budget_weights):
            raise ValueError(
                f"training_budgets ({len(self.training_budgets)} values) and training_budget_weights "
                f"({len(self.training_budget_weights)} values) must have the same length: give one weight per budget."
            )
        check_target_fields(self, "default_num_cores")
        check_mlp_and_positions(self)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> "VecaConfig":
        """As `PreTrainedConfig.from_dict` (which `from_pretrained` calls), refusing a `num_cores` that differs from
        the saved one: it is the size of a trained bank, not a budget; the budget's load-time default is
        `default_num_cores`."""
        saved, asked = config_dict.get("num_cores"), kwargs.get("num_cores")
        if saved is not None and asked is not None and asked != saved:
            raise ValueError(
                f"num_cores={asked!r} would resize this checkpoint's trained bank of {saved} cores; to use {asked} "
                f"cores by default pass default_num_cores={asked} instead (or num_cores={asked} per call: "
                f"model(pixel_values, num_cores={asked}))."
            )
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_preset(cls, name: str, **kwargs) -> "VecaConfig":
        """A reference size ("small", "splus", "base", "large"); keyword arguments override any field."""
        if name not in VECA_PRESETS:
            raise ValueError(f"Unknown VECA preset {name!r}; choose one of {sorted(VECA_PRESETS)}.")
        return cls(**{**VECA_PRESETS[name], **kwargs})


def training_schedule(num_cores: int, budgets, weights) -> tuple[list, list]:
    """The nested-dropout budgets and their weights, as given or the reference schedule scaled to the bank: eight
    even steps, later (larger) budgets drawn more often."""
    if budgets is None:
        step = max(1, num_cores // 8)
        budgets = sorted(set(range(step, num_cores + 1, step)) | {num_cores})
    if weights is None:
        weights = [i // 2 + 1 for i in range(len(budgets))]
    return list(budgets), list(weights)


def check_fields(config, positive_ints=(), positive_numbers=(), probabilities=()) -> None:
    """Raises a ValueError naming the first field outside its range: ints >= 1, finite numbers > 0, rates in [0, 1)."""
    for name in positive_ints:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
    for name in positive_numbers:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
    for name in probabilities:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"{name} must lie in [0, 1), got {value!r}.")


def check_mlp_and_positions(config: VecaConfig) -> None:
    """The MLP's kind and activation, and the optional absolute position table's side and resize."""
    if config.mlp_type not in ("swiglu", "plain"):
        raise ValueError(f'mlp_type must be "swiglu" (the paper\'s) or "plain" (Linear-act-Linear, DINOv2\'s), got '
                         f"{config.mlp_type!r}.")
    check_activations(config, "hidden_act")
    grid = config.position_embedding_grid
    if grid is not None and (isinstance(grid, bool) or not isinstance(grid, int) or grid < 1):
        raise ValueError(f"position_embedding_grid must be None (no absolute positions) or an int >= 1 (patches per "
                         f"side of the table), got {grid!r}.")
    if not isinstance(config.position_embedding_antialias, bool):
        raise ValueError(f"position_embedding_antialias must be True or False, got "
                         f"{config.position_embedding_antialias!r}.")


def check_activations(config, *names: str) -> None:
    """A ValueError naming the first of the fields `names` that is not an activation of transformers' `ACT2FN`."""
    for name in names:
        if getattr(config, name) not in ACTIVATIONS:
            raise ValueError(f"{name}={getattr(config, name)!r} is not an activation of transformers' ACT2FN; use e.g. "
                             "'gelu' (exact, DINOv2's and DINOv3's) or 'gelu_pytorch_tanh' (tanh approximation).")


def hub_code_fields(kwargs: dict) -> dict:
    """`kwargs` with `auto_map` naming the hub code of every head (`AUTO_MAP`) and `custom_pipelines` the budget-aware
    pipeline (`PIPELINE`), so that a saved checkpoint loads with each Auto class and with
    `pipeline("image-feature-extraction", model=..., trust_remote_code=True)`: transformers' save maps the saved class
    only. What `kwargs` hold wins. Built anew per call: `pipeline()` rewrites the entry it reads."""
    pipeline = {"impl": PIPELINE, "pt": ["AutoModel"], "type": "image"}
    return {
        **kwargs,
        "auto_map": {**AUTO_MAP, **(kwargs.get("auto_map") or {})},
        "custom_pipelines": {"image-feature-extraction": pipeline, **(kwargs.get("custom_pipelines") or {})},
    }


def check_target_fields(config, default_budget: str) -> None:
    """`default_max_gflops`: None or a finite number > 0, not together with the default budget field it would
    contradict."""
    target = config.default_max_gflops
    if target is not None and (
        isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < float("inf")
    ):
        raise ValueError(f"default_max_gflops must be a finite number > 0 (GFLOPs per image) or None, got {target!r}.")
    if target is not None and getattr(config, default_budget) is not None:
        raise ValueError(
            f"{default_budget}={getattr(config, default_budget)!r} and default_max_gflops={target!r} are both set: "
            "keep one default (a budget, or a target that picks it)."
        )


__all__ = ["VecaConfig", "VECA_PRESETS", "swiglu_intermediate_size"]
