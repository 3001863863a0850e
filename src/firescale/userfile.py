"""The files a user names (net, solver, layer plan, experiments, site, mean): read in one place, so that a
missing file, a directory, an unreadable file or bytes of another kind are one sentence naming the file and
what was expected, never a traceback."""
from __future__ import annotations

import errno
import os
from importlib.resources.abc import Traversable
from pathlib import Path

from firescale.errors import FirescaleError

# What each kind of file is, for the sentence: the key is the `what` callers pass.
EXPECTED = {
    "net file": "a Caffe net in text format (a .prototxt)",
    "solver file": "Caffe solver settings as text (a .prototxt, or .yaml)",
    "layer plan": "a solver file with dist blocks (.prototxt) or a YAML file with a dist key",
    "experiments file": "YAML text",
    "site profile": "YAML text (site/NAME/site.yaml)",
    "mean file": "a Caffe mean image (.binaryproto) or a NumPy array (.npy)",
}
# How much of a file's start is looked at for NUL bytes: text never has one; protobuf, NumPy and HDF5 do.
_SNIFF = 4096


def read_user_bytes(path: str | os.PathLike[str] | Traversable, what: str) -> bytes:
    """The bytes of the file at `path`, which the user named as a `what` (a key of EXPECTED)."""
    _check_is_file(path, what)
    try:
        return path.read_bytes() if isinstance(path, Traversable) else Path(path).read_bytes()
    except OSError as exc:
        raise _unreadable(path, what, exc) from None


def read_user_text(path: str | os.PathLike[str] | Traversable, what: str) -> str:
    """The UTF-8 text of the file at `path`, which the user named as a `what` (a key of EXPECTED).  A file
    that is not text (a .caffemodel given as a net file, say) is refused by name, not parsed."""
    data = read_user_bytes(path, what)
    nul = data.find(b"\0", 0, _SNIFF)
    if nul >= 0:
        raise FirescaleError(f"{what} {path} is not text (a NUL byte at byte {nul}){_expected(what)}"
                             f"{_hint(path)}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FirescaleError(f"{what} {path} is not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x})"
                             f"{_expected(what)}{_hint(path)}") from None


def _check_is_file(path: str | os.PathLike[str] | Traversable, what: str) -> None:
    if isinstance(path, Traversable) and not isinstance(path, Path):
        if not path.is_file():
            raise FirescaleError(f"{what} {path} is not a file in the package{_expected(what)}")
        return
    path = Path(path)
    if path.is_dir():
        raise FirescaleError(f"{what} {path} is a directory, not a file{_expected(what)}")
    if not path.exists():
        raise FirescaleError(f"{what} {path} does not exist" + (f" (in {Path.cwd()})" if not path.is_absolute()
                                                                else ""))


def _unreadable(path: object, what: str, exc: OSError) -> FirescaleError:
    if exc.errno == errno.EACCES:
        return FirescaleError(f"cannot read {what} {path}: permission denied")
    return FirescaleError(f"cannot read {what} {path}: {exc.strerror or exc}")


def _expected(what: str) -> str:
    return f"; expected {EXPECTED[what]}" if what in EXPECTED else ""


def _hint(path: object) -> str:
    """What a binary file of a known kind is for, when it was given where text belongs."""
    suffix = Path(str(path)).suffix
    if suffix == ".caffemodel":
        return "; a .caffemodel holds trained weights: give it with --weights"
    if suffix == ".solverstate":
        return "; a .solverstate holds a solver's snapshot: give it with --snapshot"
    if suffix in (".h5", ".hdf5", ".npy", ".binaryproto", ".lmdb", ".mdb"):
        return f"; a {suffix} file is binary data"
    return ""
