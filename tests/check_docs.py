"""Builds the documentation site and checks the README's links (ctest:
docs.site).

`mkdocs build --strict` of mkdocs.yml into the given folder (a broken
internal link, anchor or nav entry is an error; its hooks, in
docs/_site/hooks.py, run Doxygen over the public headers with warnings as
errors for the API reference), then tests/check_docs_links.py on README.md.
Fails, saying what to install, when MkDocs (pip: mkdocs==1.6.1, in the
Python that runs this) or Doxygen (Debian: doxygen) is missing."""
import argparse
import importlib.util
import pathlib
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(HERE.parent), help="the checkout")
    p.add_argument("--site", required=True, help="where the site is written (in the build tree)")
    a = p.parse_args()
    root = pathlib.Path(a.root).resolve()
    missing = []
    if importlib.util.find_spec("mkdocs") is None:
        missing.append(f"MkDocs is not installed for {sys.executable} (pip install mkdocs==1.6.1)")
    if shutil.which("doxygen") is None:
        missing.append("doxygen is not on PATH (Debian: apt-get install doxygen)")
    if missing:
        print("docs.site cannot build the site:\n  " + "\n  ".join(missing))
        return 1
    site = pathlib.Path(a.site).resolve()
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
                        "--config-file", str(root / "mkdocs.yml"), "--site-dir", str(site)],
                       cwd=root)
    if r.returncode != 0:
        print("mkdocs build --strict failed (above)")
        return 1
    for page in ("index.html", "api/index.html"):
        if not (site / page).is_file():
            print(f"the site lacks {page}")
            return 1
    r = subprocess.run([sys.executable, str(HERE / "check_docs_links.py"), str(root / "README.md")])
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
