"""An offline text corpus: passages of a few sentences from the Python standard library's docstrings.

The corpus depends on the Python version's docstrings: the same CPython version gives the same passages, in the same
order, on every machine, but another version (even a patch release) may add, drop or reword some. Farm slices the
dataset by index on each node, so every node of one job must run the same Python version (Ray already demands the
same minor version across a cluster).

The walk runs in a fresh, isolated interpreter (`python -I -S`): libraries imported by the caller patch stdlib
objects (transformers adds methods to logging.Logger, for one), which would otherwise change the corpus.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from functools import lru_cache

# Pure-Python or built-in modules whose public names and docstrings do not depend on the platform (Linux and macOS
# alike) or on optional C libraries (ssl, bz2, lzma, OpenSSL-backed hashlib): a module that defined some names only
# on one platform would shift every later passage and misalign the shards that nodes cut from their own copy.
MODULES: tuple[str, ...] = tuple(
    sorted(
        [
            "abc", "argparse", "array", "ast", "base64", "bdb", "bisect", "builtins", "calendar", "cmd", "codecs",
            "codeop", "collections", "collections.abc", "colorsys", "configparser", "contextlib", "contextvars",
            "copy", "csv", "dataclasses", "datetime", "difflib", "dis", "doctest", "email.charset", "email.generator",
            "email.header", "email.headerregistry", "email.message", "email.parser", "email.policy", "email.utils",
            "enum", "filecmp", "fnmatch", "fractions", "functools", "getopt", "gettext", "glob", "graphlib", "gzip",
            "heapq", "html.parser", "http.cookiejar", "http.cookies", "importlib.abc", "importlib.metadata",
            "inspect", "ipaddress", "itertools", "json", "keyword", "linecache", "logging", "logging.handlers",
            "mailbox", "math", "mimetypes", "modulefinder", "netrc", "numbers", "operator", "optparse", "pathlib",
            "pdb", "pickle", "pkgutil", "plistlib", "pprint", "profile", "pstats", "pyclbr", "pydoc", "queue",
            "quopri", "random", "re", "reprlib", "runpy", "sched", "secrets", "shelve", "shlex", "statistics",
            "string", "struct", "symtable", "tabnanny", "tarfile", "textwrap", "threading", "timeit", "token",
            "tokenize", "tomllib", "trace", "traceback", "types", "typing", "unittest.case", "unittest.loader",
            "unittest.mock", "unittest.result", "unittest.suite", "urllib.parse", "warnings", "wave", "weakref",
            "wsgiref.handlers", "wsgiref.headers", "wsgiref.util", "xml.dom.minidom", "xml.etree.ElementTree",
            "xml.sax.handler", "xml.sax.saxutils", "zipfile", "zipimport", "zoneinfo",
        ]
    )
)

MAX_SENTENCES = 3
MAX_WORDS = 60
MIN_WORDS = 8

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'`])")
# Signature lines that built-in docstrings open with, e.g. "S.join(iterable) -> str" or "max(iterable, *[, key])".
_SIGNATURE = re.compile(r"^[\w.]+\(.*\)(\s*->.*)?$")


def _docstrings(module_name: str) -> Iterator[str]:
    """The module's docstring, then those of its public classes and functions (and their public members), by name."""
    module = importlib.import_module(module_name)
    yield module.__doc__ or ""
    for name in sorted(vars(module)):
        value = vars(module)[name]
        if name.startswith("_") or getattr(value, "__module__", None) != module_name:
            continue  # re-exports are documented where they are defined (or not at all)
        if inspect.isclass(value):
            yield value.__doc__ or ""
            for member_name in sorted(vars(value)):
                member = vars(value)[member_name]
                if not member_name.startswith("_") and (inspect.isroutine(member) or isinstance(member, property)):
                    yield getattr(member, "__doc__", None) or ""
        elif inspect.isroutine(value):
            yield value.__doc__ or ""


def _paragraphs(docstring: str) -> Iterator[str]:
    for block in re.split(r"\n\s*\n", inspect.cleandoc(docstring)):
        lines = block.splitlines()
        # Doctests, code blocks and reST literal blocks are not prose.
        if any(line.lstrip().startswith((">>>", "...")) for line in lines) or all(
            line.startswith((" ", "\t")) for line in lines
        ):
            continue
        prose = " ".join(line.strip() for line in lines if not _SIGNATURE.match(line.strip()))
        if prose:
            yield " ".join(prose.split())


def _split(paragraph: str) -> Iterator[str]:
    """Greedy runs of up to MAX_SENTENCES sentences and about MAX_WORDS words (a longer sentence stands alone)."""
    run: list[str] = []
    words = 0
    for sentence in _SENTENCE_END.split(paragraph):
        count = len(sentence.split())
        if run and (len(run) == MAX_SENTENCES or words + count > MAX_WORDS):
            yield " ".join(run)
            run, words = [], 0
        run.append(sentence)
        words += count
    if run:
        yield " ".join(run)


def _walk() -> list[str]:
    """Deduplicated passages of at least MIN_WORDS words, in module, name and position order, from this process."""
    seen: dict[str, None] = {}
    with warnings.catch_warnings():
        # Reading a deprecated alias's docstring (typing.io in 3.11) warns; the walk is read-only.
        warnings.simplefilter("ignore", DeprecationWarning)
        for module_name in MODULES:
            for docstring in _docstrings(module_name):
                for paragraph in _paragraphs(docstring):
                    for passage in _split(paragraph):
                        if len(passage.split()) >= MIN_WORDS:
                            seen.setdefault(passage)
    return list(seen)


@lru_cache(maxsize=1)
def texts() -> tuple[str, ...]:
    """The corpus (a few thousand passages), walked in a clean interpreter of the running Python."""
    # -I: no environment variables (PYTHONOPTIMIZE would strip docstrings), no user site, no script dir on sys.path;
    # -S: no site-packages, so no .pth file can patch the stdlib before the walk.
    result = subprocess.run(
        [sys.executable, "-I", "-S", __file__], capture_output=True, check=False, timeout=120
    )
    if result.returncode != 0:
        raise RuntimeError(f"walking the stdlib docstrings failed: {result.stderr.decode(errors='replace')[-2000:]}")
    passages = tuple(json.loads(result.stdout))
    if not passages:
        raise RuntimeError("the stdlib docstring corpus is empty (docstrings stripped?)")
    return passages


def fingerprint(passages: tuple[str, ...] | None = None) -> str:
    """SHA-256 of the corpus (or of `passages`): equal fingerprints mean identical passages in identical order."""
    digest = hashlib.sha256()
    for passage in texts() if passages is None else passages:
        digest.update(passage.encode())
        digest.update(b"\0")
    return digest.hexdigest()


if __name__ == "__main__":
    if sys.flags.optimize >= 2:
        sys.exit("python -OO strips docstrings: the stdlib docstring corpus needs them")
    json.dump(_walk(), sys.stdout)
