"""`keras-vit convert SOURCE OUT`: a checkpoint as a `.keras` model, `.weights.h5`, an `.npz` in
the official layout, or a `.safetensors` file in timm's layout (which
`timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=OUT))` loads)."""

from keras_vit_cli.common import add_model_arguments, model_from_args

FORMATS = (".keras", ".weights.h5", ".npz", ".safetensors")


def configure(parser):
    parser.add_argument("source", help="weights: a registry name, an .npz or .safetensors path, a URL "
                                       "or hf://ORG/NAME")
    parser.add_argument("out", help="output file: .keras, .weights.h5, .npz (official layout) "
                                    "or .safetensors (timm's layout)")
    add_model_arguments(parser)


def run(args):
    if not args.out.endswith(FORMATS):
        raise ValueError(f"OUT must end in {', '.join(FORMATS)}. Received: {args.out}")
    if args.weights:
        raise ValueError("SOURCE is the weights; --weights is not needed.")
    from keras_vit.fileio import atomic_file
    from keras_vit.weights import model_params, save_npz, torch_layouts
    from safetensors.numpy import save_file

    args.weights = args.source
    model, _ = model_from_args(args)
    if args.out.endswith(".npz"):
        save_npz(model, args.out)
    elif args.out.endswith(".safetensors"):
        params = torch_layouts.to_timm(model_params(model))
        with atomic_file(args.out) as tmp:
            save_file(params, tmp, metadata={"format": "pt"})
    else:
        with atomic_file(args.out) as tmp:  # Keras picks the format from the suffix
            if args.out.endswith(".keras"):
                model.save(tmp)
            else:
                model.save_weights(tmp, overwrite=True)
    print(f"Wrote {args.out} ({model.name}, {model.count_params():,} parameters, "
          f"input {tuple(model.inputs[0].shape[1:])})")
    return 0


COMMANDS = {"convert": (configure, run)}
