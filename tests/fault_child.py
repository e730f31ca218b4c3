"""The command line with a fault injected, for tests/test_faults.py: the process is killed
(SIGKILL) or paused just before it renames a file into place under a given name. Every file
keras_vit writes is renamed into place (`keras_vit.fileio`), and Python's audit hooks see each
rename, so the faults fall between two of keras_vit's writes without touching its code.

    python tests/fault_child.py kill NAME COUNT -- keras-vit arguments...
    python tests/fault_child.py pause NAME COUNT MARKER -- keras-vit arguments...

The COUNT-th rename to a file called NAME kills the process, or writes MARKER and waits
(at most a few minutes) until MARKER is removed, then goes on.
"""

import os
import signal
import sys
import time

PAUSE_LIMIT = 300  # seconds a paused child waits for its marker to go


def main():
    split = sys.argv.index("--")
    action, name, count, *marker = sys.argv[1:split]
    argv = sys.argv[split + 1:]
    seen = []

    def hook(event, args):
        if event != "os.rename" or os.path.basename(os.fspath(args[1])) != name:
            return
        seen.append(args[1])
        if len(seen) != int(count):
            return
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        with open(marker[0], "w") as f:
            f.write(str(os.getpid()))
        deadline = time.monotonic() + PAUSE_LIMIT
        while os.path.exists(marker[0]) and time.monotonic() < deadline:
            time.sleep(0.05)

    sys.addaudithook(hook)
    from keras_vit_cli import main as cli_main

    sys.exit(cli_main(argv))


if __name__ == "__main__":
    main()
