"""The name of each model's output folder, OUT_ROOT/<name>/: a function of the model's own
path below the source root and of nothing else, so that adding, removing or reordering
other models never renames a folder.

`a/b/resnet-50.onnx` -> `a__b__resnet-50`: the path without `.onnx`, its folders joined by
`__`, when that spelling can be read back (every part lowercase letters and digits, with
single `.`, `-` or `_` between them; not one of the batch's own file names; at most
`MAX_LENGTH` characters). Any other path keeps a readable version of that spelling and gets
`~` and 8 hex digits of the path's sha256: `Net.onnx` -> `Net~93b865e3`. `~` never occurs in
a plain name, and a plain name has no upper case, so two different paths never get names
that are equal, or equal but for case (a case-insensitive file system would merge those).
"""

from __future__ import annotations

import hashlib
import re

from onnx2tf_alt.batching.results import RESULTS, SUMMARY_HTML, SUMMARY_MD
from onnx2tf_alt.errors import InputError

MAX_LENGTH = 120  # far below the 255 bytes a folder name may have
_PLAIN_PART = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
_RESERVED = {RESULTS, SUMMARY_MD, SUMMARY_HTML}  # our own files in OUT_ROOT
_HASH_CHARS = 8


def folder_name(rel: str) -> str:
    """The folder name of the model at `rel`: its path below the source root (for a
    manifest, below the manifest's folder; `..` allowed), `/`-separated."""
    parts = rel.split("/")
    stem = parts[-1][:-len(".onnx")] if parts[-1].lower().endswith(".onnx") else parts[-1]
    joined = "__".join([*parts[:-1], stem])
    if (parts[-1].endswith(".onnx") and all(map(_PLAIN_PART.fullmatch, [*parts[:-1], stem]))
            and len(joined) <= MAX_LENGTH and joined not in _RESERVED):
        return joined
    kept = [p for p in [*parts[:-1], stem] if p not in ("", ".", "..")]
    readable = re.sub(r"^[._-]+", "", safe_name("__".join(kept)))
    digest = hashlib.sha256(rel.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{readable[:MAX_LENGTH - _HASH_CHARS - 1] or 'model'}~{digest[:_HASH_CHARS]}"


def safe_name(text: str) -> str:
    """A folder name from any text: no separators, no leading dot (our own state lives in
    OUT_ROOT/.batch/, staging folders start with a dot)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".") or ("model" if text else "")


def check_unique(names: list[str], paths: list[str]) -> None:
    """Raise InputError when two models would share a folder, also on a file system that
    ignores case, or when a name is one of the batch's own files."""
    seen: dict[str, int] = {}
    for i, (name, path) in enumerate(zip(names, paths)):
        if name.lower() in _RESERVED:
            raise InputError(f"the folder name \"{name}\" of '{path}' is one of the batch's "
                             "own files; give the model another \"name\".")
        first = seen.setdefault(name.casefold(), i)
        if first != i:
            raise InputError(f"'{paths[first]}' and '{path}' would both be converted into the "
                             f"folder \"{name}\" (names are compared ignoring case); give "
                             "one of them another \"name\" in the manifest.")
