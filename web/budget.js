// k for a fraction of the grid, as the model and its graph compute it (corevision_hf's kept_for_ratio):
// floor(ratio * patches + 1e-7 * patches), i.e. floor(ratio * patches) exact for decimal ratios (0.29 of 100 patches
// keeps 29; the float product is 28.999...), clamped to [1, patches]. The same float64 expression in the same order
// as in PyTorch and ONNX: the same k.
export const RATIO_TOLERANCE = 1e-7;

export function keptForRatio(ratio, patches) {
  return Math.min(patches, Math.max(1, Math.floor(ratio * patches + RATIO_TOLERANCE * patches)));
}
