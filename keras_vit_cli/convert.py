"""`keras-vit convert SOURCE OUT`: a checkpoint as a `.keras` model, `.weights.h5`, an `.npz` in
the official layout, or a `.safetensors` file in timm's layout with the `config.json` timm
writes beside it (`keras_vit.weights.writers.save_safetensors`: `keras_vit.from_pretrained(OUT)`
rebuilds the model, and timm loads it: `timm.create_model("local-dir:FOLDER", pretrained=True)`
for a `model.safetensors`, else `timm.create_model(architecture, pretrained=True,
pretrained_cfg_overlay=dict(pretrained_cfg, file=OUT), **model_args)` with the config.json's
fields); with `--format keras-hub`, a
keras-hub preset folder (`keras_vit.save_keras_hub_preset`: `keras_hub.models.ImageClassifier.
from_preset(OUT)` loads it with its preprocessor)."""

import argparse
import json

from keras_vit_cli.arguments import add_model_arguments
from keras_vit_cli.preflight import check_model_paths, check_new_file, check_output_folder
from keras_vit_cli.common import model_from_args, model_stage
from keras_vit_cli.progress import Progress, add_progress_arguments

FORMATS = (".keras", ".weights.h5", ".npz", ".safetensors")
# Formats named by --format rather than by OUT's suffix: OUT is then a folder.
FOLDER_FORMATS = ("keras-hub",)
# A .weights.h5 file's size, at most: 4 bytes a parameter and HDF5's own records.
H5_BYTES_PER_PARAMETER = 4
H5_OVERHEAD = 1 << 20


def configure(parser):
    parser.add_argument("source", help="weights: a registry name, an .npz or .safetensors path, a URL "
                                       "or hf://ORG/NAME; or a .keras model")
    parser.add_argument("out", help="output file: .keras, .weights.h5, .npz (official layout) "
                                    "or .safetensors (timm's layout); a folder with --format")
    parser.add_argument("--format", choices=FOLDER_FORMATS,
                        help="write OUT as a keras-hub preset folder (keras_hub.models."
                             "ImageClassifier.from_preset(OUT) loads it with its preprocessor)")
    parser.add_argument("--approximate-preprocessing", action="store_true",
                        help="--format keras-hub: write a checkpoint evaluated with timm's "
                             "centre crop with keras-hub's closest converter (crop to the "
                             "aspect ratio, then resize), saying what differs")
    add_model_arguments(parser)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a file already at OUT (never one a running job holds)")
    add_progress_arguments(parser)


def check(args):
    """The flags, SOURCE and OUT, before TensorFlow starts: OUT's format and destination
    (replaced only with --overwrite), and a SOURCE file that does not exist."""
    if args.format is None and not args.out.endswith(FORMATS):
        raise ValueError(f"OUT must end in {', '.join(FORMATS)}, or be a folder with --format "
                         f"{'/'.join(FOLDER_FORMATS)}. Received: {args.out}")
    if args.weights:
        raise ValueError("SOURCE is the weights; --weights is not needed.")
    if args.approximate_preprocessing and args.format != "keras-hub":
        raise ValueError("--approximate-preprocessing applies to --format keras-hub only.")
    if args.source.endswith(".keras") and (args.model or args.model_config is not None):
        raise ValueError(f"SOURCE {args.source} is a saved model; --model and "
                         "--model-config do not apply to it.")
    source = {"model": args.source} if args.source.endswith(".keras") else {
        "model": args.model, "weights": args.source}
    check_model_paths(argparse.Namespace(**source))
    if args.format is not None:
        check_output_folder("OUT", args.out, f"the {args.format} preset")
    else:
        suffix = next(suffix for suffix in FORMATS if args.out.endswith(suffix))
        check_new_file("OUT", args.out, args.overwrite, f"the {suffix} file")


def _source_model(args):
    """The model SOURCE holds, and its class names, told as a stage of `progress`."""
    if args.source.endswith(".keras"):  # a saved model: its architecture and weights
        args.model = args.source
    else:
        args.weights = args.source
    progress = Progress.of(args)
    progress.stage(model_stage(args))
    model, class_names = model_from_args(args)
    progress.stage(f"writing {args.out}")
    return model, class_names


def run(args):
    check(args)
    if args.format == "keras-hub":
        return _write_keras_hub(args)
    from keras_vit.fileio import atomic_file, check_destination, check_room
    from keras_vit.weights import save_npz, writers
    from keras_vit.weights.keymap import check_finite_weights

    model, class_names = _source_model(args)
    if args.out.endswith(".npz"):
        save_npz(model, args.out, overwrite=args.overwrite)
    elif args.out.endswith(".safetensors"):
        writers.save_safetensors(model, args.out, class_names, overwrite=args.overwrite)
    else:
        check_destination(args.out, args.overwrite)  # still free (or replaceable) now
        check_finite_weights(model, f"Writing {args.out}")
        if args.out.endswith(".weights.h5"):  # HDF5 does not survive a disk that fills up
            check_room(args.out, H5_BYTES_PER_PARAMETER * model.count_params() + H5_OVERHEAD)
        with atomic_file(args.out) as tmp:  # Keras picks the format from the suffix
            if args.out.endswith(".keras"):
                model.save(tmp)
            else:
                model.save_weights(tmp, overwrite=True)
    print(f"Wrote {args.out} ({model.name}, {model.count_params():,} parameters, "
          f"input {tuple(model.inputs[0].shape[1:])})")
    _note_lost_names(args, class_names)
    config = getattr(model, "data_config", None)
    if args.out.endswith(".weights.h5") and config is not None and not config.is_paper:
        print(f"note: {args.out} holds the weights only, not their preprocessing: build the "
              f"keras_vit.ViT that loads them with data_config={json.dumps(dict(config))} "
              "(a .keras file holds it).")
    return 0


def _write_keras_hub(args):
    """`--format keras-hub`: OUT as a keras-hub preset folder, with the source's preprocessing
    (the model's data config) as its image converter."""
    import warnings

    from keras_vit.weights import keras_hub, writers

    writers.check_preset_destination(args.out, args.overwrite)  # before the model is loaded
    keras_hub.import_keras_hub()  # before the model is loaded, too
    model, class_names = _source_model(args)
    with warnings.catch_warnings(record=True) as notices:
        warnings.simplefilter("always", UserWarning)
        writers.save_keras_hub_preset(model, args.out, overwrite=args.overwrite,
                                        approximate=args.approximate_preprocessing)
    for notice in notices:
        print(f"note: {notice.message}")
    print(f"Wrote {args.out} (a keras-hub preset of {model.name}, {model.count_params():,} "
          f"parameters, input {tuple(model.inputs[0].shape[1:])})")
    _note_lost_names(args, class_names)
    return 0


def _note_lost_names(args, class_names):
    """Says where OUT's format holds no class names that the source had (all but
    .safetensors: its metadata and config.json hold them)."""
    from keras_vit.labels import default_class_names  # the command loads the library late

    lost = class_names and not args.out.endswith(".safetensors")
    if lost and list(class_names) != default_class_names(len(class_names)):
        shown = ", ".join(class_names[:3]) + (", ..." if len(class_names) > 3 else "")
        print(f"note: {args.out} holds no class names: the source's {len(class_names)} ("
              f"{shown}) are left out; give them where it is used (predict --class-names "
              "FILE), or write a .safetensors file, which keeps them.")


COMMANDS = {"convert": (configure, run, check)}
