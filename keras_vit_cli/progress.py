"""What a long command says on standard error while it works, as git does for its progress:

- one line per stage (`keras-vit export: tracing the signatures`), so that a slow step is
  never silent, and a bar where the count is known (images predicted, evaluated);
- both on a terminal only: standard error that goes to a file, a pipe or a test holds the
  errors alone (one line each, as the error conventions promise). `--progress` prints the
  stage lines there too (a CI log); a bar is drawn on a terminal only, since one redrawn into
  a file is noise;
- nothing at all under `--quiet` (errors still print).

Standard output keeps the command's result alone (`keras-vit predict ... > top5.txt`); a bar a
library draws on standard output (Keras' `Progbar`) is moved to standard error
(`bars_on_stderr`).
"""

import contextlib
import sys


def add_progress_arguments(parser):
    """`--quiet` and `--progress`, which exclude each other."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quiet", "-q", action="store_true",
                       help="print no progress on stderr; errors still show")
    group.add_argument("--progress", action="store_true",
                       help="print the stage lines on stderr even when it is not a terminal "
                            "(a log); bars show on a terminal only")


def _is_terminal(stream):
    try:
        return stream.isatty()
    except (AttributeError, OSError, ValueError):  # a closed or replaced stream
        return False


class Progress:
    """The progress of one command run: `stage(text)` lines and `bar(...)` bars on stderr.

    Args:
        command: str. The command's name, the prefix of each line.
        quiet: bool. Print nothing.
        forced: bool. Print the stage lines even when stderr is not a terminal.
    """

    def __init__(self, command, quiet=False, forced=False):
        self.command = command
        self.quiet = bool(quiet)
        self.forced = bool(forced)

    @classmethod
    def of(cls, args):
        """The progress of the parsed command `args` (its `--quiet` and `--progress`)."""
        return cls(args.command, getattr(args, "quiet", False), getattr(args, "progress", False))

    @property
    def bars(self):
        """Whether bars show: not quiet, and standard error is a terminal."""
        return not self.quiet and _is_terminal(sys.stderr)

    @property
    def stages(self):
        """Whether stage lines show: not quiet, and stderr is a terminal or `forced`."""
        return not self.quiet and (self.forced or _is_terminal(sys.stderr))

    def stage(self, text):
        """One line on stderr saying what the command does next (flushed at once)."""
        if self.stages:
            print(f"keras-vit {self.command}: {text}", file=sys.stderr, flush=True)

    def bar(self, total, unit):
        """A bar counting `total` `unit`s (`.update(n)` as they are done; a context manager):
        tqdm's on a terminal, else one that draws nothing."""
        if not self.bars:
            return _NoBar()
        from tqdm import tqdm  # a dependency of huggingface_hub's and tensorflow-datasets'

        return tqdm(total=total, unit=f" {unit}", file=sys.stderr, leave=False,
                    dynamic_ncols=True)


class _NoBar:
    """A bar that draws nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def update(self, n=1):
        pass


@contextlib.contextmanager
def bars_on_stderr():
    """Standard output is standard error for the block: a library's bar (Keras' `Progbar`
    prints on standard output) stays out of the command's result."""
    with contextlib.redirect_stdout(sys.stderr):
        yield
