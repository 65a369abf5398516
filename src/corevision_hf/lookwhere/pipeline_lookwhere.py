"""`pipeline("image-feature-extraction")` for LookWhere with the budget per call: `pipe(image, k_ratio=0.2)`.

Hub-copied: imports only torch and transformers. Saved checkpoints name this class in `config.custom_pipelines`, so
`pipeline(task, model=folder_or_repo, trust_remote_code=True)` uses it; the stock pipeline drops unknown arguments.
"""

import torch
from transformers.pipelines.image_feature_extraction import ImageFeatureExtractionPipeline


class LookWhereImageFeatureExtractionPipeline(ImageFeatureExtractionPipeline):
    """The stock image feature extraction pipeline, plus the model's budget arguments, forwarded to the model, and
    batches of images of different sizes (`batch_size=`): padded with the mask the model takes, each image's
    features cropped back to its own grid (or, with `fill_dense=False`, to its own kept tokens), as it gets them
    alone."""

    budget_arguments = ("k", "k_ratio", "k_mass", "fill_dense", "max_gflops")
    pipeline_arguments = ("image_processor_kwargs", "return_tensors", "pool", "timeout")

    # Copied from corevision_hf.veca.pipeline_veca.VecaImageFeatureExtractionPipeline._sanitize_parameters
    def _sanitize_parameters(self, **kwargs):
        unknown = set(kwargs) - set(self.budget_arguments) - set(self.pipeline_arguments)
        if unknown:
            latency = (" (for a latency target, pass the budget that corevision_hf.budget_for_latency(pipe.model, "
                       "(height, width), max_ms) returns)") if "max_ms" in unknown else ""
            raise ValueError(
                f"Unknown pipeline arguments {sorted(unknown)}; choose from "
                f"{list(self.budget_arguments + self.pipeline_arguments)}{latency}."
            )
        forward_params = {name: kwargs.pop(name) for name in self.budget_arguments if name in kwargs}
        preprocess_params, _, postprocess_params = super()._sanitize_parameters(**kwargs)
        return preprocess_params, forward_params, postprocess_params

    # Copied from corevision_hf.veca.pipeline_veca.VecaImageFeatureExtractionPipeline.get_iterator
    def get_iterator(self, inputs, num_workers, batch_size, *args, **kwargs):
        iterator = super().get_iterator(inputs, num_workers, batch_size, *args, **kwargs)
        if batch_size > 1:  # the stock collate concatenates pixel_values, which fails for different sizes
            iterator.loader.loader.collate_fn = self.collate
        return iterator

    # Copied from corevision_hf.veca.pipeline_veca.VecaImageFeatureExtractionPipeline.collate
    def collate(self, items: list[dict]) -> dict:
        return self.image_processor.pad([item["pixel_values"][0] for item in items])

    def _forward(self, model_inputs, **forward_params):
        outputs = self.model(**model_inputs, **forward_params)
        return {"last_hidden_state": outputs.last_hidden_state, "pooler_output": outputs.pooler_output,
                "pixel_mask": model_inputs.get("pixel_mask"),
                "kept_slots": None if outputs.patch_tokens is not None else outputs.selected_indices >= 0}

    def postprocess(self, model_outputs, pool=None, return_tensors=False):
        tokens, pixel_mask = model_outputs["last_hidden_state"], model_outputs["pixel_mask"]
        if pool:
            outputs = model_outputs["pooler_output"]
        elif model_outputs["kept_slots"] is not None:  # without the fill: the image's own kept tokens, in order
            kept = model_outputs["kept_slots"][0]
            prefix = tokens.shape[1] - len(kept)
            outputs = torch.cat([tokens[:, :prefix], tokens[:, prefix:][:, kept]], dim=1)
        else:
            outputs = unpadded_tokens(tokens, pixel_mask, self.model.config.patch_size)
        return outputs if return_tensors else outputs.tolist()


# Copied from corevision_hf.veca.pipeline_veca.unpadded_tokens
def unpadded_tokens(tokens: torch.Tensor, pixel_mask: torch.Tensor | None, patch_size: int) -> torch.Tensor:
    """One image's (1, prefix + Hp * Wp, D) tokens from a padded batch -> (1, prefix + hp * wp, D), the patch tokens
    of its own (hp, wp) grid alone; unchanged without a mask."""
    if pixel_mask is None:
        return tokens
    grid = (pixel_mask.shape[-2] // patch_size, pixel_mask.shape[-1] // patch_size)
    rows, columns = int(pixel_mask[0, :, 0].sum()) // patch_size, int(pixel_mask[0, 0].sum()) // patch_size
    prefix = tokens.shape[1] - grid[0] * grid[1]
    patches = tokens[:, prefix:].unflatten(1, grid)[:, :rows, :columns].flatten(1, 2)
    return torch.cat([tokens[:, :prefix], patches], dim=1)


__all__ = ["LookWhereImageFeatureExtractionPipeline"]
