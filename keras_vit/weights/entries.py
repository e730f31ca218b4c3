"""Questions asked of the checkpoint registry's entries: which match a pattern, and which one
each variant loads by default. Plain functions over entry dicts that import nothing of keras_vit
or Keras, so that the command line (`keras-vit checkpoints`) answers them without starting
TensorFlow; `keras_vit.weights.registry` answers them for the library.
"""

import fnmatch

# Registry entries whose `url` is on the Hugging Face Hub (timm's files): loaded by name, but
# never a variant's default, which stays the paper's own release (AugReg's, where it exists).
HUB_PREFIX = "hf://"
# The arguments `pretrained=True` and `--weights default` choose for unless told otherwise.
DEFAULT_IMAGE_SIZE, DEFAULT_CLASSES = 224, 1000


def matches(entry, pattern):
    """Whether a shell-style `pattern` (`*`, `?`, `[...]`; any case) matches the entry's name,
    variant or one of its tags, e.g. "vit_base*", "B/16", "dino", "*in21k*"."""
    pattern = pattern.lower()
    fields = [entry["name"], *([entry["variant"]] if entry.get("variant") else []),
              *(entry.get("tags") or ())]
    return any(fnmatch.fnmatchcase(field.lower(), pattern) for field in fields)


def matching(entries, pattern, variant=None):
    """The entries `pattern` matches (`matches`), and those of `variant` (the canonical name a
    variant spelling such as "ViT_B16" gives, or None), in their order."""
    return [e for e in entries if matches(e, pattern)
            or (variant is not None and e.get("variant") == variant)]


def _family_rank(entry):
    return 0 if entry["name"].startswith("augreg/") else 1


def default_name(entries, variant, image_size=DEFAULT_IMAGE_SIZE, num_classes=DEFAULT_CLASSES,
                 include_top=True):
    """The name `pretrained=True` loads for `variant` (its canonical name, e.g. "B/16"), or None.

    With `include_top` and 1000 classes: the best ImageNet-1k fine-tune, preferring the
    resolution nearest to `image_size` among the best-scoring family (AugReg where it exists,
    else the original `imagenet21k+imagenet2012` files). Otherwise (a new head, or no head):
    the ImageNet-21k pre-trained weights (AugReg where they exist, else `imagenet21k/`). Only
    the paper's own files are chosen (not those on the Hub).
    """
    own = [e for e in entries if e.get("variant") == variant
           and not str(e.get("url") or "").startswith(HUB_PREFIX)]
    if include_top and num_classes == DEFAULT_CLASSES:
        fine_tuned = [e for e in own if e["finetuning"] == "imagenet2012"]
        if fine_tuned:
            best = min(map(_family_rank, fine_tuned))
            family = [e for e in fine_tuned if _family_rank(e) == best]
            return min(family, key=lambda e: abs((e["resolution"] or image_size) -
                                                 image_size))["name"]
    upstream = [e for e in own if e["finetuning"] is None and e["pretraining"]]
    return min(upstream, key=_family_rank)["name"] if upstream else None


def with_defaults(entries):
    """Copies of `entries`, each with `"default": True` where it is its variant's default for
    `pretrained=True` and `--weights default` at 224 px with a 1000-class head, else False."""
    defaults = {default_name(entries, variant) for variant in
                {e.get("variant") for e in entries if e.get("variant")}}
    return [dict(entry, default=entry["name"] in defaults) for entry in entries]
