"""The contract's documentation is generated from the contract's list and is
up to date (ctest: core.contract_docs).

The members are listed once, in include/accelkit/detail/contract.hpp (Note
[The contract table]), each with its meaning. Checks:

  - what scripts/contract_docs.py reads from that list (names, signatures,
    required or optional, order) is what the compiler sees: `--table` is
    the program that prints contract_members (tests/contract_table.cpp),
    one "required|member|signature" line each;
  - the generated copies, runtime.hpp's table and docs/contract.md, are
    what the script writes now (else: stale, run the script);
  - those two tables, and the README's contract table if it has one (rows
    "| `signature` | yes/no | ..."), list exactly the contract's members, in
    its order, with the same signatures and required/optional split;
  - docs/porting.md has one "### `member`" section per member, in order.

Prints every difference and fails if there is one."""
import argparse
import importlib.util
import pathlib
import re
import subprocess
import sys


def contract(table_exe):
    out = subprocess.run([table_exe], check=True, capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        need, member, signature = line.split("|", 2)
        rows.append((signature, need == "required", member))
    return rows


def generator(root):
    path = root / "scripts" / "contract_docs.py"
    spec = importlib.util.spec_from_file_location("contract_docs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def readme_rows(path):
    rows = []
    for line in pathlib.Path(path).read_text().splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|\s*(yes|no)\s*\|", line)
        if m:
            rows.append((m.group(1), m.group(2) == "yes"))
    return rows


def header_rows(text, begin, end):
    """The signatures of runtime.hpp's generated table: lines "//   signature"
    (continued, while its parentheses are open, on the lines after), the
    required ones before "// Optional members"."""
    lines = text.splitlines()
    try:
        b = next(i for i, l in enumerate(lines) if l.startswith(begin))
        e = next(i for i, l in enumerate(lines) if l.startswith(end))
    except StopIteration:
        return []
    rows, required, i = [], True, b
    while i < e:
        line = lines[i]
        if line.startswith("// Optional members"):
            required = False
        if re.match(r"//   \S", line):
            sig = line[5:].strip()
            while sig.count("(") > sig.count(")") and i + 1 < e:
                i += 1
                sig += " " + lines[i][2:].strip()
            rows.append((sig.replace("( ", "("), required))
        i += 1
    return rows


def page_rows(path):
    """docs/contract.md's rows "| `member` | `signature` | ...", required
    under "## Required members", optional under "## Optional members"."""
    rows, required = [], None
    for line in pathlib.Path(path).read_text().splitlines():
        if line.startswith("## "):
            required = {"## Required members": True, "## Optional members": False}.get(line)
        m = re.match(r"\|\s*`[^`]+`\s*\|\s*`([^`]+)`\s*\|", line)
        if m and required is not None:
            rows.append((m.group(1), required))
    return rows


def porting_sections(path):
    """The members docs/porting.md goes through: its `### `member`` headings."""
    return re.findall(r"^### `([A-Za-z_]+)`\s*$", pathlib.Path(path).read_text(), re.M)


def compare_names(name, documented, members):
    problems = [f"{name}: no section for the member `{m}`" for m in members if m not in documented]
    problems += [f"{name}: a section for `{m}`, which the contract does not have"
                 for m in documented if m not in members]
    if not problems and documented != members:
        problems.append(f"{name}: the sections are not in the contract's order: {documented}")
    return problems


def compare(name, documented, listed):
    problems = []
    doc = [s for s, _ in documented]
    lst = [s for s, _ in listed]
    for s in lst:
        if s not in doc:
            problems.append(f"{name}: missing the member `{s}`")
    for s in doc:
        if s not in lst:
            problems.append(f"{name}: lists `{s}`, which the contract does not have "
                            "(or with another signature)")
    if not problems:
        if doc != lst:
            problems.append(f"{name}: the members are not in the contract's order:\n  "
                            + "\n  ".join(doc))
        for (s, req_doc), (_, req) in zip(documented, listed):
            if req_doc != req:
                problems.append(f"{name}: `{s}` is {'required' if req else 'optional'} in the "
                                f"contract but documented as {'required' if req_doc else 'optional'}")
    return problems


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--table", required=True, help="the contract_table program")
    p.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    a = p.parse_args()
    root = pathlib.Path(a.root).resolve()
    rows = contract(a.table)
    if not rows:
        print("the contract table printed nothing")
        return 1
    listed = [(signature, required) for signature, required, _ in rows]
    gen = generator(root)

    # The generator reads the list as the compiler does.
    read = [(m.signature, m.required) for m in gen.members(root)]
    problems = compare(f"{gen.CONTRACT} as scripts/contract_docs.py reads it", read, listed)

    # The generated copies are current.
    for rel, text in gen.generated(root).items():
        path = root / rel
        if not path.exists() or path.read_text() != text:
            problems.append(f"{rel} is stale: run scripts/contract_docs.py")

    problems += compare(gen.RUNTIME, header_rows((root / gen.RUNTIME).read_text(), gen.BEGIN,
                                                 gen.END), listed)
    if (root / gen.PAGE).exists():
        problems += compare(gen.PAGE, page_rows(root / gen.PAGE), listed)
    readme = root / "README.md"
    if readme.exists() and readme_rows(readme):
        problems += compare("README.md", readme_rows(readme), listed)
    problems += compare_names("docs/porting.md", porting_sections(root / "docs" / "porting.md"),
                              [m for _, _, m in rows])
    for line in problems:
        print(line)
    print(f"{len(listed)} members; {len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
