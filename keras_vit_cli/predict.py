"""`keras-vit predict IMAGE...`: the top classes of each image."""

import warnings

from keras_vit_cli.arguments import add_class_names_argument, add_model_arguments, positive_int_arg
from keras_vit_cli.preflight import (
    check_class_names_file,
    check_images_exist,
    check_model_flag_conflicts,
    check_model_paths,
)
from keras_vit_cli.common import class_names_from_args, input_size, model_from_args, model_stage
from keras_vit_cli.progress import Progress, add_progress_arguments
from keras_vit_cli.summaries import images as image_count

# Images read and classified at a time: memory stays bounded however many are given.
PREDICT_BATCH = 32


def configure(parser):
    parser.add_argument("images", nargs="+", metavar="IMAGE",
                        help="JPEG, PNG, GIF, BMP or WebP files")
    add_model_arguments(parser, "; with a variant --model and no --weights, its default")
    add_class_names_argument(parser)
    parser.add_argument("--top-k", "--top", dest="top_k", type=positive_int_arg, default=5,
                        help="classes shown per image (5)")
    parser.add_argument("--max-pixels", type=positive_int_arg, default=None,
                        help="refuse images above this many pixels (default 64 million)")
    add_progress_arguments(parser)


def check(args):
    """The input files, before TensorFlow starts: the images, the model and weights files and
    the class-names file."""
    check_model_flag_conflicts(args)
    check_images_exist(args.images)
    check_model_paths(args)
    check_class_names_file(args)


def run(args):
    from keras_vit import images
    from keras_vit.data_config import resolve_data_config
    from keras_vit.model_parts import fresh_head

    progress = Progress.of(args)
    check_model_flag_conflicts(args)
    check_images_exist(args.images)
    progress.stage(model_stage(args, default_weights=True))
    model, checkpoint_names = model_from_args(args, default_weights=True)
    num_classes = model.outputs[0].shape[-1]
    if fresh_head(model):
        warnings.warn(f"{model.name}'s head is all zeros (no trained weights were loaded into "
                      "it): every class gets the same probability. Expected --weights with a "
                      "trained head.")
    names = class_names_from_args(args, num_classes, checkpoint_names)
    config = resolve_data_config(model, input_size(model, args))  # the checkpoint's own
    max_pixels = args.max_pixels or images.DEFAULT_MAX_PIXELS
    size = config["input_size"][1:]
    count = len(args.images)
    progress.stage(f"classifying {image_count(count)} at {size[0]}x{size[1]}")
    top = []
    with progress.bar(count, "image") as bar:
        for start in range(0, count, PREDICT_BATCH):
            paths = args.images[start:start + PREDICT_BATCH]
            top += images.classify_images(model, paths, top=args.top_k, class_names=names,
                                          max_pixels=max_pixels, batch_size=PREDICT_BATCH,
                                          data_config=config)
            bar.update(len(paths))
    for path, classes in zip(args.images, top):
        print(shown_path(path))
        for class_id, name, probability in classes:
            print(f"  {probability:7.2%}  {name} ({class_id})")
    return 0


def shown_path(path):
    """`path` as printed on one line: as it is, or, where it holds a line break or another
    character that does not print, quoted as bash writes such a name (`$'a\\nb.png'`), so
    that each image's block keeps its lines."""
    if path.isprintable():
        return path
    return "$'" + "".join(map(_bash_escaped, path)) + "'"


def _bash_escaped(char):
    """`char` as bash writes it inside `$'...'`."""
    code = ord(char)
    if char in "\\'" or char in _ESCAPES:
        return _ESCAPES.get(char, "\\" + char)
    if char.isprintable():
        return char
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a name that is not UTF-8 (surrogateescape)
        return f"\\{code - 0xDC00:03o}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 \
        else f"\\U{code:08x}"


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


COMMANDS = {"predict": (configure, run, check)}
