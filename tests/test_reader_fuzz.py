"""Readers of names and files given arbitrary input (hypothesis): each returns a valid result
or raises the library's one-line error, never another exception type."""

import functools
import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from keras_vit import fileio

# Few examples each, no deadline: the whole file stays within seconds on a busy machine.
SETTINGS = settings(max_examples=60, deadline=None)

# --------------------------------------------------------------------------------------------
# The temporaries a command may remove: this process's on this machine, nothing else.


@functools.cache
def this_host():
    """This machine's digest, as the temporaries' names carry it."""
    with tempfile.TemporaryDirectory() as folder:
        with fileio.atomic_file(os.path.join(folder, "a")) as tmp:  # the name only
            return fileio.TEMPORARY_NAME.match(os.path.basename(tmp))["host"]


def test_is_own_temporary_recognises_this_processs_temporaries_only(tmp_path):
    with fileio.atomic_file(tmp_path / "final.npz") as tmp:
        assert fileio.is_own_temporary(os.path.basename(tmp))
    with fileio.staging_dir(tmp_path / "export") as folder:
        assert fileio.is_own_temporary(os.path.basename(folder))
    digest = fileio.TEMPORARY_NAME.match(os.path.basename(tmp))["host"]
    other_host = "0" * 8 if digest != "0" * 8 else "1" * 8
    for name in (f".keras_vit-old-{digest}-{os.getpid()}-abc",          # the user's old version
                 f".keras_vit-tmp-{other_host}-{os.getpid()}-abc-x",    # another machine's
                 f".keras_vit-tmp-{digest}-{os.getpid() + 1}-abc-x",    # another process's
                 "final.npz", ".tmp-final.npz", "keras_vit-tmp-x"):
        assert not fileio.is_own_temporary(name), name


@SETTINGS
@given(kind=st.sampled_from(["tmp", "old", "TMP", "temp"]), own_host=st.booleans(),
       pid=st.sampled_from([os.getpid(), os.getpid() + 1, 0]), rest=st.text(max_size=20),
       junk=st.text(max_size=3))
def test_is_own_temporary_is_this_process_and_machine_and_tmp_only(kind, own_host, pid, rest,
                                                                   junk):
    host = this_host() if own_host else format(int(this_host(), 16) ^ 1, "08x")
    name = f"{junk}.keras_vit-{kind}-{host}-{pid}-{rest}"
    assert fileio.is_own_temporary(name) is \
        (not junk and kind == "tmp" and own_host and pid == os.getpid())


@SETTINGS
@given(st.text(max_size=40))
def test_is_own_temporary_of_any_name_is_a_bool(name):
    assert fileio.is_own_temporary(name) in (True, False)
