#!/usr/bin/env python3
"""Writes the Runtime contract's tables from its one list.

The members are listed once, in include/accelkit/detail/contract.hpp (Note
[The contract table]): each X(...) or C(...) entry of the four lists
ACCELKIT_{REQUIRED,OPTIONAL}_{CONSTANTS,MEMBERS} follows a comment that is
its meaning; for an optional member the text after "Absent:" says what the
SDK does without it. From that list this script writes

  - the table in include/accelkit/runtime.hpp's opening comment, between the
    lines "// BEGIN GENERATED contract table" and "// END GENERATED contract
    table";
  - docs/contract.md, the documentation site's page, which also quotes
    runtime.hpp's paragraphs on the calling rules and asynchronous errors.

Usage: scripts/contract_docs.py          rewrite the generated copies
       scripts/contract_docs.py --check  exit 1 naming each stale copy
"""
import argparse
import pathlib
import re
import sys
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONTRACT = "include/accelkit/detail/contract.hpp"
RUNTIME = "include/accelkit/runtime.hpp"
PAGE = "docs/contract.md"
BEGIN = "// BEGIN GENERATED contract table"
END = "// END GENERATED contract table"
WIDTH = 80

# In contract_members' order: required constants, required members, optional
# members, optional constants.
LISTS = [("ACCELKIT_REQUIRED_CONSTANTS", True), ("ACCELKIT_REQUIRED_MEMBERS", True),
         ("ACCELKIT_OPTIONAL_MEMBERS", False), ("ACCELKIT_OPTIONAL_CONSTANTS", False)]


@dataclass
class Member:
    name: str
    signature: str  # as the diagnostics print it (the tokens, one space apart)
    required: bool
    meaning: str
    absent: str  # what applies without it; "" for a required member


def _macro_body(text, macro):
    m = re.search(rf"^#define {macro}\((\w)\)(.*)$", text, re.M)
    if not m:
        raise SystemExit(f"{CONTRACT}: no #define {macro}")
    lines, pos = [m.group(2)], m.end()
    while lines[-1].rstrip().endswith("\\"):
        lines[-1] = lines[-1].rstrip()[:-1]
        nxt = text.find("\n", pos + 1)
        lines.append(text[pos + 1:nxt if nxt >= 0 else len(text)])
        pos = nxt
    return m.group(1), "\n".join(lines)


def _split_args(inner):
    args, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            args.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    args.append(cur)
    return [" ".join(a.split()) for a in args]


def _entries(body, letter, macro):
    """(comment, args) for each entry of one list, in order."""
    out, comment, i = [], None, 0
    while i < len(body):
        if body[i].isspace():
            i += 1
        elif body.startswith("/*", i):
            j = body.index("*/", i)
            comment = " ".join(body[i + 2:j].split())
            i = j + 2
        elif body.startswith(letter + "(", i):
            depth, j = 0, i + 1
            while True:
                depth += body[j] == "("
                depth -= body[j] == ")"
                if depth == 0:
                    break
                j += 1
            args = _split_args(body[i + 2:j])
            if not comment:
                raise SystemExit(f"{CONTRACT}: {macro}: the entry {args[0]} has no comment "
                                 "giving its meaning")
            out.append((comment, args))
            comment, i = None, j + 1
        else:
            raise SystemExit(f"{CONTRACT}: {macro}: cannot read {body[i:i + 40]!r}")
    return out


def members(root=ROOT):
    text = (root / CONTRACT).read_text()
    out = []
    for macro, required in LISTS:
        letter, body = _macro_body(text, macro)
        for comment, args in _entries(body, letter, macro):
            meaning, _, absent = comment.partition(" Absent: ")
            if comment.startswith("Absent: "):
                meaning, absent = "", comment[len("Absent: "):]
            if letter == "X":
                name, ret, params = args[0], args[1], args[2]
                signature = f"{ret} {name}{params}"
            else:
                name, typ = args[0], args[1]
                signature = f"static constexpr {typ} {name}"
                if not required:
                    absent = absent or f"`{args[2]}`"
            if required and absent:
                raise SystemExit(f"{CONTRACT}: {name} is required but says what applies when "
                                 "it is absent")
            if not required and not absent:
                raise SystemExit(f"{CONTRACT}: the optional {name} does not say, after "
                                 "\"Absent:\", what applies without it")
            out.append(Member(name, signature, required, meaning.strip(), absent.strip()))
    return out


def _wrap(text, indent, width=WIDTH):
    """Words into comment lines; a Note's name is never broken."""
    words = re.findall(r"\S*Note \[[^\]]*\]\S*|\S+", text)
    lines, cur = [], ""
    for w in words:
        if cur and len(indent) + len(cur) + 1 + len(w) > width:
            lines.append(indent + cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        lines.append(indent + cur)
    return lines


def _signature_lines(signature, indent="//   ", width=WIDTH):
    """A signature, broken after a parameter's comma where it is too long,
    the parameters aligned after the opening parenthesis."""
    if len(indent) + len(signature) <= width or "(" not in signature:
        return [indent + signature]
    head, _, rest = signature.partition("(")
    params = rest[:-1].split(", ")
    pad = " " * (len(indent) - 2 + len(head) + 1)
    lines, cur = [], indent + head + "("
    for i, p in enumerate(params):
        piece = p + (", " if i + 1 < len(params) else ")")
        if len(cur) + len(piece.rstrip()) > width and not cur.endswith("("):
            lines.append(cur.rstrip())
            cur = "//" + pad
        cur += piece
    lines.append(cur)
    return lines


def header_table(ms):
    out = [BEGIN + " (scripts/contract_docs.py, from the lists in",
           "// detail/contract.hpp: edit them there).",
           "//",
           "// Required members:"]
    for m in ms:
        if m.required:
            out += _signature_lines(m.signature) + _wrap(m.meaning, "//       ")
    out += ["//", "// Optional members (after \"Absent:\", what the SDK does without one):"]
    for m in ms:
        if not m.required:
            out += _signature_lines(m.signature)
            out += _wrap((m.meaning + " " if m.meaning else "") + "Absent: " + m.absent,
                         "//       ")
    out.append(END)
    return out


def rewrite_header(text, ms):
    lines = text.split("\n")
    try:
        b = next(i for i, l in enumerate(lines) if l.startswith(BEGIN))
        e = next(i for i, l in enumerate(lines) if l.startswith(END))
    except StopIteration:
        raise SystemExit(f"{RUNTIME}: no lines \"{BEGIN}\" ... \"{END}\" to write the table "
                         "between")
    return "\n".join(lines[:b] + header_table(ms) + lines[e + 1:])


def _paragraphs(header_text):
    """runtime.hpp's opening comment as paragraphs of plain text."""
    paras, cur = [], []
    for line in header_text.split("\n"):
        if not line.startswith("//"):
            break
        body = line[2:].strip()
        if line.startswith(BEGIN):
            break
        if body:
            cur.append(body)
        elif cur:
            paras.append(" ".join(cur))
            cur = []
    if cur:
        paras.append(" ".join(cur))
    return paras


def _quote(paras, start):
    found = [p for p in paras if p.startswith(start)]
    if not found:
        raise SystemExit(f"{RUNTIME}: no paragraph of its opening comment starts with "
                         f"{start!r}, which {PAGE} quotes")
    return found[0]


def _md(text):
    """Comment text as Markdown: outside `code`, "<" and "*" are literal."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace("*", "\\*")
    return "`".join(parts)


def _capital(text):
    return text[:1].upper() + text[1:]


def _cell(text):
    return _md(text).replace("|", "\\|")


def page(ms, header_text):
    paras = _paragraphs(header_text)
    out = [
        "# The runtime contract",
        "",
        "<!-- Generated by scripts/contract_docs.py from the member lists of",
        "     include/accelkit/detail/contract.hpp: edit them there and run the script. -->",
        "",
        _md(_quote(paras, "A vendor derives")),
        "",
        "The signatures below are exact: a required member that is missing or",
        "mistyped, or an optional one that is mistyped, is a compile error that",
        "names the member and this signature. [Porting a driver](porting.md) gives",
        "the driver calls each member maps to, and the traps.",
        "",
        "## Required members",
        "",
        "| member | signature | meaning |",
        "|---|---|---|",
    ]
    for m in ms:
        if m.required:
            out.append(f"| `{m.name}` | `{m.signature}` | {_cell(m.meaning)} |")
    out += [
        "",
        "## Optional members",
        "",
        "| member | signature | meaning | when absent |",
        "|---|---|---|---|",
    ]
    for m in ms:
        if not m.required:
            out.append(f"| `{m.name}` | `{m.signature}` | {_cell(m.meaning) or '—'} | "
                       f"{_cell(_capital(m.absent))} |")
    out += [
        "",
        "## Asynchronous errors",
        "",
        _md(_capital(_quote(paras, "Asynchronous errors:")[len("Asynchronous errors: "):])),
        "",
        _md(_quote(paras, "A failure after which the device")),
        "",
        _md(_quote(paras, "A driver whose queued work")),
        "",
    ]
    return "\n".join(out)


def generated(root=ROOT):
    """{relative path: the text it should have}."""
    ms = members(root)
    header = (root / RUNTIME).read_text()
    new_header = rewrite_header(header, ms)
    return {RUNTIME: new_header, PAGE: page(ms, new_header)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming each generated copy that is stale")
    p.add_argument("--root", default=str(ROOT))
    a = p.parse_args()
    root = pathlib.Path(a.root).resolve()
    stale = []
    for rel, text in generated(root).items():
        path = root / rel
        if path.exists() and path.read_text() == text:
            continue
        if a.check:
            stale.append(rel)
        else:
            path.write_text(text)
            print(f"wrote {rel}")
    for rel in stale:
        print(f"{rel} is stale: run scripts/contract_docs.py (the contract's list is "
              f"{CONTRACT})")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
