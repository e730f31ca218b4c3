"""SIGINT and SIGTERM end every command the same way: the command stops at the next Python
step with a KeyboardInterrupt, so that what it was writing is removed by the code that writes
it, and the command line exits with 130 (SIGINT) or 143 (SIGTERM) without a traceback.

Two places would lose a KeyboardInterrupt raised straight from the signal handler: an import
(a library that imports an optional package under a bare `except` keeps a half-imported
module) and a garbage-collection or other callback (Python prints the exception as "ignored"
and goes on). So a signal that arrives while `deferred()` holds (the imports of TensorFlow and
Keras) is raised when it ends, and one swallowed by a callback (reported to `sys.unraisablehook`)
is raised again at the next function call or return (so is one that C code reported as a
SystemError). A signal the process ignored at start (a shell's background job ignores SIGINT)
stays ignored.
"""

import contextlib
import signal
import sys

# The exit status of a command a signal ended: 128 + the signal's number, as a shell reports.
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}
WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


def _is_interrupt(error):
    """Whether `error` is a KeyboardInterrupt or an error it caused (C code that was calling
    Python when the KeyboardInterrupt came reports a SystemError with it as the cause)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


class Interrupts:
    """The signal handlers of one command run; `received` is the first signal (or None)."""

    def __init__(self):
        self.received = None
        self._deferred = 0
        self._raised = False  # a KeyboardInterrupt for `received` is on its way up

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
        if not self._deferred and not self._raised:
            self._raised = True
            raise KeyboardInterrupt

    def _unraisable(self, unraisable):
        if self.received is not None and _is_interrupt(unraisable.exc_value):
            self._raised = False  # swallowed by a callback: raised again at the next call
            sys.setprofile(self._raise_at_next_call)
            return
        self._previous_hook(unraisable)

    def _raise_at_next_call(self, frame, event, arg):
        """A profile function (this thread's) for the first call or return after the hook."""
        if frame.f_code is Interrupts._unraisable.__code__:
            return
        sys.setprofile(None)
        self.raise_pending()

    @contextlib.contextmanager
    def deferred(self):
        """A signal arriving inside raises when the block ends (or on the block's own error)."""
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1
        self.raise_pending()

    def raise_pending(self):
        """Raises KeyboardInterrupt for a signal received and not raised yet."""
        if self.received is not None and not self._raised:
            self._raised = True
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self):
        """The handlers for the block, and the previous ones restored after it (the command
        line may run inside another program, a test); none outside the main thread."""
        try:
            previous = {sig: signal.getsignal(sig) for sig in EXIT_STATUS}
            for sig, handler in previous.items():
                if handler is not signal.SIG_IGN:
                    signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: signals stay as they are
            yield self
            return
        self._previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        try:
            yield self
        finally:
            sys.unraisablehook = self._previous_hook
            if sys.getprofile() == self._raise_at_next_call:
                sys.setprofile(None)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def status(self):
        """The exit status for the signal received (130 for an interrupt of the user's own)."""
        return EXIT_STATUS.get(self.received, EXIT_STATUS[signal.SIGINT])

    def words(self):
        return WORDS.get(self.received, WORDS[signal.SIGINT])
