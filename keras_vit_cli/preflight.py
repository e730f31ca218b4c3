"""The checks a command makes of its flags before TensorFlow starts: files that must exist and
be readable, outputs that must be new (or overwritable), flags that exclude each other. Each
raises one error naming the flag and what was expected."""

import os

from keras_vit_cli.catalog import (
    library_arguments,
    library_module,
    library_names,
    registry_entries,
)
from keras_vit_cli.arguments import DEFAULT_WEIGHTS


def check_images_exist(paths):
    """Raises FileNotFoundError for the first of `paths` that does not exist (ValueError for a
    folder or another file that is not a regular one, PermissionError for one this process
    cannot read): all are looked at before any is read or a model is loaded."""
    for path in paths:
        if os.path.isdir(os.path.expanduser(path)):
            raise ValueError(f"{path} is a folder. Expected image files (e.g. "
                             f"{os.path.join(path, '*.jpg')}).")
        if not os.path.exists(os.path.expanduser(path)):
            if os.path.islink(os.path.expanduser(path)):  # dangling, or a loop of links
                raise FileNotFoundError(f"Image file {path} is a symbolic link to nothing "
                                        f"readable ({_link_error(path)}). Expected an image "
                                        "file.")
            raise FileNotFoundError(f"Image file {path} does not exist.")
        if not os.path.isfile(os.path.expanduser(path)):  # reading a FIFO could wait forever
            raise ValueError(f"Image file {path} is not a regular file (a FIFO, socket or "
                             "device). Expected an image file.")
        check_readable(path, f"Image file {path}")


def _link_error(path):
    """Why the symbolic link `path` leads to no file ("No such file or directory", "Too many
    levels of symbolic links")."""
    try:
        os.stat(os.path.expanduser(path))
    except OSError as error:
        return error.strerror or str(error)
    return "no file"


def check_readable(path, what):
    """Raises PermissionError if this process may not read the existing file `path` (`what`:
    the file, for the message)."""
    if not os.access(os.path.expanduser(path), os.R_OK):
        raise PermissionError(f"{what} cannot be read (permission denied). Expected a file "
                              "this user may read.")


# The suffixes of a --weights value that names a local file (`keras_vit.weights.sources`).
LOCAL_WEIGHTS_SUFFIXES = (".npz", ".safetensors")


def _local_weights_path(source):
    """The file a `--weights` value names, if it names one by its form, as
    `keras_vit.weights.sources.fetch_params` reads it: not 'default', not a registry name, not a
    URL or hf://; an `.npz` or `.safetensors` path, or one starting with `.`, `~` or `/`.
    None otherwise (a name the library checks, naming close registry names)."""
    if not source or source == DEFAULT_WEIGHTS or "://" in source:
        return None
    if not (source.endswith(LOCAL_WEIGHTS_SUFFIXES) or source.startswith((".", "~", os.sep))):
        return None
    if source in {entry["name"] for entry in registry_entries()}:
        return None
    return os.path.expanduser(source)


def check_model_paths(args):
    """Refuses a `--model` .keras file or a local `--weights` file that does not exist, with
    the message loading it gives (checked before TensorFlow starts, after the model flags'
    conflicts)."""
    check_model_flag_conflicts(args)
    model = getattr(args, "model", None)
    if model and model.endswith(".keras"):
        if not os.path.isfile(os.path.expanduser(model)):
            raise FileNotFoundError(f"--model {model}: no such file.")
        check_readable(model, f"--model {model}")
    path = _local_weights_path(getattr(args, "weights", None))
    if path is not None:
        # A folder holding model.safetensors is read as that file, another as a keras-hub
        # preset (the library names what it lacks otherwise).
        if not (os.path.isfile(path) or os.path.isdir(path)):
            raise FileNotFoundError(f"No checkpoint file at {path}.")
        check_readable(path, f"The checkpoint {'folder' if os.path.isdir(path) else 'file'} "
                             f"{path}")


def check_class_names_file(args):
    """Refuses a `--class-names` file that does not exist or is a folder, with the message
    reading it gives (checked before TensorFlow starts)."""
    name = getattr(args, "class_names", None)
    if not name:
        return
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        raise ValueError(f"--class-names {name} is a folder. {CLASS_NAMES_EXPECTED}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"Class-names file {path} does not exist.")
    if not os.path.isfile(path):  # reading a FIFO could wait forever
        raise ValueError(f"--class-names {name} is not a regular file (a FIFO, socket or "
                         f"device). {CLASS_NAMES_EXPECTED}")
    check_readable(path, f"Class-names file {path}")


def check_data_folder(args):
    """Refuses a `--folder` that does not exist or is not a folder, with the message reading it
    gives (checked before TensorFlow starts)."""
    folder = getattr(args, "folder", None)
    if folder is not None and not os.path.isdir(folder):
        raise FileNotFoundError(f"Image folder {folder!r} does not exist or is not a directory.")
    if folder is not None and not os.access(folder, os.R_OK | os.X_OK):
        raise PermissionError(f"Image folder {folder!r} cannot be read (permission denied). "
                              "Expected a folder this user may list and read.")


def check_choice(flag, value, choices):
    """Refuses a flag's value that is not one of `choices` (`library_names`: the library's own
    list, read without TensorFlow)."""
    if value not in choices:
        raise ValueError(f"{flag} {value!r} is not one of {', '.join(choices)}.")


def check_strategy(args):
    """`--strategy`, before TensorFlow starts (`keras_vit.parallel.tf_distribute`'s names)."""
    if getattr(args, "cpu_replicas", None) and args.strategy != "mirrored":
        raise ValueError(f"--cpu-replicas {args.cpu_replicas} splits the CPU for --strategy "
                         f"mirrored; --strategy is {args.strategy!r}. Expected --strategy "
                         "mirrored with it.")
    check_choice("--strategy", args.strategy,
                 library_names("parallel/tf_distribute.py", "STRATEGIES"))


def check_precision(args):
    """`--precision`, before TensorFlow starts (`keras_vit.execution.PRECISIONS`)."""
    check_choice("--precision", args.precision, library_names("execution.py", "PRECISIONS"))


def check_new_file(flag, path, overwrite, what):
    """Refuses an output file path that is a folder, a symbolic link, inside a folder a running
    keras_vit job holds, or (without `overwrite`) an existing file: `keras_vit.fileio`'s rules,
    checked before TensorFlow starts."""
    check_output_file(flag, path, what)
    library_module("fileio").check_destination(os.path.expanduser(path), overwrite)


def _check_parents(flag, path):
    """Refuses an output path below a file (`afile/sub`): the nearest of its folders that
    exists must be a folder."""
    parent = os.path.dirname(os.path.abspath(os.path.expanduser(path)))
    while not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if os.path.lexists(parent) and not os.path.isdir(parent):
        kind = "a symbolic link to no folder" if os.path.islink(parent) else "a file"
        raise ValueError(f"{flag} {path} lies below {parent}, which is {kind}, not a folder. "
                         "Expected a path whose folders are folders (or new names).")


def _check_named(flag, path, expected):
    """Refuses an empty output path (`--out ""`), which names nothing."""
    if not path:
        raise ValueError(f"{flag} is empty; expected {expected}.")


def check_output_file(flag, path, what):
    """Refuses an output file path that is an existing folder (`what`: the file, for the
    message), or below a file."""
    _check_named(flag, path, f"a file path for {what}")
    if os.path.isdir(os.path.expanduser(path)):
        raise ValueError(f"{flag} {path} is a folder; expected a file path for {what}.")
    _check_parents(flag, path)


def check_output_folder(flag, path, what):
    """Refuses an output folder path that is an existing file (`what`: the folder's contents,
    for the message), or below a file."""
    _check_named(flag, path, f"a folder for {what}")
    _check_parents(flag, path)
    path_ = os.path.expanduser(path)
    if os.path.exists(path_) and not os.path.isdir(path_):
        raise ValueError(f"{flag} {path} is a file; expected a folder (or a new name) for "
                         f"{what}.")


def check_model_flag_conflicts(args):
    """The model flags that contradict each other or name nothing (an unknown variant, unknown
    `--model-config` keys), without a file read or TensorFlow: checked before it starts, and
    before the input files."""
    config = getattr(args, "model_config", None)
    if config is not None:
        known = library_arguments("model.py", "ViT")
        unknown = sorted(set(config) - set(known))
        if unknown:
            raise ValueError(f"--model-config: unknown keys {unknown}. Expected keras_vit.ViT "
                             f"arguments: {', '.join(sorted(known))}.")
    model = getattr(args, "model", None)
    if getattr(args, "model_config", None) is not None and model:
        raise ValueError("--model and --model-config both describe the architecture. "
                         "Expected one of them.")
    if model and not model.endswith(".keras"):
        library_module("configs").get_variant(model)  # an unknown variant names the known
    if model and model.endswith(".keras") and getattr(args, "weights", None) == DEFAULT_WEIGHTS:
        raise ValueError(f"--weights {DEFAULT_WEIGHTS} needs a variant --model; a .keras file "
                         "holds its own weights.")


CLASS_NAMES_EXPECTED = "Expected a UTF-8 text file with one class name a line."


def check_run_flags(args):
    """The run flags of `train` and `pretrain` that need no TensorFlow: checked before it
    starts, and again by `start_run`."""
    if args.folder and args.validation_split not in ("validation", "none"):
        raise ValueError(f"--validation-split {args.validation_split!r} with --folder: expected "
                         "'validation' (a held-out 10%) or 'none'.")
    check_output_folder("--output", args.output, "the run")
    check_precision(args)
    check_strategy(args)
