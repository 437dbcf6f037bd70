"""The native kernels' C++ source: every file and function reads in one sitting (at most 500 and 60
lines, as tests/test_layers.py holds the Python to), the source's hash covers every file compiled
in (a changed header builds the library again), and the package ships them all."""

from __future__ import annotations

import bisect
import re
import shutil
from pathlib import Path

import pytest

from gptkit import native
from tests.test_layers import MAX_FUNCTION_LINES, MAX_MODULE_LINES

NATIVE = native.SOURCE.parent
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
CPP_SUFFIXES = {".cpp", ".cc", ".h", ".hpp"}
# The Python rooms' limits (tests/test_layers.py), for the C++ too.
MAX_FILE_LINES, MAX_FUNCTION_LINES = MAX_MODULE_LINES, MAX_FUNCTION_LINES

# What may hold a brace that is not code: comments, string and character literals, and preprocessor
# lines (with their continuations), matched left to right so that a quote in a comment is a comment.
NOT_CODE = re.compile(
    r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|^[ \t]*#(?:[^\n]*\\\n)*[^\n]*",
    re.DOTALL | re.MULTILINE,
)
# A function's head ends with its parameters' ")" and maybe qualifiers or a trailing return type;
# a control statement's head starts with its keyword.
SIGNATURE_END = re.compile(r"\)\s*(?:(?:const|noexcept|override|final|mutable)\s*)*(?:->[^;{}()]*)?$")
CONTROL = re.compile(r"(?:if|for|while|switch|catch|do|else)\b")


def code_only(text: str) -> str:
    """``text`` with everything NOT_CODE blanked, its newlines kept (line numbers stay right)."""
    return NOT_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def function_lengths(text: str) -> list[tuple[int, int]]:
    """(first line, lines) of each function defined in C++ ``text``, from the first line of its head
    (a template line included) to its closing brace. A brace whose head is not a function's (a
    namespace, extern "C", a struct, an initializer) is looked into; inside a function every brace
    (a lambda's, a loop's) belongs to it."""
    code = code_only(text)
    newlines = [i for i, c in enumerate(code) if c == "\n"]

    def line(index: int) -> int:
        return bisect.bisect_left(newlines, index) + 1

    found: list[tuple[int, int]] = []
    head_start, depth, first = 0, 0, 0
    for i, c in enumerate(code):
        if c not in "{};":
            continue
        if depth:  # inside a function
            depth += {"{": 1, "}": -1, ";": 0}[c]
            if depth == 0:
                found.append((first, line(i) - first + 1))
        elif c == "{":
            raw = code[head_start:i]
            head = raw.strip()
            if "(" in head and SIGNATURE_END.search(head) and not CONTROL.match(head):
                depth, first = 1, line(head_start + len(raw) - len(raw.lstrip()))
        head_start = i + 1
    return found


def too_long(folder: Path) -> list[str]:
    """Each C++ file in ``folder`` over MAX_FILE_LINES and each function over MAX_FUNCTION_LINES,
    as "file:line: what"."""
    offenders = []
    for path in sorted(p for p in folder.iterdir() if p.suffix in CPP_SUFFIXES):
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES:
            offenders.append(f"{path.name}:1: {lines} lines (at most {MAX_FILE_LINES})")
        for first, length in function_lengths(text):
            if length > MAX_FUNCTION_LINES:
                offenders.append(
                    f"{path.name}:{first}: a function of {length} lines (at most {MAX_FUNCTION_LINES})"
                )
    return offenders


def test_every_cpp_file_and_function_reads_in_one_sitting():
    assert sorted(p.name for p in NATIVE.iterdir() if p.suffix in CPP_SUFFIXES), "no C++ source found"
    offenders = too_long(NATIVE)
    assert not offenders, "\n".join(offenders)


# A function of 62 lines (from its template line) with a lambda and braces in a string and comments,
# between a struct's method and extern "C" functions in both branches of an #if.
SNIPPET = """\
namespace {
struct Team {
    void barrier() const {
        return;
    }
};
template <typename Body>
void run(Body body) {
    auto f = [&](int x) {
        const char* s = "{";
    };
BODY}
}  // namespace
extern "C" {
#if A
int gptkit_one() { return 1; }
#else
int gptkit_one() {
    return 2;  /* } */
}
#endif
}
"""


def test_the_length_scan_counts_functions_not_what_holds_them(tmp_path):
    """Functions in a namespace, a struct and extern "C" are counted, each with its lambdas, from its
    template line; braces in comments and strings do not count."""
    text = SNIPPET.replace("BODY", "".join(f"    int a{i} = {i};  // }} not a brace\n" for i in range(56)))
    (tmp_path / "kernel.cpp").write_text(text)
    assert function_lengths(text) == [(3, 3), (7, 62), (72, 1), (74, 3)]
    assert too_long(tmp_path) == ["kernel.cpp:7: a function of 62 lines (at most 60)"]


def includes(path: Path, found: set[Path] | None = None) -> set[Path]:
    """The files ``path`` includes with quotes, and theirs, found beside it (as the compiler does)."""
    found = set() if found is None else found
    for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(encoding="utf-8"), re.MULTILINE):
        included = path.parent / name
        if included not in found:  # each once: headers include each other's dependencies again
            found.add(included)
            includes(included, found)
    return found


def test_the_source_hash_covers_every_file_compiled_in():
    compiled = {native.SOURCE} | includes(native.SOURCE)
    assert len(compiled) > 1 and all(path.is_file() for path in compiled)
    assert compiled <= set(native.library.sources())


def test_a_changed_header_is_a_new_source_and_a_new_library(tmp_path, monkeypatch):
    """A header's change changes the build line's hash and the cached library's name: it is built
    again, never loaded from a build of the old header."""
    copy = tmp_path / "native"
    shutil.copytree(NATIVE, copy, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    monkeypatch.setattr(native.library, "SOURCE", copy / native.SOURCE.name)
    monkeypatch.setattr(native.library, "_compiler_version", lambda compiler: "c++ (test) 1.0")
    flags = ("-march=native", "-fopenmp")
    seen = {(native.library.source_hash(), native.library.library_name("c++", flags))}
    for header in sorted(includes(copy / native.SOURCE.name)):
        header.write_text(header.read_text(encoding="utf-8") + "\n// changed\n", encoding="utf-8")
        seen.add((native.library.source_hash(), native.library.library_name("c++", flags)))
    hashes, names = zip(*seen)
    assert len(seen) == len(set(hashes)) == len(set(names)) == 1 + len(includes(copy / native.SOURCE.name))


def test_the_package_ships_every_source_file():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    patterns = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-data"]["gptkit.native"]
    shipped = [path.name for path in native.library.sources() if any(path.match(p) for p in patterns)]
    assert shipped == [path.name for path in native.library.sources()], patterns
