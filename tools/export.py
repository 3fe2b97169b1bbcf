"""Export a checkpoint for deployment: weights-only safetensors (config and classes kept) and/or ONNX.

    python tools/export.py CHECKPOINT [--safetensors OUT.safetensors] [--onnx OUT.onnx]

CHECKPOINT is a wsss checkpoint (.pth) or an earlier --safetensors export.

--safetensors writes the model's tensors with the resolved config, classes, mean/std in the metadata (no
optimiser state, no pickle); every tool that needs only the model reads it like a checkpoint (tools/infer.py,
tools/test.py, tools/eval_cams.py, this tool's --onnx, Segmenter.from_checkpoint); resuming a run needs the .pth.
--onnx writes the single-scale segmentation model: input 'image' (B, 3, H, W) float32 normalised with the
mean/std in its metadata, outputs 'seg' (B, C, H, W) logits and 'cls' (B, C-1); B, H and W are dynamic.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wsss.utils.startup import add_threads_argument, apply_threads, input_error, refuse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a wsss checkpoint (.pth) or a --safetensors export")
    parser.add_argument("--safetensors", type=Path, metavar="OUT", help="weights-only export with config and classes")
    parser.add_argument("--onnx", type=Path, metavar="OUT", help="ONNX model, dynamic batch, height and width")
    add_threads_argument(parser)
    args = parser.parse_args(argv)
    if not (args.safetensors or args.onnx):
        parser.error("give --safetensors OUT and/or --onnx OUT")
    # --help, usage errors and missing files come at once, before torch is imported
    if error := input_error({"checkpoint": args.checkpoint}):
        return refuse(error)
    apply_threads(args.threads)  # the ONNX export traces the model

    from wsss.inference.exports.deploy import export_onnx, save_safetensors
    from wsss.model_file import checked_model_config, read_model_file

    try:
        ckpt = read_model_file(args.checkpoint)
        checked_model_config(ckpt, args.checkpoint)  # an export of a checkpoint no model can be rebuilt from is refused
        if args.safetensors:
            save_safetensors(ckpt, args.safetensors)
            print(f"wrote {args.safetensors}")
        if args.onnx:
            export_onnx(ckpt, args.onnx)
            print(f"wrote {args.onnx}")
    except (OSError, ValueError, ImportError) as err:  # OSError: an export not written (a full disk), named
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
