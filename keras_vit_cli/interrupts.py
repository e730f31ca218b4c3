"""SIGINT, SIGTERM and SIGHUP end every command the same way: the command stops at the next
Python step with a KeyboardInterrupt, so that what it was writing is removed by the code that
writes it, and the command line exits with 130 (SIGINT), 143 (SIGTERM) or 129 (SIGHUP) without
a traceback.

Two places would lose a KeyboardInterrupt raised straight from the signal handler: an import
(a library that imports an optional package under a bare `except` keeps a half-imported
module) and a garbage-collection or other callback (Python prints the exception as "ignored"
and goes on). So a signal that arrives while `deferred()` holds (the imports of TensorFlow and
Keras) is raised when it ends, and one swallowed by a callback (reported to `sys.unraisablehook`)
is raised again at the next function call or return (so is one that C code reported as a
SystemError). A signal the process ignored at start (a shell's background job ignores SIGINT)
stays ignored.

Python runs a signal handler between two of its own steps only: a long call into C (importing
TensorFlow, tracing or compiling a graph, a TensorFlow op) would hold the signal until it
returns. So a watcher thread hears each signal at once (`signal.set_wakeup_fd`); if the
KeyboardInterrupt has not been raised `STOP_WITHIN` seconds later, or a second signal comes,
the command stops there: `on_stuck()` (the command line's: remove what this process was
writing, and say what was kept and how to resume) runs, its line is written to the standard
error the command started with, and the process exits with the signal's status. What it was
writing is never under a final name (`keras_vit.fileio` renames complete files into place),
and what a stopped writer leaves elsewhere is removed by the next writer.
"""

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time

# The exit status of a command a signal ended: 128 + the signal's number, as a shell reports.
# SIGHUP (a closed terminal or session) ends a command as SIGTERM does.
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}
WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
if hasattr(signal, "SIGHUP"):  # not on Windows
    EXIT_STATUS[signal.SIGHUP] = 129
    WORDS[signal.SIGHUP] = "hung up"
# Seconds a signal waits for Python to raise its KeyboardInterrupt before the command stops
# without it (the command line's promise: an interrupt is taken within a second or two).
STOP_WITHIN = 1.0


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
        # Called (from the watcher thread) before the process stops without its
        # KeyboardInterrupt: returns the command's last line.
        self.on_stuck = None
        self._ended = threading.Event()
        self._held = False  # signals wait for `release()` (`installed(held=True)`)

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

    def release(self):
        """Ends the hold of `installed(held=True)`: a signal received since is raised now (the
        caller is inside the `try` that reports it)."""
        if self._held:
            self._held = False
            self._deferred -= 1
            self.raise_pending()

    @contextlib.contextmanager
    def installed(self, held=False):
        """The handlers for the block, and the previous ones restored after it (the command
        line may run inside another program, a test); none outside the main thread. With
        `held`, a signal waits for `release()`: one that comes while the handlers are being
        set up is raised where the command reports it."""
        if held and not self._held:
            self._held = True
            self._deferred += 1
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
            with self._watched():
                yield self
        finally:
            sys.unraisablehook = self._previous_hook
            if sys.getprofile() == self._raise_at_next_call:
                sys.setprofile(None)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def _watched(self):
        """The watcher thread for the block: it hears every signal as it arrives."""
        heard, wakeup = socket.socketpair()
        wakeup.setblocking(False)
        # Standard error as it is now: the start of TensorFlow points file descriptor 2
        # elsewhere for a while.
        self._stderr = os.dup(2)
        previous = signal.set_wakeup_fd(wakeup.fileno(), warn_on_full_buffer=False)
        watcher = threading.Thread(target=self._watch, args=(heard,), daemon=True,
                                   name="keras-vit-interrupts")
        watcher.start()
        try:
            yield
        finally:
            signal.set_wakeup_fd(previous)
            self._ended.set()
            wakeup.send(b"\0")  # not a signal's number: the watcher ends
            watcher.join()
            heard.close()
            wakeup.close()
            os.close(self._stderr)

    def _watch(self, heard):
        """The watcher thread: stops the process if a signal's KeyboardInterrupt is not raised
        within `STOP_WITHIN` seconds, or at a second signal."""
        first, deadline = None, None
        while True:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([heard], [], [], timeout)[0]:  # the first signal's time is up
                if not (self._raised or self._ended.is_set()):
                    self._stop(first)
                deadline = None  # taken: only a second signal stops the command now
                continue
            for number in heard.recv(64):
                if not number or self._ended.is_set():
                    return
                if number not in EXIT_STATUS:
                    continue
                if first is not None:
                    self._stop(first)
                first, deadline = signal.Signals(number), time.monotonic() + STOP_WITHIN

    def _stop(self, signum):
        """Ends the process now, with the status of `signum`, after `on_stuck`."""
        if self.received is None:
            self.received = signum
        try:
            line = self.on_stuck() if self.on_stuck is not None else self.words()
        except Exception:  # noqa: BLE001 - the process stops either way, with its status
            line = self.words()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            os.write(self._stderr, (line + "\n").encode(errors="backslashreplace"))
        os._exit(self.status())

    def status(self):
        """The exit status for the signal received (130 for an interrupt of the user's own)."""
        return EXIT_STATUS.get(self.received, EXIT_STATUS[signal.SIGINT])

    def words(self):
        return WORDS.get(self.received, WORDS[signal.SIGINT])
