"""`keras-vit export OUTPUT`: a TF Serving SavedModel, a TFLite file or an ONNX file."""

import importlib.util
import os
import sys

from keras_vit_cli.arguments import (
    add_class_names_argument,
    add_model_arguments,
    int_arg,
    positive_int_arg,
)
from keras_vit_cli.preflight import (
    check_class_names_file,
    check_model_paths,
    check_new_file,
    check_output_folder,
)
from keras_vit_cli.common import class_names_from_args, model_from_args, model_stage
from keras_vit_cli.progress import Progress, add_progress_arguments

# Random images the TFLite and ONNX exports compare their file and Keras on.
PARITY_IMAGES = 8
FORMATS = ("saved_model", "tflite", "onnx")
# The formats written as one file, by the name their messages give them.
FILE_FORMATS = {"tflite": "TFLite", "onnx": "ONNX"}
# What `--format onnx` needs beyond the base install: the `onnx` extra (setup.cfg), looked for
# before TensorFlow starts.
ONNX_PACKAGES = ("tf2onnx", "onnx", "onnxruntime")


def configure(parser):
    parser.add_argument("output", help="SavedModel: the base folder (the version goes inside); "
                                       "TFLite: the .tflite file; ONNX: the .onnx file")
    add_model_arguments(parser)
    parser.add_argument("--num-classes", type=positive_int_arg, default=None,
                        help="head size for a variant without --weights (1000)")
    parser.add_argument("--format", choices=FORMATS, default="saved_model",
                        help="saved_model: a TF Serving SavedModel folder; tflite: a .tflite "
                             "file; onnx: an .onnx file for ONNX Runtime, preprocessed images "
                             "in, logits out (needs pip install 'keras-vit[onnx]') (default "
                             "saved_model)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the export keras_vit wrote in the version folder "
                             "(SavedModel; never a folder holding other files) or the file "
                             "(TFLite, ONNX)")
    parser.add_argument("--parity-images", type=positive_int_arg,
                        help=f"TFLite, ONNX: random images of the parity check against Keras "
                             f"({PARITY_IMAGES})")
    add_progress_arguments(parser)
    saved_model = parser.add_argument_group("SavedModel")
    saved_model.add_argument("--version", type=int_arg(0), help="the version folder (1)")
    add_class_names_argument(saved_model)
    saved_model.add_argument("--top-k", type=positive_int_arg,
                             help="classes in top_k_* (5)")
    saved_model.add_argument("--image-dtype", choices=("float32", "uint8"),
                             help="dtype of predict_images' input (float32)")
    saved_model.add_argument("--no-warmup", action="store_true",
                             help="do not write assets.extra/tf_serving_warmup_requests")
    saved_model.add_argument("--precision", choices=("float32", "bfloat16"),
                             help="what the signatures compute in (the model's own): bfloat16 "
                                  "serves faster on CPUs with AVX512_BF16 or AMX and on GPUs; "
                                  "outputs stay float32")
    xla = saved_model.add_mutually_exclusive_group()
    xla.add_argument("--xla", "--jit-compile", dest="xla", action="store_const", const=True,
                     help="XLA-compile the forward pass (decoding stays on the CPU); default: "
                          "the measured choice for this machine and precision")
    xla.add_argument("--no-xla", dest="xla", action="store_const", const=False,
                     help="serve in TensorFlow's graph runtime")
    saved_model.add_argument("--max-pixels", type=positive_int_arg,
                             help="serving_default refuses larger images (64 million)")
    saved_model.add_argument("--dynamic-image-size", action="store_true",
                             help="build the model for any input size and add the "
                                  "serving_native_size signature, which classifies each image "
                                  "at its own size (accurate near the resolution the weights "
                                  "were trained at; far from it, accuracy drops)")
    saved_model.add_argument("--max-patches", type=positive_int_arg,
                             help="serving_native_size scales larger images down to this many "
                                  "patches (4 times the model's own)")
    tflite = parser.add_argument_group("TFLite")
    tflite.add_argument("--quantize", choices=("dynamic-int8",),
                        help="dynamic-range int8 weights (default: float32)")
    onnx = parser.add_argument_group("ONNX")
    onnx.add_argument("--no-preprocessing", action="store_true",
                      help="the graph takes images normalised already with the model's mean "
                           "and std, instead of RGB in [0, 255]")


def _check_format_args(args):
    tflite_only = {"--quantize": args.quantize}
    onnx_only = {"--no-preprocessing": args.no_preprocessing}
    files_only = {"--parity-images": args.parity_images}  # TFLite and ONNX
    saved_model_only = {"--version": args.version, "--class-names": args.class_names,
                        "--top-k": args.top_k, "--image-dtype": args.image_dtype, "--no-warmup": args.no_warmup,
                        "--xla/--no-xla": args.xla, "--max-pixels": args.max_pixels,
                        "--precision": args.precision,
                        "--dynamic-image-size": args.dynamic_image_size,
                        "--max-patches": args.max_patches}
    wrong = {"saved_model": {**tflite_only, **files_only, **onnx_only},
             "tflite": {**saved_model_only, **onnx_only},
             "onnx": {**saved_model_only, **tflite_only}}[args.format]
    given = [flag for flag, value in wrong.items() if value not in (None, False)]
    if given:
        raise ValueError(f"{', '.join(given)} does not apply to --format {args.format}.")


def _check_onnx_packages():
    missing = [name for name in ONNX_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"--format onnx needs {', '.join(missing)}, which "
                         f"{'is' if len(missing) == 1 else 'are'} not installed: "
                         "pip install 'keras-vit[onnx]'.")


def check(args):
    """The flags, input files and OUTPUT, before TensorFlow starts: the flags of the other
    formats, the packages of --format onnx, the model and weights files, the class-names file,
    and OUTPUT (a TFLite or ONNX file replaced only with --overwrite; a SavedModel's base
    folder, not a file)."""
    _check_format_args(args)
    if args.format == "onnx":
        _check_onnx_packages()
    check_model_paths(args)
    check_class_names_file(args)
    _check_output(args)


def _check_output(args):
    if args.format in FILE_FORMATS:
        check_new_file("OUTPUT", args.output, args.overwrite,
                       f"the {FILE_FORMATS[args.format]} file")
    else:
        check_output_folder("OUTPUT", args.output, "the SavedModel's version folders")


def run(args):
    _check_format_args(args)
    _check_output(args)
    import numpy as np

    from keras_vit import export, images, tflite
    progress = Progress.of(args)
    architecture = {"dynamic_image_size": True} if args.dynamic_image_size else None
    progress.stage(model_stage(args))
    model, checkpoint_names = model_from_args(args, num_classes=args.num_classes,
                                              architecture=architecture,
                                              classes_flag="--num-classes")
    num_classes = model.outputs[0].shape[-1]
    if args.format == "saved_model":
        path = export.export_saved_model(
            model, args.output, version=1 if args.version is None else args.version,
            class_names=class_names_from_args(args, num_classes, checkpoint_names),
            top_k=args.top_k or export.DEFAULT_TOP_K, image_dtype=args.image_dtype or "float32",
            overwrite=args.overwrite, warmup=False if args.no_warmup else "auto",
            jit_compile=args.xla, max_pixels=args.max_pixels or images.DEFAULT_MAX_PIXELS,
            precision=args.precision, max_patches=args.max_patches or "auto",
            progress=progress.stage)
        metadata = export.read_metadata(path)
        print(f"SavedModel written to {path} (signatures {', '.join(metadata['signatures'])})")
        return 0
    if args.format == "onnx":
        return _export_onnx(model, args, progress)
    progress.stage(f"converting to TFLite ({args.quantize or 'float32'}) and writing "
                   f"{args.output}")
    tflite.export_tflite(model, args.output, quantize=args.quantize, overwrite=args.overwrite)
    height, width, _ = export.check_model(model)
    count = args.parity_images or PARITY_IMAGES
    progress.stage(f"verifying: TFLite against Keras on {count} random images")
    batch = np.random.default_rng(0).uniform(0, 255, (count, height, width, 3))
    parity = tflite.tflite_parity(args.output, model, batch)
    print(f"TFLite ({args.quantize or 'float32'}) written to {args.output}: "
          f"{os.path.getsize(args.output):,} bytes")
    print(f"parity with Keras on {parity['num_images']} random images: max |probability "
          f"difference| {parity['max_abs_diff']:.3g}, top-1 agreement "
          f"{parity['top1_agreement']:.1%}")
    if args.quantize is None and not parity["max_abs_diff"] <= tflite.TFLITE_FLOAT_TOLERANCE:
        print(f"keras-vit export: error: the float32 TFLite file differs from Keras by more "
              f"than {tflite.TFLITE_FLOAT_TOLERANCE}", file=sys.stderr)
        return 1
    return 0


def _export_onnx(model, args, progress):
    """`--format onnx`: the file (which the library checks against Keras before it is put in
    place), and its parity with Keras on `--parity-images` other random images."""
    import numpy as np

    from keras_vit import export, onnx_export
    from keras_vit.preprocessing import preprocess_inputs

    progress.stage(f"converting to ONNX, checking it in ONNX Runtime and writing {args.output}")
    pixels = not args.no_preprocessing
    onnx_export.export_onnx(model, args.output, overwrite=args.overwrite, preprocessing=pixels)
    height, width, num_classes = export.check_model(model)
    shown = [d or name for d, name in zip(model.inputs[0].shape[1:3],
                                          onnx_export.DIMENSION_NAMES[1:])]
    config = onnx_export.file_metadata(args.output)["data_config"]
    given = "RGB in [0, 255] (normalised in the graph)" if pixels else \
        "(x / 255 - mean) / std"
    print(f"ONNX written to {args.output}: {os.path.getsize(args.output):,} bytes; input "
          f"{onnx_export.INPUT_NAME} [batch, {shown[0]}, {shown[1]}, 3] float32 {given}, "
          f"output {onnx_export.OUTPUT_NAME} [batch, {num_classes}]")
    print(f"preprocessing (in its metadata, {onnx_export.DATA_CONFIG_KEY}): resize "
          f"{config['interpolation']}, crop_pct {config['crop_pct']} ({config['crop_mode']}) to "
          f"{config['input_size'][1]}x{config['input_size'][2]}, mean {config['mean']}, std "
          f"{config['std']}")
    count = args.parity_images or PARITY_IMAGES
    progress.stage(f"verifying: ONNX Runtime against Keras on {count} random images")
    batch = np.random.default_rng(1).uniform(0, 255, (count, height, width, 3))
    if not pixels:
        batch = np.asarray(preprocess_inputs(batch, model))
    parity = onnx_export.onnx_parity(args.output, model, batch)
    print(f"parity with Keras on {parity['num_images']} random images in ONNX Runtime: max "
          f"|logit difference| {parity['max_abs_diff']:.3g}, top-1 agreement "
          f"{parity['top1_agreement']:.1%}")
    return 0


COMMANDS = {"export": (configure, run, check)}
