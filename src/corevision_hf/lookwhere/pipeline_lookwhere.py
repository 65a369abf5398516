"""`pipeline("image-feature-extraction")` for LookWhere with the budget per call: `pipe(image, k_ratio=0.2)`.

Hub-copied: imports only transformers. Saved checkpoints name this class in `config.custom_pipelines`, so
`pipeline(task, model=folder_or_repo, trust_remote_code=True)` uses it; the stock pipeline drops unknown arguments.
"""

from transformers.pipelines.image_feature_extraction import ImageFeatureExtractionPipeline


class LookWhereImageFeatureExtractionPipeline(ImageFeatureExtractionPipeline):
    """The stock image feature extraction pipeline, plus the model's budget arguments, forwarded to the model."""

    budget_arguments = ("k", "k_ratio", "fill_dense", "max_gflops", "max_ms")
    pipeline_arguments = ("image_processor_kwargs", "return_tensors", "pool", "timeout")

    def _sanitize_parameters(self, **kwargs):
        unknown = set(kwargs) - set(self.budget_arguments) - set(self.pipeline_arguments)
        if unknown:
            raise ValueError(
                f"Unknown pipeline arguments {sorted(unknown)}; choose from {list(self.budget_arguments + self.pipeline_arguments)}."
            )
        forward_params = {name: kwargs.pop(name) for name in self.budget_arguments if name in kwargs}
        preprocess_params, _, postprocess_params = super()._sanitize_parameters(**kwargs)
        return preprocess_params, forward_params, postprocess_params

    def _forward(self, model_inputs, **forward_params):
        return self.model(**model_inputs, **forward_params)


__all__ = ["LookWhereImageFeatureExtractionPipeline"]
