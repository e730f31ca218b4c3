"""`keras-vit inspect IMAGE... --out DIR`: attention maps and the paper's Figure 7."""

from keras_vit_cli.arguments import add_model_arguments
from keras_vit_cli.preflight import (
    check_images_exist,
    check_model_flag_conflicts,
    check_model_paths,
    check_output_folder,
)
from keras_vit_cli.common import model_from_args, model_stage
from keras_vit_cli.progress import Progress, add_progress_arguments
from keras_vit_cli.summaries import images as image_count


def configure(parser):
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files to look at")
    parser.add_argument("--out", required=True, help="folder for the PNG figures")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace figures already in --out")
    add_model_arguments(parser)
    parser.add_argument("--classifier", choices=("token", "gap"), default=None,
                        help="for a variant --model: class token or global average pooling")
    parser.add_argument("--layer", type=int, default=-1,
                        help="encoder block of the single-layer attention map (default: last)")
    parser.add_argument("--head", type=int, default=None,
                        help="attention head of that map (default: mean of the heads)")
    parser.add_argument("--gray", action="store_true",
                        help="the model was trained on grey images: show the patch-embedding "
                             "filters summed over the colour channels, as such images see them")
    add_progress_arguments(parser)


def check(args):
    """The inputs, before TensorFlow starts: the images, the model and weights files, and the
    --out folder."""
    check_model_flag_conflicts(args)
    check_images_exist(args.images)
    check_model_paths(args)
    check_output_folder("--out", args.out, "the figures")


def run(args):
    import numpy as np

    from keras_vit import images, inspection
    from keras_vit.data_config import resolve_data_config

    check_model_flag_conflicts(args)
    check_images_exist(args.images)
    check_output_folder("--out", args.out, "the figures")
    inspection.check_figure_files(args.out, args.overwrite)  # before the model is built
    progress = Progress.of(args)
    architecture = {"classifier": args.classifier} if args.classifier else None
    progress.stage(model_stage(args))
    model, _ = model_from_args(args, include_top=False, architecture=architecture)
    if args.weights is None and not (args.model or "").endswith(".keras"):
        print("note: no --weights; inspecting the model's initial weights")
    geo = inspection.geometry(model)
    inspection.check_layer_head(geo, args.layer, args.head)  # before reading any image
    config = resolve_data_config(model, geo.image_size)  # the checkpoint's own
    progress.stage(f"reading {image_count(len(args.images))}")
    batch = np.stack([images.load_image(path, data_config=config) for path in args.images])
    progress.stage(f"computing the attention maps and drawing the figures into {args.out}")
    results = inspection.inspect_model(model, np.asarray(images.preprocess_inputs(batch, config)),
                                       args.out, layer=args.layer, head=args.head,
                                       gray=args.gray, overwrite=args.overwrite,
                                       data_config=config)
    for name, (path, _) in results.items():
        print(f"{name:30} {path}")
    if not inspection.has_position_embeddings(model):
        print(f"{'position_embedding_similarity':30} none: the model adds no embedding per "
              "position")
    if not inspection.has_rgb_filters(model):
        print(f"{'patch_embedding_filters':30} none: a hybrid's patch embedding sees ResNet "
              "features, not RGB pixels")
    return 0


COMMANDS = {"inspect": (configure, run, check)}
