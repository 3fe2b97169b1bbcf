"""What leaves the project: deployment files of a model (safetensors, ONNX), pseudo labels for a second stage and
the mmseg configs that train on them."""
