"""Which exceptions are the user's to fix, and the one line the command line prints for them."""

import re
import sys

USAGE_ERROR = 2
FAILURE = 1
# The longest error line the command line prints: a message quoting a huge argument keeps its
# start and its end (what was expected) around "...".
MAX_LINE = 1200
# TensorFlow op errors that bad input causes (an undecodable image, a missing file in a
# pipeline), by class name: TensorFlow is not imported here.
_TF_INPUT_ERRORS = ("InvalidArgumentError", "NotFoundError", "UnknownError",
                    "FailedPreconditionError", "OutOfRangeError", "DataLossError")


# The loader's words for a shared library that does not fit in memory or the address space.
_MAPPING_FAILED = re.compile(r"failed to map segment|cannot allocate memory|cannot map zero-fill",
                             re.IGNORECASE)


def first_line_of(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def one_line(message):
    """`message` as one line of at most `MAX_LINE` characters."""
    line = re.sub(r"\s*[\r\n]+\s*", " ", str(message).strip())
    if len(line) <= MAX_LINE:
        return line
    head = MAX_LINE * 2 // 3
    return f"{line[:head]} ... {line[-(MAX_LINE - head - 5):]}"


def describe(error):
    """`(message, exit status)` for an error the user can fix, or `(None, None)` for a bug
    (which the command line reports as an internal error, with its traceback under --debug)."""
    tf = sys.modules.get("tensorflow")
    training = sys.modules.get("keras_vit.training.loop")
    if training is not None and isinstance(error, training.TrainingDiverged):
        return str(error), FAILURE
    if isinstance(error, (ValueError, OSError)):
        return str(error) or type(error).__name__, USAGE_ERROR
    if isinstance(error, ImportError) and _MAPPING_FAILED.search(str(error)):
        return (f"not enough memory to load a library ({first_line_of(error)}): the "
                "address-space limit (ulimit -v) or the machine's free memory is below what "
                "TensorFlow needs to start. Expected a limit of a few GB or none."), USAGE_ERROR
    missing = error if isinstance(error, ModuleNotFoundError) else error.__cause__
    if isinstance(error, ImportError) and isinstance(missing, ModuleNotFoundError) \
            and not (missing.name or "keras_vit").startswith("keras_vit"):
        return f"{error} (a package this command needs is not installed)", USAGE_ERROR
    out_of_memory = isinstance(error, MemoryError) or (
        tf is not None and isinstance(error, tf.errors.ResourceExhaustedError))
    if out_of_memory:
        tensor = re.search(r"allocating tensor with shape\[[^\]]*\]", str(error))
        return (f"out of memory{' ' + tensor[0] if tensor else ''}. Expected a smaller model, "
                "image size, number of classes or batch size."), USAGE_ERROR
    if tf is not None and type(error).__name__ in _TF_INPUT_ERRORS \
            and isinstance(error, tf.errors.OpError):
        from keras_vit.images import first_line  # TensorFlow is loaded by now

        return first_line(error.message), USAGE_ERROR
    return None, None
