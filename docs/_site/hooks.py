"""MkDocs hooks of the documentation site (mkdocs.yml names this file).

- The API reference: Doxygen runs over the public headers
  (docs/_site/Doxyfile, warnings as errors), and its HTML becomes the site's
  api/ folder, so that links to api/... are checked like any other. A
  Doxygen warning, or no Doxygen, fails the build.
- The design notes: the pages of docs/design/ are added to the nav under
  "Design notes", after its index, whichever exist, and the index lists them
  where it says <!-- design pages -->, so that no link names a page that
  does not exist."""
import pathlib
import re
import shutil
import subprocess
import tempfile

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, InclusionLevel

DESIGN_SECTION = "Design notes"
DESIGN_MARKER = "<!-- design pages -->"
_api_dir = None


def _design_pages(docs_dir):
    folder = pathlib.Path(docs_dir) / "design"
    return sorted(p.name for p in folder.glob("*.md") if p.name != "index.md")


def _title(path):
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#\s+(.+)", line)
        if m:
            return m.group(1).strip()
    return path.stem


def on_config(config):
    pages = _design_pages(config["docs_dir"])
    for item in config["nav"] or []:
        if isinstance(item, dict) and DESIGN_SECTION in item:
            item[DESIGN_SECTION] = ["design/index.md"] + [f"design/{p}" for p in pages]
    return config


def _doxygen(config):
    """Doxygen's HTML of include/accelkit in a temporary folder."""
    doxygen = shutil.which("doxygen")
    if doxygen is None:
        raise PluginError("doxygen not found: the API reference needs it (Debian: apt-get install doxygen)")
    root = pathlib.Path(config["config_file_path"]).resolve().parent
    out = pathlib.Path(tempfile.mkdtemp(prefix="accelkit-doxygen-"))
    settings = (root / "docs/_site/Doxyfile").read_text(encoding="utf-8") + "\n".join([
        "",
        f'INPUT = "{root}/docs/_site/fmt_scope.hpp" "{root}/include/accelkit"',
        f'OUTPUT_DIRECTORY = "{out}"',
        f'STRIP_FROM_PATH = "{root}/include"',
        f'STRIP_FROM_INC_PATH = "{root}/include"',
        ""])
    r = subprocess.run([doxygen, "-"], input=settings, text=True, capture_output=True, cwd=root)
    if r.returncode != 0 or r.stderr.strip():
        shutil.rmtree(out, ignore_errors=True)
        raise PluginError("Doxygen failed on the public headers (docs/_site/Doxyfile):\n"
                          + r.stdout + r.stderr)
    return out


def on_files(files, config):
    global _api_dir
    _api_dir = _doxygen(config)
    html = _api_dir / "api"
    for path in sorted(html.rglob("*")):
        if path.is_file():
            uri = "api/" + path.relative_to(html).as_posix()
            files.append(File.generated(config, uri, abs_src_path=str(path),
                                        inclusion=InclusionLevel.NOT_IN_NAV))
    return files


def on_post_build(config):
    global _api_dir
    if _api_dir is not None:
        shutil.rmtree(_api_dir, ignore_errors=True)
        _api_dir = None


def on_build_error(error):
    on_post_build(None)


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != "design/index.md" or DESIGN_MARKER not in markdown:
        return markdown
    docs = pathlib.Path(config["docs_dir"])
    lines = [f"- [{_title(docs / 'design' / p)}]({p})" for p in _design_pages(docs)]
    return markdown.replace(DESIGN_MARKER, "\n".join(lines) or "(none yet)")
