"""The product's documents and comments describe the product as it is
(ctest: core.history).

No work diary in README.md, docs/, include/, python/, examples/ or
templates/: no issue numbers, no sessions of work, no "this change" or
"before this", no experiments "tried and not kept", no dates of work, no
commit hashes, no timings of the past ("was 1.2x", "1.1x before"). History
belongs to `git log`.

Each pattern below names a kind of diary wording; ALLOW_KINDS lists the
few files where a kind is legitimate. Prints every finding as file:line: kind: the line, and fails if
there is one."""
import argparse
import pathlib
import re
import sys

PLACES = ["README.md", "docs", "include", "python", "examples", "templates"]
SKIP_DIRS = {"__pycache__", ".git", "build", "site", "_site"}
TEXT_SUFFIXES = {".hpp", ".h", ".cpp", ".cc", ".c", ".py", ".pyi", ".in", ".txt", ".md",
                 ".cmake", ".sh", ".toml", ".cfg", ".yml", ".yaml", ".rst"}

ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
           r"twelfth|\d+(?:st|nd|rd|th))")
MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
         r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
UNIT = r"(?:x|×|%|s|ms|us|µs|ns|min|minutes?|seconds?|instructions|Ir)"

PATTERNS = [
    ("issue number", re.compile(r"\b(?:issues?|PR|pull request)\s+#?\d+\b", re.I)),
    ("issue reference", re.compile(r"(?<![\w&/#])#\d{2,}\b(?![\w-])")),
    ("work session", re.compile(
        rf"\b(?:{ORDINAL}|this|that|last|previous|next|earlier|later)\s+"
        r"sessions?\b|\bsessions?\s+\d+\b|\bsessions?'s?\s+(?:build|work|guard)\b", re.I)),
    ("history wording", re.compile(
        r"\b(?:this change|before this(?= session| change| commit| work| fix|[,.;)]|$)|"
        r"tried and not kept|"
        r"was tried|we tried|no longer (?:catches|does|needs|uses|calls)|used to be|"
        r"on the code before|the code before|in place of the (?:old|earlier)|"
        r"(?:an? |the )?earlier (?:version|code|build|runs?|measurements?))", re.I)),
    ("date of work", re.compile(r"\b20\d\d-\d\d-\d\d\b")),
    ("date of work", re.compile(rf"\b(?:{MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b(?!\s*(?:bytes|B\b))|"
                                rf"\d{{1,2}}(?:st|nd|rd|th)?\s+{MONTH}\b\.?\s*(?:20\d\d)?)")),
    ("time of work", re.compile(r"\b\d\d:\d\d UTC\b")),
    ("commit hash", re.compile(
        r"(?<![\w./:#-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")),
    ("timing history", re.compile(
        rf"\bwas\s+(?:about\s+|~|≈)?\d[\d.,]*(?:-\d[\d.,]*)?\s*{UNIT}(?!\w)|"
        rf"\d[\d.,]*(?:-\d[\d.,]*)?\s*{UNIT}\s+before\b(?!\s+(?!for\b|and\b|with\b|on\b|in\b)[a-z])|"
        r"\bbefore:\s*\d|"
        r"\b(?:down|up) from \d", re.I)),
]

# (path, kind): a kind of finding that is legitimate in the whole file. The
# benchmarks page dates each current table (the date of the measurement, not
# a diary of them).
ALLOW_KINDS = {
    ("docs/benchmarks.md", "date of work"),
}

# "May" followed by a number is more often the modal verb ("may 2 ...")
# than a date.
MAY_WORD = re.compile(r"^May\s+\d{1,2}$")


def places(root, names):
    for name in names:
        path = root / name
        if path.is_file():
            yield path
        elif path.is_dir():
            for p in sorted(path.rglob("*")):
                if any(part in SKIP_DIRS for part in p.relative_to(root).parts):
                    continue
                if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name == "CMakeLists.txt"):
                    yield p


def findings(root, names):
    out = []
    for path in places(root, names):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        rel = str(path.relative_to(root))
        for number, line in enumerate(text.splitlines(), 1):
            for kind, pattern in PATTERNS:
                for m in pattern.finditer(line):
                    hit = m.group(0)
                    if (rel, kind) in ALLOW_KINDS:
                        continue
                    if kind == "date of work" and MAY_WORD.match(hit):
                        continue
                    out.append(f"{rel}:{number}: {kind} `{hit}`: {line.strip()[:160]}")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    p.add_argument("places", nargs="*", default=PLACES)
    a = p.parse_args()
    found = findings(pathlib.Path(a.root).resolve(), a.places)
    for line in found:
        print(line)
    print(f"{len(found)} finding(s) of work history")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
