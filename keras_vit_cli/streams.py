"""The standard streams of a command: a closed one becomes the null device (the command does
its work and its output is dropped, as with `> /dev/null`), and a failed write to standard
output (a full disk, `> /dev/full`) is one error that says so."""

import contextlib
import errno
import os
import sys

_STREAMS = ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w"))


class StandardOutputError(OSError):
    """Standard output cannot be written (other than a reader that has gone: BrokenPipeError)."""

    def __str__(self):
        return f"cannot write to standard output: {self.strerror}"


def open_closed_streams():
    """Opens the null device on each of file descriptors 0, 1 and 2 that is closed (`>&-`), so
    that neither the command's output nor a file it opens lands on them."""
    for fd, name, mode in _STREAMS:
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        if getattr(sys, name) is None:  # Python found it closed at start
            setattr(sys, name, open(fd, mode, closefd=False, errors="backslashreplace"))
    for name in ("stdout", "stderr"):  # a character the encoding lacks (PYTHONIOENCODING=ascii)
        with contextlib.suppress(AttributeError, ValueError):  # not a text stream Python opened
            getattr(sys, name).reconfigure(errors="backslashreplace")


class _CheckedOutput:
    """Standard output whose failed writes raise StandardOutputError."""

    def __init__(self, stream):
        self._stream = stream

    def _call(self, method, *args):
        try:
            return getattr(self._stream, method)(*args)
        except BrokenPipeError:
            raise
        except OSError as error:
            raise StandardOutputError(error.errno or errno.EIO,
                                      error.strerror or str(error)) from None

    def write(self, text):
        return self._call("write", text)

    def writelines(self, lines):
        return self._call("writelines", lines)

    def flush(self):
        return self._call("flush")

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def checked_stdout():
    """Standard output, for the block, as `_CheckedOutput`; flushed at the end, inside it."""
    stream = sys.stdout
    sys.stdout = _CheckedOutput(stream)
    try:
        yield
        sys.stdout.flush()
    finally:
        sys.stdout = stream


def discard_stdout():
    """Points standard output at the null device: what is still buffered is dropped instead of
    failing again when the interpreter flushes at exit."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no file descriptor
        fd = sys.stdout.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
