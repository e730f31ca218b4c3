"""Writes checkpoints/registry.json: the official entries completed, and timm's ViT checkpoints.

    .venv-bench/bin/python checkpoints/make_registry.py           # rewrite registry.json
    .venv-bench/bin/python checkpoints/make_registry.py --survey  # what is left out, and why

Run it with timm 1.0.31 installed (`bash benchmarks/setup_peers.sh`): every timm entry is read
from timm's own pretrained configuration (`timm.models.get_pretrained_cfg`) and model (built on
the meta device: no weights are downloaded), for the names written down in `TIMM` below. The
official entries already in registry.json (the paper's and AugReg's `.npz` files, the shipped
`digits`) keep their fields; this adds what each lacks (size, ImageNet top-1 and its source,
licence, preprocessing, tags), and the output is the same on every run.

Which timm checkpoints: those of `timm.models.vision_transformer`, `vision_transformer_hybrid`
and `deit` published on the Hugging Face Hub (`hf_hub_id`) whose network keras_vit's `ViT`
builds exactly and whose Hub files keras_vit's safetensors reader loads exactly (tested in
tests/test_checkpoint_registry.py on files timm writes itself). `--survey` checks every such
timm checkpoint against that rule and prints the reason for each one left out.
"""

import argparse
import importlib.util
import json
import os
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
REGISTRY = HERE / "registry.json"
TIMM_VERSION = "1.0.31"
HF = "hf://timm/"

# timm's ImageNet-1k validation top-1, from its published results: `results/results-imagenet.csv`
# of huggingface/pytorch-image-models at commit 4e5207c7 (2025-10-30), which evaluates each
# checkpoint with its own pretrained configuration (input size, crop, interpolation).
TIMM_RESULTS = ("timm results/results-imagenet.csv (huggingface/pytorch-image-models@4e5207c7), "
                "evaluated by timm at its {name} preprocessing")
# The same table at commit c16d65a8 (2021-05-11), when timm's names without a tag held the
# official files converted from the vit_jax release (`jx_vit_*.pth`, "weights from official
# Google JAX impl").
TIMM_RESULTS_2021 = ("timm results/results-imagenet.csv (huggingface/pytorch-image-models"
                     "@c16d65a8), timm's evaluation of the same official file converted "
                     "(timm name {name}, bicubic, crop_pct {crop})")
VIT_JAX_README = ("vit_jax README (google-research/vision_transformer, changelog 2020-10-29: "
                  "\"expected to achieve 81.2% and 82.7% top-1\")")
AUGREG_README = "vit_jax README, recommended AugReg checkpoints table"

# The timm checkpoints registered, by family: (timm name, family tag). Each is published as
# hf://timm/<name> and loads exactly (see the module docstring).
TIMM = [
    # AugReg ("How to train your ViT?", Steiner et al. 2021): the vit_jax augreg/ files.
    *[(f"vit_{size}_patch{patch}_{res}.augreg_in21k_ft_in1k", "augreg") for size, patch, res in (
        ("tiny", 16, 224), ("tiny", 16, 384), ("small", 32, 224), ("small", 32, 384),
        ("small", 16, 224), ("small", 16, 384), ("base", 32, 224), ("base", 32, 384),
        ("base", 16, 224), ("base", 16, 384), ("base", 8, 224), ("large", 16, 224),
        ("large", 16, 384))],
    *[(f"vit_{size}_patch{patch}_224.augreg_in21k", "augreg") for size, patch in (
        ("tiny", 16), ("small", 32), ("small", 16), ("base", 32), ("base", 16), ("base", 8),
        ("large", 16))],
    *[(f"vit_{size}_patch{patch}_{res}.augreg_in1k", "augreg") for size, patch, res in (
        ("small", 16, 224), ("small", 16, 384), ("base", 32, 224), ("base", 32, 384),
        ("base", 16, 224), ("base", 16, 384))],
    # AugReg weights fine-tuned again on ImageNet-1k by timm.
    ("vit_base_patch16_224.augreg2_in21k_ft_in1k", "augreg2"),
    ("vit_base_patch8_224.augreg2_in21k_ft_in1k", "augreg2"),
    # The paper's own release (vit_jax imagenet21k/ and imagenet21k+imagenet2012/), converted.
    ("vit_base_patch16_224.orig_in21k_ft_in1k", "orig"),
    ("vit_base_patch16_384.orig_in21k_ft_in1k", "orig"),
    ("vit_large_patch32_384.orig_in21k_ft_in1k", "orig"),
    ("vit_base_patch32_224.orig_in21k", "orig"),
    ("vit_base_patch16_224.orig_in21k", "orig"),
    ("vit_large_patch32_224.orig_in21k", "orig"),
    ("vit_large_patch16_224.orig_in21k", "orig"),
    ("vit_huge_patch14_224.orig_in21k", "orig"),
    # "When Vision Transformers Outperform ResNets..." (Chen et al. 2021): vit_jax sam/ files.
    ("vit_base_patch32_224.sam_in1k", "sam"),
    ("vit_base_patch16_224.sam_in1k", "sam"),
    # DINO (Caron et al. 2021) and MAE (He et al. 2021): self-supervised, no head.
    ("vit_small_patch16_224.dino", "dino"),
    ("vit_small_patch8_224.dino", "dino"),
    ("vit_base_patch16_224.dino", "dino"),
    ("vit_base_patch8_224.dino", "dino"),
    ("vit_base_patch16_224.mae", "mae"),
    ("vit_large_patch16_224.mae", "mae"),
    ("vit_huge_patch14_224.mae", "mae"),
    # ImageNet-21K Pretraining for the Masses (Ridnik et al. 2021): no query/key/value bias.
    ("vit_base_patch16_224_miil.in21k", "miil"),
    ("vit_base_patch16_224_miil.in21k_ft_in1k", "miil"),
    # Bamboo (Zhang et al. 2022): a 115,217-class classifier.
    ("vit_base_patch16_224.bamboo", "bamboo"),
    # DeiT (Touvron et al. 2021) without distillation.
    ("deit_tiny_patch16_224.fb_in1k", "deit"),
    ("deit_small_patch16_224.fb_in1k", "deit"),
    ("deit_base_patch16_224.fb_in1k", "deit"),
    ("deit_base_patch16_384.fb_in1k", "deit"),
    # EVA-01 (Fang et al. 2022) ViT-L/14: average pooling with fc_norm, beside a class token.
    ("eva_large_patch14_196.in22k_ft_in1k", "eva"),
    ("eva_large_patch14_196.in22k_ft_in22k_in1k", "eva"),
    ("eva_large_patch14_336.in22k_ft_in1k", "eva"),
    ("eva_large_patch14_336.in22k_ft_in22k_in1k", "eva"),
    # SigLIP image towers (Zhai et al. 2023) averaged over the tokens (no MAP head, no class
    # token), as timm's `*_siglip_gap_*` define them.
    *[(f"vit_base_patch16_siglip_gap_{res}.{tag}", "siglip") for res, tag in (
        (224, "webli"), (224, "v2_webli"), (256, "webli"), (256, "v2_webli"),
        (256, "webli_i18n"), (384, "webli"), (384, "v2_webli"), (512, "webli"),
        (512, "v2_webli"))],
    *[(f"vit_large_patch16_siglip_gap_{res}.{tag}", "siglip") for res, tag in (
        (256, "webli"), (256, "v2_webli"), (384, "webli"), (384, "v2_webli"))],
]

# What each timm tag (or "family.tag") was trained on: (pre-training, fine-tuning or None).
# ImageNet-1k is "imagenet2012" and ImageNet-21k "imagenet21k", as in the official entries.
TRAINING = {
    "augreg_in21k_ft_in1k": ("imagenet21k", "imagenet2012"),
    "augreg2_in21k_ft_in1k": ("imagenet21k", "imagenet2012"),
    "orig_in21k_ft_in1k": ("imagenet21k", "imagenet2012"),
    "augreg_in21k": ("imagenet21k", None),
    "orig_in21k": ("imagenet21k", None),
    "augreg_in1k": ("imagenet2012", None),
    "sam_in1k": ("imagenet2012 (SAM optimizer)", None),
    "dino": ("imagenet2012 (DINO, self-supervised, no labels)", None),
    "mae": ("imagenet2012 (MAE, self-supervised, no labels)", None),
    "miil.in21k": ("imagenet21k (MIIL's winter 2021 release, 11,221 classes)", None),
    "miil.in21k_ft_in1k": ("imagenet21k (MIIL's winter 2021 release, 11,221 classes)",
                           "imagenet2012"),
    "bamboo": ("Bamboo-CLS (115,217 classes)", None),
    "fb_in1k": ("imagenet2012 (DeiT recipe)", None),
    "in22k_ft_in1k": ("Merged-30M (EVA MIM) -> imagenet21k", "imagenet2012"),
    "in22k_ft_in22k_in1k": ("Merged-30M (EVA MIM) -> imagenet21k", "imagenet2012"),
    "webli": ("WebLI (SigLIP, image-text)", None),
    "v2_webli": ("WebLI (SigLIP 2, image-text)", None),
    "webli_i18n": ("WebLI multilingual (SigLIP, image-text)", None),
}
LABELS = {1000: "imagenet2012", 21843: "imagenet21k"}  # keras_vit.labels.LABEL_SETS

# Top-1 of the official ImageNet fine-tunes that the registry had without one: (value, source).
OFFICIAL_TOP1 = {
    "imagenet21k+imagenet2012/ViT-B_16-224": (81.2, VIT_JAX_README),
    "imagenet21k+imagenet2012/ViT-L_16-224": (82.7, VIT_JAX_README),
    "imagenet21k+imagenet2012/ViT-B_16": (84.21, TIMM_RESULTS_2021.format(
        name="vit_base_patch16_384", crop="1.0")),
    "imagenet21k+imagenet2012/ViT-B_32": (81.652, TIMM_RESULTS_2021.format(
        name="vit_base_patch32_384", crop="1.0")),
    "imagenet21k+imagenet2012/ViT-L_16": (85.158, TIMM_RESULTS_2021.format(
        name="vit_large_patch16_384", crop="1.0")),
    "imagenet21k+imagenet2012/ViT-L_32": (81.506, TIMM_RESULTS_2021.format(
        name="vit_large_patch32_384", crop="1.0")),
    "imagenet21k+imagenet2012/R50+ViT-B_16": (84.972, TIMM_RESULTS_2021.format(
        name="vit_base_r50_s16_384", crop="1.0")),
}
# The AugReg 224 px fine-tunes are the files timm names `..._224.augreg_in21k_ft_in1k` (its
# pretrained configuration's `url`): their top-1 is timm's for that name.
AUGREG_224 = {"Ti_16": "vit_tiny_patch16_224", "S_16": "vit_small_patch16_224",
              "S_32": "vit_small_patch32_224", "B_16": "vit_base_patch16_224",
              "B_32": "vit_base_patch32_224", "L_16": "vit_large_patch16_224"}

# timm's ImageNet-1k top-1 (TIMM_RESULTS) of the registered names that have an ImageNet-1k head.
TIMM_TOP1 = {
    "vit_tiny_patch16_224.augreg_in21k_ft_in1k": 75.452,
    "vit_tiny_patch16_384.augreg_in21k_ft_in1k": 78.438,
    "vit_small_patch32_224.augreg_in21k_ft_in1k": 76.010,
    "vit_small_patch32_384.augreg_in21k_ft_in1k": 80.476,
    "vit_small_patch16_224.augreg_in21k_ft_in1k": 81.402,
    "vit_small_patch16_384.augreg_in21k_ft_in1k": 83.814,
    "vit_base_patch32_224.augreg_in21k_ft_in1k": 80.732,
    "vit_base_patch32_384.augreg_in21k_ft_in1k": 83.358,
    "vit_base_patch16_224.augreg_in21k_ft_in1k": 84.534,
    "vit_base_patch16_384.augreg_in21k_ft_in1k": 86.010,
    "vit_base_patch8_224.augreg_in21k_ft_in1k": 85.838,
    "vit_large_patch16_224.augreg_in21k_ft_in1k": 85.856,
    "vit_large_patch16_384.augreg_in21k_ft_in1k": 87.096,
    "vit_small_patch16_224.augreg_in1k": 78.842,
    "vit_small_patch16_384.augreg_in1k": 81.130,
    "vit_base_patch32_224.augreg_in1k": 74.908,
    "vit_base_patch32_384.augreg_in1k": 78.750,
    "vit_base_patch16_224.augreg_in1k": 79.154,
    "vit_base_patch16_384.augreg_in1k": 81.102,
    "vit_base_patch16_224.augreg2_in21k_ft_in1k": 85.108,
    "vit_base_patch8_224.augreg2_in21k_ft_in1k": 86.252,
    "vit_base_patch16_224.orig_in21k_ft_in1k": 81.782,
    "vit_base_patch16_384.orig_in21k_ft_in1k": 84.212,
    "vit_large_patch32_384.orig_in21k_ft_in1k": 81.508,
    "vit_base_patch32_224.sam_in1k": 73.704,
    "vit_base_patch16_224.sam_in1k": 80.246,
    "vit_base_patch16_224_miil.in21k_ft_in1k": 84.278,
    "deit_tiny_patch16_224.fb_in1k": 72.190,
    "deit_small_patch16_224.fb_in1k": 79.856,
    "deit_base_patch16_224.fb_in1k": 81.980,
    "deit_base_patch16_384.fb_in1k": 83.108,
    "eva_large_patch14_196.in22k_ft_in1k": 87.952,
    "eva_large_patch14_196.in22k_ft_in22k_in1k": 88.590,
    "eva_large_patch14_336.in22k_ft_in1k": 88.680,
    "eva_large_patch14_336.in22k_ft_in22k_in1k": 89.238,
}

# keras_vit's preprocessing of the paper's files (keras_vit.preprocess_inputs: x / 127.5 - 1,
# a plain bilinear resize, no crop), in timm's field names.
PAPER_MEAN_STD = [0.5, 0.5, 0.5]
OFFICIAL_LICENSE = "apache-2.0"  # google-research/vision_transformer; timm's cfg for the same files
DEFAULT_RESOLUTION = 224  # of an official entry whose resolution is not documented (ViT-B_8)
ABOUT = (
    "Checkpoints keras_vit knows by name. Official files: google-research/vision_transformer "
    "(gs://vit_models). timm's: the Hugging Face Hub (hf://timm/<name>), read from timm "
    f"{TIMM_VERSION}'s pretrained configurations by checkpoints/make_registry.py, which writes "
    "this file. No checksums are published (sha256 null): a file's structure is checked "
    "against the model, and the zip CRC (.npz) or the safetensors header catches corruption. "
    "size_mib: the vit_jax README's size where it gives one, otherwise the parameter count "
    "times 4 bytes (float32 files), in MiB. imagenet_top1: ImageNet-1k validation top-1 in %, "
    "its source in imagenet_top1_source (null where none is published). preprocessing: the "
    "data configuration in timm's field names; the paper's files take x / 127.5 - 1 (mean = "
    "std = 0.5), a bilinear resize and no crop.")


def library(name):
    """keras_vit's module `name` (`configs`, `flops`: they import nothing), without Keras."""
    spec = importlib.util.spec_from_file_location(f"_registry_{name}",
                                                  ROOT / "keras_vit" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


configs, flops = library("configs"), library("flops")


def paper_preprocessing(resolution):
    side = resolution or DEFAULT_RESOLUTION
    # vit_jax's evaluation: each side resized (bilinear, no antialias), no crop, [-1, 1].
    return dict(input_size=[3, side, side], interpolation="bilinear", crop_pct=1.0,
                crop_mode="squash", mean=PAPER_MEAN_STD, std=PAPER_MEAN_STD, antialias=False)


def fp32_mib(params):
    return round(params * 4 / 2**20, 2)


def official_params(entry):
    """The parameter count of an official file: its variant's at 224 px with 1000 classes,
    changed to the entry's resolution, classes and representation layer."""
    spec = configs.get_variant(entry["variant"])
    size = configs.MODEL_SIZES[spec.size]
    common = dict(patch_size=spec.patch_size, hidden_size=size["hidden_size"],
                  num_layers=size["num_layers"], mlp_dim=size["mlp_dim"],
                  resnet=spec.config().get("resnet"))
    base = flops.vit_params(224, num_classes=1000, **common)
    mine = flops.vit_params(entry["resolution"] or DEFAULT_RESOLUTION,
                            num_classes=entry["num_classes"],
                            representation_size=entry["representation_size"], **common)
    return spec.params - base + mine


def official_tags(entry):
    if entry.get("file"):
        return ["keras_vit", "demo"]
    family = "augreg" if entry["name"].startswith("augreg/") else "original"
    data = ["in21k"] + (["in1k"] if entry["finetuning"] == "imagenet2012" else [])
    return ["official", family, *data]


def complete_official(entry):
    """An official (or shipped) entry with the fields it lacks; its own fields kept."""
    entry = dict(entry)
    if entry["size_mib"] is None:
        entry["size_mib"] = fp32_mib(official_params(entry))
    top1, source = None, None
    if entry["imagenet_top1"] is not None:
        top1, source = entry["imagenet_top1"], AUGREG_README
    elif entry["name"] in OFFICIAL_TOP1:
        top1, source = OFFICIAL_TOP1[entry["name"]]
    elif entry["name"].startswith("augreg/") and entry["finetuning"] == "imagenet2012":
        timm_name = AUGREG_224[entry["name"].split("/")[1].split("-")[0]] + \
            ".augreg_in21k_ft_in1k"
        top1, source = TIMM_TOP1[timm_name], TIMM_RESULTS.format(name=timm_name)
    if entry["resolution"] is None and "assume" not in entry.get("note", ""):
        entry["note"] += f"; size_mib and preprocessing assume {DEFAULT_RESOLUTION} px"
    entry.update(imagenet_top1=top1, imagenet_top1_source=source,
                 license=entry.get("license", OFFICIAL_LICENSE),
                 preprocessing=paper_preprocessing(entry["resolution"]),
                 tags=official_tags(entry))
    return entry


def timm_variant(model):
    """The paper variant ("B/16") whose sizes a timm ViT has, or None."""
    block = model.blocks[0]
    sizes = dict(hidden_size=model.embed_dim, num_layers=len(model.blocks),
                 num_heads=block.attn.num_heads, mlp_dim=block.mlp.fc1.out_features)
    for spec in configs.VARIANTS.values():
        if spec.resnet is None and configs.MODEL_SIZES[spec.size] == sizes and \
                tuple(model.patch_embed.patch_size) == (spec.patch_size,) * 2:
            return spec.name
    return None


def timm_entry(timm, name, family):
    import torch

    cfg = timm.models.get_pretrained_cfg(name).to_dict()
    assert cfg["hf_hub_id"] == f"timm/{name}", name
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False)
    tag = name.split(".", 1)[1]
    pretraining, finetuning = TRAINING.get(f"{family}.{tag}") or TRAINING[tag]
    classes = model.num_classes
    height, width = cfg["input_size"][1:]
    top1 = TIMM_TOP1.get(name)
    return dict(
        name=name, url=HF + name, variant=timm_variant(model), architecture=name.split(".")[0],
        resolution=height if height == width else [height, width], num_classes=classes,
        representation_size=None, pretraining=pretraining, finetuning=finetuning,
        labels=LABELS.get(classes), size_mib=fp32_mib(sum(p.numel() for p in model.parameters())),
        sha256=None, imagenet_top1=top1,
        imagenet_top1_source=TIMM_RESULTS.format(name=name) if top1 is not None else None,
        license=cfg.get("license"),
        preprocessing=dict(input_size=list(cfg["input_size"]),
                           interpolation=cfg["interpolation"], crop_pct=cfg["crop_pct"],
                           crop_mode=cfg.get("crop_mode", "center"), mean=list(cfg["mean"]),
                           std=list(cfg["std"])),
        tags=["timm", tag] + ([family] if family != tag else []),
        name_source=f"timm {TIMM_VERSION} pretrained_cfg",
    )


def import_timm():
    sys.path.insert(0, str(ROOT))
    from benchmarks.contenders.timm_vit import import_timm as load

    timm, _ = load()
    if timm.__version__ != TIMM_VERSION:
        sys.exit(f"make_registry: expected timm {TIMM_VERSION}, found {timm.__version__}.")
    return timm


# What keras_vit's `ViT` and its safetensors reader do not express, found on a timm model.
def left_out_because(model):
    """Why keras_vit cannot load a timm ViT exactly (empty: it can), from its modules."""
    import torch.nn as nn
    from timm.layers import Mlp, PatchEmbed
    from timm.models.vision_transformer import Attention, Block, VisionTransformer

    if type(model) is not VisionTransformer:
        return [f"another model class ({type(model).__name__}: e.g. a distillation token)"]
    why = []
    embed = model.patch_embed
    if type(embed) is not PatchEmbed:
        why.append(f"a {type(embed).__name__} stem (hybrid): keras_vit's timm reader maps "
                   "plain patch embeddings only; the vit_jax .npz of AugReg's hybrids is "
                   "registered instead")
    elif embed.proj.bias is None or not isinstance(embed.norm, nn.Identity):
        why.append("a patch embedding without bias or with a norm (CLIP / AIMv2 style)")
    if model.num_reg_tokens:
        why.append("register tokens")
    if model.no_embed_class and model.cls_token is not None:
        why.append("position embeddings without the class token (no_embed_class)")
    if not isinstance(model.norm_pre, nn.Identity):
        why.append("a norm before the encoder (CLIP pre-norm)")
    if getattr(model, "attn_pool", None) is not None:
        why.append("an attention-pooling (MAP) head (SigLIP)")
    if model.global_pool not in ("token", "avg"):
        why.append(f"global_pool {model.global_pool!r}")
    if isinstance(model.fc_norm, nn.Identity) == isinstance(model.norm, nn.Identity):
        why.append("no final norm, or two")
    encoder = [m for name, m in model.named_modules() if not name.startswith("patch_embed.")]
    norms = {type(m).__name__ for m in encoder if "Norm" in type(m).__name__}
    if norms - {"LayerNorm"} or {m.eps for m in encoder if isinstance(m, nn.LayerNorm)} != {1e-6}:
        why.append("a norm other than LayerNorm with epsilon 1e-6 (RMSNorm, CLIP's 1e-5)")
    for block in model.blocks:
        if type(block) is not Block or type(block.attn) is not Attention or \
                type(block.mlp) is not Mlp:
            why.append("another block (parallel, residual post-norm, SwiGLU, ...)")
        elif not isinstance(block.ls1, nn.Identity):
            why.append("layer scale")
        elif not isinstance(block.attn.q_norm, nn.Identity) or \
                not isinstance(block.attn.norm, nn.Identity) or \
                not isinstance(block.mlp.norm, nn.Identity):
            why.append("query/key or sub-layer norms")
        elif block.attn.proj.bias is None or block.mlp.fc1.bias is None:
            why.append("projections without bias")
        elif type(block.mlp.act) is not nn.GELU or block.mlp.act.approximate != "none":
            why.append(f"{type(block.mlp.act).__name__}, which the Hub's config.json does not "
                       "name (keras_vit would read exact GELU)")
        else:
            continue
        break
    if not why and timm_variant_heads(model) is None:
        why.append(f"width {model.embed_dim}: the number of heads is in neither the Hub's "
                   "config.json nor a paper variant of that width")
    return why


def timm_variant_heads(model):
    """The heads keras_vit's reader infers for a timm file without `model_args`: the paper
    size in the architecture's name, else the paper variant of the same width (None: none)."""
    name = model.pretrained_cfg["architecture"]
    for word, size in (("tiny", "Ti"), ("small", "S"), ("base", "B"), ("large", "L"),
                       ("huge", "H")):
        if name.startswith(f"vit_{word}_patch"):
            return configs.MODEL_SIZES[size]["num_heads"]
    widths = {s["hidden_size"]: s["num_heads"] for s in configs.MODEL_SIZES.values()}
    return widths.get(model.embed_dim)


def survey(timm, registered):
    """Prints each pretrained timm ViT, DeiT or hybrid on the Hub: registered, or why not."""
    import torch

    modules = ("vision_transformer", "vision_transformer_hybrid", "deit")
    architectures = {name for module in modules for name in timm.list_models(module=module)}
    for name in timm.list_models(pretrained=True):
        if name.split(".")[0] not in architectures:
            continue
        cfg = timm.models.get_pretrained_cfg(name)
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
        why = left_out_because(model)
        if cfg.hf_hub_id != f"timm/{name}":
            why.append("not published on the Hub by timm")
        if name.startswith("test_"):
            why.append("a test model")
        if bool(why) == (name in registered):
            raise SystemExit(f"make_registry: {name} is {'registered' if why else 'left out'} "
                             f"but {'; '.join(why) or 'loads exactly'}.")
        print(f"{'registered' if not why else 'left out':10}  {name}  {'; '.join(why)}")


def build(timm):
    document = json.loads(REGISTRY.read_text())
    official = [complete_official(e) for e in document["checkpoints"]
                if not str(e.get("url") or "").startswith(HF)]
    document["checkpoints"] = official + [timm_entry(timm, n, f) for n, f in TIMM]
    document["about"] = ABOUT
    return document


def dumps(document):
    """JSON text, one field a line, with each list of numbers or strings on one line."""
    text = json.dumps(document, indent=1, ensure_ascii=False)
    scalar = r"(?:-?[0-9.e+-]+|\"[^\"\n]*\")"
    flat = re.sub(rf"\[\s*((?:{scalar},\s*)*{scalar})\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m[1].split(",\n")) + "]", text)
    return flat + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--survey", action="store_true",
                        help="print every timm ViT checkpoint on the Hub left out, and why")
    args = parser.parse_args(argv)
    timm = import_timm()
    if args.survey:
        survey(timm, {n for n, _ in TIMM})
        return 0
    text = dumps(build(timm))
    tmp = REGISTRY.with_suffix(".json.tmp")
    tmp.write_text(text)
    os.replace(tmp, REGISTRY)
    print(f"wrote {REGISTRY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
