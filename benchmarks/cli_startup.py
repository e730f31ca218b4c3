"""Start-up time of the command line: wall time of each command in a fresh process.

    python -m benchmarks.cli_startup [--rounds 5]

Runs `keras-vit --help`, `keras-vit models`, `keras-vit train --help` (none of which imports
TensorFlow) and, for reference, `python -c "import tensorflow"`, interleaved; prints the median
and the range of each.
"""

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "keras-vit --help": [sys.executable, "-m", "keras_vit", "--help"],
    "keras-vit models": [sys.executable, "-m", "keras_vit", "models"],
    "keras-vit train --help": [sys.executable, "-m", "keras_vit", "train", "--help"],
    "python -c 'import tensorflow'": [sys.executable, "-c", "import tensorflow"],
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    times = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, command in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            times[name].append(time.perf_counter() - start)
    for name, values in times.items():
        print(f"{name:32} median {statistics.median(values):6.2f} s  "
              f"(min {min(values):.2f}, max {max(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
