"""LookWhere configuration. Hub-copied: imports only transformers (no torch: a configuration is data)."""

from typing import TYPE_CHECKING

from transformers import PreTrainedConfig
from transformers.backbone_utils import BackboneConfigMixin


if TYPE_CHECKING:  # never run (the pipeline imports torch): a relative import has save_pretrained copy its file
    from .pipeline_lookwhere import LookWhereImageFeatureExtractionPipeline  # noqa: F401

# The budget-aware pipeline that `hub_code_fields` names in `custom_pipelines`.
PIPELINE = "pipeline_lookwhere.LookWhereImageFeatureExtractionPipeline"

# The names of transformers' activations (`transformers.activations.ACT2FN`, transformers 5.25), written out because
# importing ACT2FN imports torch; tests/test_config_validation.py holds them equal to ACT2FN's keys.
ACTIVATIONS = (
    "gelu", "gelu_10", "gelu_fast", "gelu_new", "gelu_python", "gelu_pytorch_tanh", "gelu_python_tanh", "gelu_accurate",
    "hardswish", "laplace", "leaky_relu", "linear", "mish", "quick_gelu", "relu", "relu2", "relu6", "sigmoid", "silu",
    "sqrtsoftplus", "swish", "tanh", "prelu", "xielu",
)


# ViT-S/14 and ViT-B/14 widths of DINOv2 with registers, the teachers of the paper.
LOOKWHERE_PRESETS = {
    "small": dict(hidden_size=384, num_attention_heads=6, intermediate_size=1536),
    "base": dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072),
}

# Where the extractor's global tokens come from (`extractor_prefix`).
EXTRACTOR_PREFIXES = ("selector", "extractor")


# Hub code for every head (`hub_code_fields`).
AUTO_MAP = {
    "AutoConfig": "configuration_lookwhere.LookWhereConfig",
    "AutoModel": "modeling_lookwhere.LookWhereModel",
    "AutoModelForImageClassification": "modeling_lookwhere.LookWhereForImageClassification",
    "AutoModelForSemanticSegmentation": "modeling_lookwhere.LookWhereForSemanticSegmentation",
    "AutoBackbone": "modeling_lookwhere.LookWhereBackbone",
}


class LookWhereConfig(BackboneConfigMixin, PreTrainedConfig):
    r"""
    Configuration of a LookWhere model: a shallow *selector* looks at a low-resolution copy of the image and
    picks the top-k informative patches; an *extractor* runs only on those high-resolution patches, reusing the
    selector's global tokens. Selector and extractor share one ViT architecture (DINOv2 with registers).

    Args:
        hidden_size (`int`, defaults to 768): token width.
        num_hidden_layers (`int`, defaults to 12): extractor depth.
        num_attention_heads (`int`, defaults to 12): attention heads.
        intermediate_size (`int`, defaults to 3072): MLP hidden size.
        hidden_act (`str`, defaults to "gelu"): MLP activation (of the plain MLP; the SwiGLU MLP uses SiLU), a name of
            transformers' `ACT2FN`: "gelu" (exact, DINOv2 and the released LookWhere) or "gelu_pytorch_tanh" (the tanh
            approximation, flax's `nn.gelu`, which the authors' JAX pretraining uses).
        use_swiglu_ffn (`bool`, defaults to `False`): a packed SwiGLU MLP (fc1: D -> 2h, `silu(u) * v`, fc2: h -> D,
            h = `intermediate_size`), as in the Franca-based LookWhere, instead of Linear-act-Linear.
        patch_size (`int`, defaults to 14): side of the square patches.
        num_channels (`int`, defaults to 3): input channels.
        num_register_tokens (`int`, defaults to 4): register tokens next to CLS (0: CLS alone is handed over).
        layerscale_value (`float`, defaults to 1.0): initial LayerScale.
        layer_norm_eps (`float`, defaults to 1e-6): LayerNorm epsilon (DINOv2's; the authors' JAX pretraining: 1e-5).
        qkv_bias (`bool`, defaults to `True`): bias on the q/k/v projection.
        image_size (`int`, defaults to 518): high-resolution training size; the extractor's position table is
            (image_size / patch_size)^2 and is resized bicubically for other sizes.
        interpolate_antialias (`bool`, defaults to `False`): antialias that bicubic resize. transformers'
            `Dinov2WithRegistersModel` does, `Dinov2Model` does not; `lookwhere_from_teacher` follows its teacher.
        selector_depth (`int`, defaults to 3): selector blocks (the teacher's first blocks).
        selector_image_size (`int`, defaults to 154): side of the low-resolution copy the selector sees.
        selector_antialias (`bool`, defaults to `True`): antialias the bilinear downsampling to that copy, as the
            authors' pretraining did and our distillation does. Their released PyTorch inference code does not, so
            checkpoints converted from it set `False`.
        map_head_ratio (`int`, defaults to 4): hidden width of the selector's map head, in multiples of hidden_size.
        map_head_act (`str`, defaults to "gelu"): the map head's activation, as `hidden_act` ("gelu_pytorch_tanh" in
            the authors' JAX pretraining, "gelu" in their released inference code).
        selector_map_antialias (`bool`, defaults to `False`): antialias the bilinear resize of the selector map to the
            extractor's grid when it shrinks (44 -> 37 cells at 518 px), as the authors' JAX pretraining does
            (`jax.image.resize`); their released PyTorch inference code does not, nor do checkpoints converted from it.
        extractor_prefix (`str`, defaults to "selector"): the global tokens the extractor's kept patches attend to.
            "selector": the selector's CLS and registers, handed over (the method's design). "extractor": the
            extractor's own learned CLS and registers (`extractor.prefix_tokens`), as the
            dense teacher's are, so that `lookwhere_from_teacher`'s extractor keeping every patch is the teacher
            itself; the selector then only scores patches. Not the paper's; docs/tasks.md shows where it reads better.
        k_ratio (`float`, defaults to 0.1): default fraction of the high-resolution grid kept.
        default_k (`int`, *optional*): default number of patches kept per image, whatever its size; when set it wins
            over `k_ratio` for calls that give neither `k` nor `k_ratio`. Set either at load time:
            `from_pretrained(..., default_k=64)` or `pipeline(..., model_kwargs={"k_ratio": 0.2})`.
        default_max_gflops (`float`, *optional*): a default target instead: calls that give no budget keep the largest k
            whose analytic GFLOPs per image fit, at each call's size; wins over `k_ratio`, exclusive with `default_k`.
        default_k_mass (`float`, *optional*): a per-image default instead: calls that give no budget keep, in each image,
            the fewest patches whose softmax(selector_map) mass reaches it (forward's `k_mass`); in (0, 1], wins over
            `k_ratio`, exclusive with `default_k` and `default_max_gflops`.
        num_fill_neighbors (`int`, defaults to 5): kept cells averaged (inverse distance) for each unkept cell.
        freeze_selector (`bool`, defaults to `True`): task heads keep the selector frozen while fine-tuning.
        out_features / out_indices: stages returned by [`LookWhereBackbone`] ("stem", "stage1", ...), on the filled grid.
        apply_layernorm (`bool`, defaults to `True`): normalise the backbone feature maps with the final norm.
        reshape_hidden_states (`bool`, defaults to `True`): backbone returns (B, D, Hp, Wp) maps, else (B, N, D).
        semantic_loss_ignore_index (`int`, defaults to 255): label ignored by the segmentation loss.
        hidden_dropout_prob, attention_dropout, drop_path_rate (`float`, default 0.0): regularisation.
        initializer_range (`float`, defaults to 0.02): std of the truncated normal init of linear layers.
    """

    model_type = "lookwhere"

    def __init__(
        self,
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,  # the transformer
        hidden_act="gelu", use_swiglu_ffn=False, patch_size=14, num_channels=3, num_register_tokens=4,
        layerscale_value=1.0, layer_norm_eps=1e-6, qkv_bias=True,
        image_size=518, interpolate_antialias=False,  # the extractor's position table
        selector_depth=3, selector_image_size=154, selector_antialias=True,  # the selector
        map_head_ratio=4, map_head_act="gelu", selector_map_antialias=False,  # its map head
        extractor_prefix="selector",  # the extractor's global tokens
        k_ratio=0.1, default_k=None, default_max_gflops=None, default_k_mass=None,  # the default budget
        num_fill_neighbors=5, freeze_selector=True, semantic_loss_ignore_index=255,  # fill, fine-tuning
        hidden_dropout_prob=0.0, attention_dropout=0.0, drop_path_rate=0.0, initializer_range=0.02,
        out_features=None, out_indices=None, apply_layernorm=True, reshape_hidden_states=True,  # the backbone
        **kwargs,
    ):
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.use_swiglu_ffn = use_swiglu_ffn
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.num_register_tokens = num_register_tokens
        self.layerscale_value = layerscale_value
        self.layer_norm_eps = layer_norm_eps
        self.qkv_bias = qkv_bias
        self.image_size = image_size
        self.interpolate_antialias = interpolate_antialias
        self.selector_depth = selector_depth
        self.selector_image_size = selector_image_size
        self.selector_antialias = selector_antialias
        self.map_head_ratio = map_head_ratio
        self.map_head_act = map_head_act
        self.selector_map_antialias = selector_map_antialias
        self.extractor_prefix = extractor_prefix
        self.k_ratio = k_ratio
        self.default_k = default_k
        self.default_max_gflops = default_max_gflops
        self.default_k_mass = default_k_mass
        self.num_fill_neighbors = num_fill_neighbors
        self.freeze_selector = freeze_selector
        self.semantic_loss_ignore_index = semantic_loss_ignore_index
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_dropout = attention_dropout
        self.drop_path_rate = drop_path_rate
        self.initializer_range = initializer_range
        self.apply_layernorm = apply_layernorm
        self.reshape_hidden_states = reshape_hidden_states
        kwargs = self.checked_with_stages(kwargs, out_features, out_indices)
        super().__init__(**kwargs)

    # Copied from corevision_hf.veca.configuration_veca.VecaConfig.checked_with_stages
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

    # Copied from corevision_hf.veca.configuration_veca.VecaConfig.validate
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
                           "num_channels", "image_size", "selector_image_size", "selector_depth", "map_head_ratio",
                           "num_fill_neighbors"),
            positive_numbers=("layer_norm_eps",),
            probabilities=("hidden_dropout_prob", "attention_dropout", "drop_path_rate"),
        )
        check_activations(self, "hidden_act", "map_head_act")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads ({self.num_attention_heads})."
            )
        for name in ("image_size", "selector_image_size"):
            if getattr(self, name) % self.patch_size:
                raise ValueError(f"{name} ({getattr(self, name)}) must be a multiple of patch_size ({self.patch_size}).")
        if self.extractor_prefix not in EXTRACTOR_PREFIXES:
            raise ValueError(f"extractor_prefix={self.extractor_prefix!r} is not one of {EXTRACTOR_PREFIXES}: "
                             "'selector' hands the selector's global tokens over, 'extractor' uses the extractor's own.")
        if self.num_register_tokens < 0:
            raise ValueError(f"num_register_tokens must be >= 0, got {self.num_register_tokens}.")
        if isinstance(self.k_ratio, bool) or not isinstance(self.k_ratio, (int, float)) or not 0 < self.k_ratio <= 1:
            raise ValueError(f"k_ratio must lie in (0, 1], got {self.k_ratio!r}.")
        default = self.default_k
        if default is not None and (isinstance(default, bool) or not isinstance(default, int) or default < 1):
            raise ValueError(f"default_k must be a number of patches >= 1 (or None to use k_ratio), got {default!r}.")
        if not 1 <= self.selector_depth <= self.num_hidden_layers:
            raise ValueError(f"selector_depth must lie in 1..num_hidden_layers, got {self.selector_depth}.")
        check_target_fields(self, "default_k")
        mass = self.default_k_mass
        if mass is not None and (isinstance(mass, bool) or not isinstance(mass, (int, float)) or not 0 < mass <= 1):
            raise ValueError(f"default_k_mass must lie in (0, 1] (a share of the selector's softmax mass) or be None, "
                             f"got {mass!r}.")
        for other in ("default_k", "default_max_gflops"):
            if mass is not None and getattr(self, other) is not None:
                raise ValueError(f"default_k_mass={mass!r} and {other}={getattr(self, other)!r} are both set: keep one "
                                 "default budget.")

    @property
    def grid_size(self) -> int:
        """Patches per side of the extractor's position table (37 at 518 px, patch 14)."""
        return self.image_size // self.patch_size

    @property
    def selector_grid_size(self) -> int:
        """Patches per side of the selector's low-resolution grid (11 at 154 px)."""
        return self.selector_image_size // self.patch_size

    @property
    def map_upsampling(self) -> int:
        """Map-head cells per selector patch and side, m = ceil(grid / selector grid) (4 for 37 / 11)."""
        return -(-self.grid_size // self.selector_grid_size)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> "LookWhereConfig":
        """As `PreTrainedConfig.from_dict` (which `from_pretrained` calls), refusing `k`: it is a per-call argument;
        its load-time default is `default_k`."""
        if "k" in kwargs:
            raise ValueError(
                f"k={kwargs['k']!r} is an argument of each call (model(pixel_values, k=...)), not of loading; to keep "
                f"{kwargs['k']!r} patches by default pass default_k={kwargs['k']!r} instead (or k_ratio=... for a "
                "fraction)."
            )
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def from_preset(cls, name: str, **kwargs) -> "LookWhereConfig":
        """A reference width ("small" = ViT-S/14, "base" = ViT-B/14); keyword arguments override any field."""
        if name not in LOOKWHERE_PRESETS:
            raise ValueError(f"Unknown LookWhere preset {name!r}; choose one of {sorted(LOOKWHERE_PRESETS)}.")
        return cls(**{**LOOKWHERE_PRESETS[name], **kwargs})


# Copied from corevision_hf.veca.configuration_veca.check_fields
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


# Copied from corevision_hf.veca.configuration_veca.check_activations
def check_activations(config, *names: str) -> None:
    """A ValueError naming the first of the fields `names` that is not an activation of transformers' `ACT2FN`."""
    for name in names:
        if getattr(config, name) not in ACTIVATIONS:
            raise ValueError(f"{name}={getattr(config, name)!r} is not an activation of transformers' ACT2FN; use e.g. "
                             "'gelu' (exact, DINOv2's and DINOv3's) or 'gelu_pytorch_tanh' (tanh approximation).")


# Copied from corevision_hf.veca.configuration_veca.hub_code_fields
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


# Copied from corevision_hf.veca.configuration_veca.check_target_fields
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


__all__ = ["LookWhereConfig", "LOOKWHERE_PRESETS"]
