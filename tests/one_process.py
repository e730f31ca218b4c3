"""Several test scripts in one fresh interpreter: each script's printed output and error, by
name. A test whose subject needs a process of its own setting (the Keras backend, the device
count) shares one with the other scripts of that setting, instead of importing TensorFlow,
JAX and keras_vit once per script."""

import json
import os
import subprocess
import sys

# Runs the scripts of the JSON on stdin in turn, each as `__main__` with its own argv and
# globals, its printed lines captured, its exception kept as a traceback (what survives the
# collection after each is frozen, as tests/conftest.py does after each test); then prints
# the results as one JSON line after a marker.
DRIVER = """
import contextlib, gc, io, json, sys, traceback
import keras

gc.freeze()  # as tests/conftest.py: Keras' full collections scan only what scripts create
results = {}
for name, (code, argv) in json.loads(sys.stdin.read()).items():
    printed = io.StringIO()
    sys.argv = ["-c", *argv]
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, name, "exec"), {"__name__": "__main__"})
        error = None
    except BaseException:
        error = traceback.format_exc()
    finally:
        keras.backend.clear_session()
        keras.config.set_dtype_policy("float32")
        gc.freeze()
    results[name] = dict(stdout=printed.getvalue(), error=error)
print("\\n" + MARKER + json.dumps(results))
"""
MARKER = "one_process results: "


class Results(dict):
    """The scripts' results by name: `results.stdout(name)` is what a script printed, after
    asserting that it raised nothing."""

    def stdout(self, name):
        result = self[name]
        assert result["error"] is None, f"{name}:\n{result['error'][-3000:]}"
        return result["stdout"]


def run_scripts(scripts, env=None, timeout=900):
    """Runs `scripts` ({name: (code, [argument, ...])}) in one fresh interpreter with the
    environment `env` (this one's by default). Returns their `Results`."""
    code = DRIVER.replace("MARKER", repr(MARKER))
    payload = json.dumps({name: (code_, [str(a) for a in args])
                          for name, (code_, args) in scripts.items()})
    done = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True,
                          text=True, env=env or dict(os.environ), timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith(MARKER))
    return Results(json.loads(line[len(MARKER):]))
