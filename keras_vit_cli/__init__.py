"""The `keras-vit` command line: `keras-vit COMMAND --help` for each command.

A dispatcher and one module per command group. Only the module of the command that runs is
imported, and the command modules import the library (and so TensorFlow) inside their `run`
functions: `keras-vit --help`, `keras-vit COMMAND --help`, `keras-vit models` and
`keras-vit checkpoints` start without TensorFlow. A command's `check(args)`, beside its
`configure` and `run`, refuses bad inputs before TensorFlow starts: input files and folders,
output paths, and the flags' values that need no model. Every command takes its model the same
way (`keras_vit_cli.common`); the long ones say what they do on stderr
(`keras_vit_cli.progress`), and a signal ends any of them within a second or two, with a line
that says what was kept and how to resume (`keras_vit_cli.interrupts`).

Errors a user can fix (a missing file, a bad value, a checkpoint that does not fit, a full
disk) print one `keras-vit COMMAND: error: ...` message, without a traceback, and exit with
status 2; any other error (a bug) prints one line too and exits with status 1. `--debug`, on
every command, shows the full traceback instead. A command that fails removes the output
folders it created and left empty.
"""

import argparse
import contextlib
import importlib
import os
import shlex
import shutil
import sys
import tempfile
import warnings

from keras_vit_cli.catalog import library_module
from keras_vit_cli.arguments import select_backend
from keras_vit_cli.errors import FAILURE, USAGE_ERROR, describe, one_line
from keras_vit_cli.interrupts import Interrupts
from keras_vit_cli.streams import (
    StandardOutputError,
    checked_stdout,
    discard_stdout,
    open_closed_streams,
)

# Command name -> (module, one-line help). The modules stay unimported until their command runs.
COMMANDS = {
    "models": ("keras_vit_cli.models",
               "list every ViT variant with its configuration, parameters and GFLOPs"),
    "checkpoints": ("keras_vit_cli.checkpoints",
                    "list the pretrained checkpoints (timm's ViTs included) matching a name, "
                    "variant, tag or pattern: variant, resolution, classes, top-1, size, data, "
                    "and each variant's default"),
    "predict": ("keras_vit_cli.predict", "classify images and print the top classes"),
    "convert": ("keras_vit_cli.convert",
                "turn a checkpoint into a .keras model, .weights.h5, .npz (official layout) or "
                "timm's .safetensors file"),
    "train": ("keras_vit_cli.train",
              "train or fine-tune a ViT with the paper's recipe (resumes after a crash)"),
    "pretrain": ("keras_vit_cli.pretrain",
                 "self-supervised pre-training of a ViT encoder by masked patch prediction"),
    "vtab": ("keras_vit_cli.vtab",
             "VTAB-1k: fine-tune on each of 19 tasks' 1,000 examples, the paper's table"),
    "evaluate": ("keras_vit_cli.evaluate",
                 "top-1/top-5 accuracy, loss, per-class accuracy and confusion matrix"),
    "fewshot": ("keras_vit_cli.evaluate",
                "few-shot linear accuracy of frozen features (the paper's second metric)"),
    "export": ("keras_vit_cli.export",
               "export a classifier as a TF Serving SavedModel, a TFLite file or an ONNX file"),
    "inspect": ("keras_vit_cli.inspection",
                "draw attention maps and the paper's Figure 7 for a model on some images"),
}


def _chosen_command(argv):
    """The command named in `argv`, if any (the first argument that is not an option)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose help and usage lines reach their stream or fail: argparse itself
    drops an OSError of that write (`--help > /dev/full` would exit 0 having printed nothing)."""

    def _print_message(self, message, file=None):
        if not message:
            return
        file = file or sys.stderr
        try:
            file.write(message)
            file.flush()
        except OSError:
            if file is sys.stdout:
                raise
            # Standard error itself cannot be written: nowhere to say so; the status says it.


def build_parser(argv=()):
    """The parser: every command's name and help, and the arguments of the command named in
    `argv` only (only its module is imported)."""
    parser = _Parser(prog="keras-vit",
                                     description="Vision Transformer models for Keras 3.")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="keras-vit COMMAND --help shows its flags")
    chosen = _chosen_command(argv)
    for name, (module, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        # Here too, after the command; SUPPRESS keeps the top-level flag when it is left out.
        command_parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                    help=DEBUG_HELP)
        if name == chosen:
            # (configure, run) or (configure, run, check): `check(args)` looks at the input
            # files and flags without TensorFlow, before it starts.
            configure, run, *check = importlib.import_module(module).COMMANDS[name]
            configure(command_parser)
            command_parser.set_defaults(run=run, check=check[0] if check else None)
    return parser


# Commands that never need TensorFlow.
LIGHT_COMMANDS = ("models", "checkpoints")
# Commands whose interrupted run the same command resumes.
RESUMABLE = ("train", "pretrain", "vtab")
# The exit status of a command whose standard output was closed by its reader (128 + SIGPIPE).
CLOSED_PIPE = 141
DEBUG_HELP = "on an error, show the full traceback (for a bug report) instead of one line"
# The arguments that name an output folder or file a command may create.
OUTPUT_ARGUMENTS = ("output", "out")


def _quiet_tensorflow():
    """Keeps TensorFlow's C++ INFO and WARNING lines out of the output (errors still show; a
    level the user set is kept)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# What Keras' import (which TensorFlow's makes) takes where installed and no command uses:
# scikit-learn, for Keras' scikit-learn wrappers, which it leaves out where the import fails.
# (SciPy, which TensorFlow's legacy `tf.keras` also takes, stays: JAX needs it.)
UNUSED_IMPORTS = ("sklearn",)


@contextlib.contextmanager
def _unused_imports_hidden():
    """While the block runs, importing `UNUSED_IMPORTS` fails as if they were not installed;
    afterwards they import as usual."""
    hidden = [name for name in UNUSED_IMPORTS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # Python's own way to make an import fail
    try:
        yield
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def _start_tensorflow_quietly():
    """Imports TensorFlow and finds its devices with the C++ start-up lines (oneDNN, CUDA
    probing) kept out of stderr: absl prints them before its logging starts, where
    TF_CPP_MIN_LOG_LEVEL does not reach. Shown after all if the import fails."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            with _unused_imports_hidden():
                import keras  # noqa: F401 - TensorFlow imports it, and the command next
                import tensorflow as tf  # the import the command would make next

            tf.config.list_physical_devices()
        except Exception:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _new_folders(args):
    """The folders an output argument names that do not exist yet (the deepest first)."""
    new = []
    for name in OUTPUT_ARGUMENTS:
        value = getattr(args, name, None)
        path = os.path.abspath(os.path.expanduser(value)) if isinstance(value, str) else None
        while path and not os.path.exists(path):
            new.append(path)
            path = os.path.dirname(path)
    return new


def _remove_empty(folders):
    """Removes the folders of `folders` (deepest first) that a failed command left empty."""
    for folder in folders:
        if os.path.isdir(folder):  # fileio by path: a light command does not import Keras
            library_module("fileio").remove_if_unused(folder)


def _bug(error):
    """The one line for an error that is not the user's to fix."""
    text = str(error).strip().splitlines()
    return (f"internal error: {type(error).__name__}{': ' + text[0] if text else ''}. This is "
            "a bug in keras_vit: run the command again with --debug for the traceback, and "
            "report it.")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    open_closed_streams()
    _quiet_tensorflow()
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as done:  # --help or a usage error: argparse has printed
        if done.code in (0, None) and _flushed(0) != 0:
            return USAGE_ERROR  # the help did not reach standard output: said in one line
        raise
    except BrokenPipeError:  # the reader of --help has gone (`| head`)
        discard_stdout()
        return 0
    except OSError as error:  # standard output (or error) cannot be written
        return _flushed(error)
    args.argv = argv
    previous, warnings.showwarning = warnings.showwarning, _one_line_warning(args.command)
    try:
        with Interrupts().installed(held=True) as interrupts:
            return _run(args, interrupts)
    finally:
        warnings.showwarning = previous


def _one_line_warning(command):
    """`warnings.showwarning` for the command line: one line, `keras-vit COMMAND: warning: ...`
    (no file name, line number or source line)."""
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"keras-vit {command}: warning: {one_line(message)}",
              file=file or sys.stderr)
    return show


def _flushed(status):
    """`status` once standard output is flushed; a failed flush (a full disk, `> /dev/full`),
    or `status` such an error, is one line and status 2, as for every command."""
    try:
        if isinstance(status, OSError):
            raise status
        sys.stdout.flush()
    except BrokenPipeError:
        discard_stdout()
        return status
    except OSError as error:
        discard_stdout()
        print(f"keras-vit: error: {StandardOutputError(error.errno, error.strerror)}",
              file=sys.stderr)
        return USAGE_ERROR
    return status if isinstance(status, int) else (0 if status is None else USAGE_ERROR)


def _run(args, interrupts):
    """Runs the parsed command: its exit status, with its errors reported as one line."""
    new_folders = _new_folders(args)
    interrupts.on_stuck = lambda: _stopped_in_a_long_call(args, interrupts, new_folders)
    try:
        interrupts.release()  # a signal that came while the handlers were set up, if any
        with checked_stdout():
            if getattr(args, "check", None) is not None:
                args.check(args)  # a missing input file is reported before TensorFlow starts
            with interrupts.deferred():  # a signal during the imports is raised after them
                select_backend(getattr(args, "backend", None))  # before TensorFlow imports Keras
                if args.command not in LIGHT_COMMANDS or getattr(args, "time", False):
                    _start_tensorflow_quietly()
            status = args.run(args) or 0
            interrupts.raise_pending()  # a signal whose KeyboardInterrupt something swallowed
        return status
    except KeyboardInterrupt:
        _remove_empty(new_folders)
        if args.debug:
            raise
        print(_interrupted_line(args, interrupts), file=sys.stderr)
        return interrupts.status()
    except Exception as error:  # noqa: BLE001 - one line, or the traceback with --debug
        _remove_empty(new_folders)
        if interrupts.received is not None and not args.debug:
            # A library caught the signal's KeyboardInterrupt half-way and failed on its
            # own state: the command still ended because of the signal.
            print(f"keras-vit {args.command}: {interrupts.words()}", file=sys.stderr)
            return interrupts.status()
        if isinstance(error, BrokenPipeError) and _stdout_closed():
            return _stopped_by_closed_pipe()
        if isinstance(error, StandardOutputError):
            discard_stdout()
        if args.debug:
            raise
        message, status = describe(error)
        if message is None:
            message, status = _bug(error), FAILURE
        print(f"keras-vit {args.command}: error: {one_line(message)}", file=sys.stderr)
        return status


def _interrupted_line(args, interrupts):
    """The last line of a command a signal ended: what it was, what was kept, how to resume."""
    return f"keras-vit {args.command}: {interrupts.words()}{_resume_text(args)}"


def _stopped_in_a_long_call(args, interrupts, new_folders):
    """Before the process stops in a long call that held the signal (`Interrupts.on_stuck`):
    removes the temporaries this process was writing beside its outputs and the output
    folders it created and left empty. Returns the command's last line."""
    for folder in _output_folders(args):
        _remove_own_temporaries(folder)
    _remove_empty(new_folders)
    return _interrupted_line(args, interrupts)


def _output_folders(args):
    """The folders an output argument names and the folders they are in (where a write's
    temporary lies)."""
    folders = []
    for name in OUTPUT_ARGUMENTS:
        value = getattr(args, name, None)
        if isinstance(value, str):
            path = os.path.abspath(os.path.expanduser(value))
            folders += [path, os.path.dirname(path)]
    return [folder for folder in dict.fromkeys(folders) if os.path.isdir(folder)]


def _remove_own_temporaries(folder):
    """Removes the temporary files and folders this process was writing in `folder`
    (`keras_vit.fileio`'s "tmp" names with this host and process id), nothing else: not the
    "old" folder a replacement is moving aside, which holds the user's previous version."""
    fileio = library_module("fileio")
    for entry in os.listdir(folder):
        if not fileio.is_own_temporary(entry):
            continue
        path = os.path.join(folder, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)


def _resume_text(args):
    """For an interrupted run (`train`, `pretrain`, `vtab`): what it kept and the command that
    resumes it, as the rest of the one line; else nothing."""
    if args.command not in RESUMABLE or not getattr(args, "output", None):
        return ""
    command = shlex.join(["keras-vit", *getattr(args, "argv", [args.command])])
    if args.command == "vtab":
        return (f"; the finished tasks in {args.output} are kept, and the same command goes on "
                f"from them: {command}")
    epoch = 0
    callbacks = sys.modules.get("keras_vit.training.callbacks")  # loaded once the run started
    if callbacks is not None:
        try:
            epoch = callbacks.resume_epoch(callbacks.backup_dir(args.output))
        except (OSError, ValueError):  # an unreadable backup: the next run names the problem
            epoch = 0
    if epoch:
        return (f"; the backup of epoch {epoch} is kept in "
                f"{callbacks.backup_dir(args.output)}, and the same command resumes from it: "
                f"{command}")
    return (f"; no epoch had finished, so nothing was kept: the same command starts again: "
            f"{command}")


def _stdout_closed():
    """Whether the reader of standard output has gone (`keras-vit checkpoints | head`): the
    pipe reports an error to a writer (POSIX `poll`)."""
    try:
        import select

        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), no file descriptor
        return False


def _stopped_by_closed_pipe():
    """Ends quietly, as a shell command stopped by SIGPIPE does (status 128 + 13): the rest of
    the output is discarded instead of failing again when the interpreter flushes at exit."""
    discard_stdout()
    return CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(main())
