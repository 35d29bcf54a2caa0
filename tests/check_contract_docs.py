"""The contract's two documentation tables name exactly the members of the
contract table, with the same signatures (ctest: core.contract_docs).

The members are listed once, in include/accelkit/detail/contract.hpp (Note
[The contract table]); `--table` is the program that prints that list
(tests/contract_table.cpp), one "required|member|signature" line each. The
README's table (rows "| `signature` | yes/no | ...") and runtime.hpp's doc
tables (rows "// | signature | ...", the required ones before the heading
"Optional members") must list the same members, in the same order, with the
same signatures and the same required/optional split. The porting guide
(docs/porting.md, `--porting`) names the members without their signatures,
one "### `member`" section each, and must go through exactly the
contract's members in its order. Prints every difference and fails if there
is one."""
import argparse
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


def readme_rows(path):
    rows = []
    for line in pathlib.Path(path).read_text().splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|\s*(yes|no)\s*\|", line)
        if m:
            rows.append((m.group(1), m.group(2) == "yes"))
    return rows


def header_rows(path):
    rows, required = [], True
    for line in pathlib.Path(path).read_text().splitlines():
        if line.startswith("// Optional members"):
            required = False
        m = re.match(r"//\s*\|\s*([^|]+?)\s*\|", line)
        if m and m.group(1) not in ("member",) and not set(m.group(1)) <= set("-"):
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
    p.add_argument("--table", required=True)
    p.add_argument("readme")
    p.add_argument("runtime_hpp")
    p.add_argument("--porting", help="docs/porting.md: one section per member, by name, in order")
    a = p.parse_args()
    rows = contract(a.table)
    if not rows:
        print("the contract table printed nothing")
        return 1
    listed = [(signature, required) for signature, required, _ in rows]
    problems = compare(a.readme, readme_rows(a.readme), listed)
    problems += compare(a.runtime_hpp, header_rows(a.runtime_hpp), listed)
    if a.porting:
        problems += compare_names(a.porting, porting_sections(a.porting), [m for _, _, m in rows])
    for line in problems:
        print(line)
    print(f"{len(listed)} members; {len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
