"""Contender: timm's `VisionTransformer` on PyTorch (CPU build on a CPU), random weights.

The model is `timm.models.vision_transformer.VisionTransformer` with the variant's sizes, i.e.
`timm.create_model("vit_base_patch16_224")` for B/16. Inference runs under
`torch.inference_mode()` in eval mode; a training step is forward, cross-entropy, zero_grad,
backward, AdamW step. bf16 is `torch.autocast`; on a GPU every step ends with a synchronize.
"""

import functools
import sys

from benchmarks.contenders import common

PRECISIONS = ("fp32", "bf16")
# torchvision ops whose fake (meta) kernels torchvision 0.28 registers even when its C++
# extension failed to load; they share this schema (torchvision/csrc/ops/nms.cpp).
_UNCONDITIONAL_TORCHVISION_OPS = ("nms", "qnms")
_NMS_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"


def import_timm():
    """Imports timm, whose import needs torchvision, also next to a torchvision that is broken.

    The index's torchvision wheels are CUDA builds: next to CPU torch their C++ ops cannot load,
    and `import torchvision` then dies with "operator torchvision::nms does not exist", because
    it registers fake kernels for nms and qnms whether or not the ops loaded. timm uses only
    torchvision's Python parts, none of them for a ViT. So where that import fails, this
    declares the two operators' schemas without kernels (calling them still fails) and imports
    again.
    """
    import torch

    try:
        import torchvision
    except RuntimeError as error:
        if "torchvision::" not in str(error) or "does not exist" not in str(error):
            raise
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        library = torch.library.Library("torchvision", "DEF")
        for op in _UNCONDITIONAL_TORCHVISION_OPS:
            library.define(op + _NMS_SCHEMA)
        import torchvision

        print(f"timm_vit: torchvision {torchvision.__version__} cannot load its C++ ops next to "
              f"torch {torch.__version__}; declared {_UNCONDITIONAL_TORCHVISION_OPS} without "
              "kernels so that its Python parts import (a ViT uses none of its ops).",
              file=sys.stderr)
        import_timm.library = library  # a Library's definitions live as long as the object
    import timm

    return timm, torchvision


def setup(args):
    import torch

    if args.device == "gpu" and not torch.cuda.is_available():
        raise RuntimeError(f"--device gpu, but torch {torch.__version__} sees no CUDA device "
                           "(install a CUDA build of torch in the benchmark environment).")
    timm, torchvision = import_timm()
    return dict(torch=torch.__version__, timm=timm.__version__,
                torchvision=torchvision.__version__, intra_op_threads=torch.get_num_threads())


def _step(args, config, training):
    """A synchronous step on one random batch: a forward pass in eval mode, or with `training`
    an AdamW step."""
    import torch
    import torch.nn.functional as F
    from timm.models.vision_transformer import VisionTransformer

    device = "cuda" if args.device == "gpu" else "cpu"
    torch.manual_seed(args.seed)
    model = VisionTransformer(
        img_size=args.image_size, patch_size=config["patch_size"],
        embed_dim=config["hidden_size"], depth=config["num_layers"],
        num_heads=config["num_heads"], mlp_ratio=config["mlp_dim"] / config["hidden_size"],
        num_classes=common.NUM_CLASSES,
    )
    model = model.to(device).train(training)
    # timm's attention runs PyTorch's fused scaled_dot_product_attention (`fused_attn`).
    model = torch.compile(model) if args.compile else model
    if training:
        optimizer = torch.optim.AdamW(model.parameters(), lr=common.LEARNING_RATE,
                                      weight_decay=common.WEIGHT_DECAY)
    images, labels = (torch.from_numpy(a).to(device) for a in common.batch_for(args, True))
    autocast = dict(device_type=device, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def step():
        with torch.inference_mode(not training), torch.autocast(**autocast):
            logits = model(images)
        if training:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(logits.float(), labels).backward()
            optimizer.step()
        if args.device == "gpu":
            torch.cuda.synchronize()

    return step


build_inference = functools.partial(_step, training=False)
build_training = functools.partial(_step, training=True)


def device_peak_bytes(args):
    """Peak GPU memory torch allocated, or None on a CPU."""
    if args.device != "gpu":
        return None
    import torch

    return int(torch.cuda.max_memory_allocated())


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
