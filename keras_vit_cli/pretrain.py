"""`keras-vit pretrain`: self-supervised pre-training of a ViT encoder on unlabelled images
(paper section 4.6, appendix B.1.2), with `keras_vit.training.fit`.

    keras-vit pretrain --objective masked-patches --model B/16 --dataset imagenet2012 \\
        --manual-dir ~/imagenet --batch-size 64 --target-batch-size 4096 --output runs/mpp
    keras-vit train --weights runs/mpp/encoder.npz --dataset cifar10 --output runs/cifar10

The labels of the data are not used: `--folder` reads every image under the folder, in
class subfolders or not (`keras_vit.data.from_folder(labels=None)`). The run folder gets `encoder.npz` (the ViT encoder in
the official layout, without the pre-training head) and the `config.json` that describes it,
so that `keras-vit train --weights OUT/encoder.npz` fine-tunes it with a new head. Running
the same command again after an interruption resumes from the last finished epoch.
"""

from keras_vit_cli.arguments import (
    add_data_arguments,
    add_model_arguments,
    add_run_arguments,
    number_arg,
)
from keras_vit_cli.preflight import check_data_folder, check_model_paths, check_run_flags
from keras_vit_cli.common import (
    data_num_classes,
    fit_from_args,
    input_size,
    model_from_args,
    require_architecture,
    run_architecture,
    start_run,
)
from keras_vit_cli.summaries import add_json_argument, print_training

OBJECTIVES = ("masked-patches",)
# --target -> keras_vit.pretraining.masked_patch_model(objective=...)
TARGETS = {"mean-color": "mean_color", "downsized-color": "downsized_color",
           "pixels": "pixels"}


def configure(parser):
    add_model_arguments(parser, " to start from; without it, random initialisation")
    add_data_arguments(parser, folder_help="image folder: every image under it, in "
                                           "subfolders or not (labels are not used)")
    run = add_run_arguments(
        parser, outputs="encoder.npz, config.json, final.npz (with the pre-training head), "
                        "run.json, backup/, logs/",
        steps="1000000, the paper's", learning_rate="0.0002, the paper's",
        validation_split="none", warmup_steps="10000, the paper's")
    run.add_argument("--objective", choices=OBJECTIVES, default="masked-patches",
                     help="masked-patches: corrupt half the patch embeddings (80%% [mask], "
                          "10%% another patch, 10%% kept) and predict each one's target "
                          "(default)")
    run.add_argument("--target", choices=tuple(TARGETS), default="mean-color",
                     help="mean-color: the patch's 3-bit mean colour, 512 classes (the "
                          "paper's); downsized-color: 4x4 sub-patches' 3-bit colours; pixels: "
                          "L2 regression of the pixels (default mean-color)")
    run.add_argument("--mask-rate", type=number_arg(0, 1, low_inclusive=False), default=0.5,
                     help="fraction of each image's patches corrupted and predicted (0.5)")
    add_json_argument(parser)


def check(args):
    """The inputs, before TensorFlow starts: an architecture is named, the image folder and
    the model and weights files exist, and the run flags (the output folder, the precision,
    the strategy)."""
    require_architecture(args)
    check_data_folder(args)
    check_model_paths(args)
    check_run_flags(args)


def run(args):  # the dispatcher has applied --backend
    from keras_vit import pretraining, training

    require_architecture(args)
    args.folder_labels = None  # the labels are not used: any images under --folder
    data_num_classes(args)  # bad data flags fail before the output folder is made
    strategy = start_run(args)
    with strategy.scope():
        vit, _ = model_from_args(args, include_top=False, architecture=run_architecture(args))
        model = pretraining.masked_patch_model(vit, objective=TARGETS[args.target],
                                               mask_rate=args.mask_rate, seed=args.seed)
    summary = fit_from_args(args, model, strategy, input_size(vit, args),
                            recipe="pretrain_mpp", default_steps=training.MPP_STEPS)
    print_training(args, summary)
    return 0


COMMANDS = {"pretrain": (configure, run, check)}
