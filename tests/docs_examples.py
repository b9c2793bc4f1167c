"""Read the Markdown docs as tests/cli/test_docs.py checks them: their relative links, the
anchors GitHub gives their headings, and their ```bash / ```python examples.

An example that cannot run here (it needs the network, Docker, a model of your own, minutes)
carries a marker on the line right before its opening fence, naming what it needs:

    <!-- example: needs Docker -->

GitHub does not render the comment. Every example without a marker is run, in a
workspace of its own (see `make_workspace`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import onnx

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RUNNABLE = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}

MARKER = re.compile(r"^<!-- example: needs (?P<needs>\S.*?) -->$")
_MARKER_LIKE = re.compile(r"<!--\s*example")
_FENCE = re.compile(r"^```(?P<lang>[\w+-]*)\s*$")
_LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_INLINE_CODE = re.compile(r"`[^`]*`")


def doc_files() -> list[str]:
    """README.md and every docs/*.md, as paths relative to the repository."""
    docs = sorted(f"docs/{name}" for name in os.listdir(os.path.join(REPO, "docs"))
                  if name.endswith(".md"))
    return ["README.md", *docs]


def _read(rel: str) -> list[str]:
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read().split("\n")


def _prose_lines(lines: list[str]):
    """(line number, line) of every line outside fenced code blocks."""
    in_fence = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield number, line


# --- links and anchors -------------------------------------------------------------------
def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lowercase, punctuation other than `-` and `_`
    dropped (backticks included), each space a `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(rel: str) -> set[str]:
    """Every heading anchor of a Markdown file."""
    return heading_anchors(_read(rel))


def heading_anchors(lines: list[str]) -> set[str]:
    """The anchors of these Markdown lines' headings; a repeated heading's get -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    for _number, line in _prose_lines(lines):
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


@dataclass(frozen=True)
class Link:
    file: str  # relative to the repository
    line: int
    target: str  # as written

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: ({self.target})"


def relative_links(rel: str) -> list[Link]:
    """Every link of a Markdown file that is not a URL (code blocks and spans skipped)."""
    found = []
    for number, line in _prose_lines(_read(rel)):
        for match in _LINK.finditer(_INLINE_CODE.sub("", line)):
            target = match.group("target")
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                found.append(Link(rel, number, target))
    return found


def link_problem(link: Link) -> str | None:
    """Why a relative link is broken, or None when its file and anchor exist."""
    path, _, anchor = link.target.partition("#")
    target = link.file if not path else os.path.normpath(
        os.path.join(os.path.dirname(link.file), path))
    if target.startswith(".."):
        return f"{path} is outside the repository"
    if not os.path.exists(os.path.join(REPO, target)):
        return f"{target} does not exist"
    if anchor and target.endswith(".md") and anchor not in anchors(target):
        return f"{target} has no heading whose anchor is #{anchor}"
    return None


# --- examples ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Example:
    file: str
    line: int  # of the opening fence
    lang: str  # "bash" or "python"
    code: str
    needs: str | None  # what the marker says it needs; None: it is run

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def examples(rel: str) -> list[Example]:
    """The ```bash / ```python blocks of a Markdown file, with their markers."""
    lines = _read(rel)
    found = []
    number = 0
    while number < len(lines):
        fence = _FENCE.match(lines[number])
        if not fence:
            number += 1
            continue
        end = next(i for i in range(number + 1, len(lines)) if lines[i].startswith("```"))
        lang = RUNNABLE.get(fence.group("lang"))
        if lang is not None:
            marker = MARKER.match(lines[number - 1]) if number else None
            found.append(Example(rel, number + 1, lang, "\n".join(lines[number + 1:end]),
                                 marker.group("needs") if marker else None))
        number = end + 1
    return found


def marker_problems(rel: str) -> list[str]:
    """Markers that are malformed or stand before no ```bash / ```python block."""
    lines = _read(rel)
    problems = []
    for number, line in enumerate(lines, 1):
        if not _MARKER_LIKE.search(line):
            continue
        if not MARKER.match(line):
            problems.append(f"{rel}:{number}: write `<!-- example: needs WHAT -->`, not {line!r}")
            continue
        fence = _FENCE.match(lines[number]) if number < len(lines) else None
        if not fence or fence.group("lang") not in RUNNABLE:
            problems.append(f"{rel}:{number}: the marker is not right before a ```bash or "
                            "```python block")
    return problems


def make_workspace(folder: str) -> None:
    """What the examples' relative paths find: the shipped tests/data/mobilenet_block.onnx,
    and as `model.onnx` (the docs' name for the reader's own model) the same model with its
    input named `input`, as the docs' `-ois input:...` has it."""
    data = os.path.join(folder, "tests", "data")
    os.makedirs(data)
    shipped = os.path.join(REPO, "tests", "data", "mobilenet_block.onnx")
    shutil.copy(shipped, data)
    model = onnx.load(shipped)
    old = model.graph.input[0].name
    model.graph.input[0].name = "input"
    for node in model.graph.node:
        node.input[:] = ["input" if name == old else name for name in node.input]
    onnx.save(model, os.path.join(folder, "model.onnx"))


def run_example(example: Example, cwd: str, timeout: float = 300) -> tuple[int, str]:
    """Run an example in `cwd` with this interpreter's `python` and `onnx2tf-alt` first on
    PATH: (exit code, stdout + stderr)."""
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
               TF_CPP_MIN_LOG_LEVEL="3")
    command = ([sys.executable, "-c", example.code] if example.lang == "python"
               else ["bash", "-e", "-c", example.code])
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    return proc.returncode, proc.stdout + proc.stderr
