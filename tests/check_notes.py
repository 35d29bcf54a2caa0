"""Every Note that is cited is defined exactly once (ctest: core.notes).

A design decision is explained once, in a Note, and other places point to it
by its name. A definition is a comment line that holds only the Note's
heading: the comment marker ("//", "#" or a block comment's "*"), the word
Note, the name in square brackets, optionally a colon, nothing else. Every
other mention is a citation, including one that wraps over a line break
inside a comment. Markdown files only cite.

In Python a docstring line that starts the same way also defines. A
citation at the start of a comment line followed by a colon reads as a
definition: write it "(Note [...])" instead.

Scans the folders given (default: the project's sources and documents) and
prints, with file:line, each Note cited but defined nowhere and each Note
defined more than once; fails if there is any. A Note defined and not
cited is fine."""
import argparse
import collections
import pathlib
import re
import sys

FOLDERS = ["include", "python", "examples", "templates", "src", "cmake", "scripts", "bench",
           "tests", "docs"]
SKIP_DIRS = {"__pycache__", ".git", "build", "site", "_site", "node_modules"}
TEXT_SUFFIXES = {".hpp", ".h", ".cpp", ".cc", ".c", ".py", ".pyi", ".cmake", ".in", ".txt",
                 ".md", ".sh", ".toml", ".cfg", ".yml", ".yaml", ".json", ".rst", ".inl"}

# A comment line that starts with the heading, alone or followed by a colon.
DEFINITION = re.compile(r"^\s*(?://+|#+|/?\*+)\s*Note \[([^\[\]\n]+)\](?::.*)?\s*$")
# In Python, a docstring line that starts with the heading, the same way.
DOCSTRING_DEFINITION = re.compile(r"^\s*Note \[([^\[\]\n]+)\](?::.*)?\s*$")
# A citation: "Note [" then the name up to "]", which may continue on the next
# line after that line's comment marker.
CITATION = re.compile(r"Note \[((?:[^\[\]\n]|\n[ \t]*(?://+|#+|\*+)?[ \t]*){1,120}?)\]")
CONTINUATION = re.compile(r"\n[ \t]*(?://+|#+|\*+)?[ \t]*")


def files(root, folders):
    this = pathlib.Path(__file__).resolve()
    for folder in folders:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if any(part in SKIP_DIRS for part in path.relative_to(root).parts):
                continue
            if not path.is_file() or path.resolve() == this:
                continue
            if path.suffix not in TEXT_SUFFIXES and path.name not in ("CMakeLists.txt",):
                if path.suffix or not path.stat().st_size or path.stat().st_size > 1 << 20:
                    continue
            try:
                yield path, path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue


def normalize(name):
    """The name as cited: line breaks, comment markers and the seams of
    adjacent string literals ("... " "...") taken out."""
    name = CONTINUATION.sub(" ", name)
    name = re.sub(r'"\s*"', "", name)
    return " ".join(name.split())


def scan(root, folders):
    defined = collections.defaultdict(list)  # name -> [file:line]
    cited = collections.defaultdict(list)
    for path, text in files(root, folders):
        rel = path.relative_to(root)
        markdown = path.suffix in (".md", ".rst")
        definition_lines = set()
        if not markdown:
            for number, line in enumerate(text.splitlines(), 1):
                m = DEFINITION.match(line)
                if not m and path.suffix == ".py":
                    m = DOCSTRING_DEFINITION.match(line)
                if m:
                    defined[normalize(m.group(1))].append(f"{rel}:{number}")
                    definition_lines.add(number)
        for m in CITATION.finditer(text):
            number = text.count("\n", 0, m.start()) + 1
            if number in definition_lines:
                continue
            if "{" in m.group(1):  # a format string's placeholder, not a name
                continue
            cited[normalize(m.group(1))].append(f"{rel}:{number}")
    return defined, cited


def problems(defined, cited):
    out = []
    for name in sorted(cited):
        if name not in defined:
            out.append(f"Note [{name}] is cited and defined nowhere: " + ", ".join(cited[name]))
    for name in sorted(defined):
        if len(defined[name]) > 1:
            out.append(f"Note [{name}] is defined {len(defined[name])} times: "
                       + ", ".join(defined[name]))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    p.add_argument("folders", nargs="*", default=FOLDERS)
    a = p.parse_args()
    root = pathlib.Path(a.root).resolve()
    defined, cited = scan(root, a.folders)
    found = problems(defined, cited)
    for line in found:
        print(line)
    print(f"{len(defined)} Notes defined, {len(cited)} cited; {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
