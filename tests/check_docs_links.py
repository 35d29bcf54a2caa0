"""The relative links of Markdown files outside the site (README.md) lead
somewhere (ctest: docs.site, through tests/check_docs.py).

Each link `[text](target)` or `<a href>` whose target is not a URL must name
a file or folder that exists, relative to the Markdown file; a `#anchor`
must be a heading of the file it points into (GitHub's anchors: lower case,
punctuation but `-` and `_` dropped, spaces as `-`). Links inside code
blocks and code spans are not links. Prints every broken link and fails if
there is one."""
import pathlib
import re
import sys

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HREF = re.compile(r"<a\s[^>]*href=\"([^\"]+)\"")
URL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def prose(text):
    """The text without fenced code blocks and code spans."""
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`+[^`\n]*`+", "", text)


def anchors(path):
    seen, out = {}, set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(("```", "~~~")):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken(md):
    problems = []
    text = prose(md.read_text(encoding="utf-8"))
    for number, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(line) + HREF.findall(line):
            if URL.match(target) or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                problems.append(f"{md.name}:{number}: `{target}`: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{md.name}:{number}: `{target}`: no heading with that anchor")
    return problems


def main():
    files = [pathlib.Path(a) for a in sys.argv[1:]]
    problems = [p for f in files for p in broken(f)]
    for p in problems:
        print(p)
    print(f"{len(problems)} broken link(s) in {', '.join(f.name for f in files)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
