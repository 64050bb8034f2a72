"""The README's structure: short, every heading with its own anchor, every link into it or into the
docs finding its target, and the own-loop quickstart where the wheel test finds it.

The reference itself lives in the documentation site (``docs/``); ``tests/test_docs.py`` checks
that its API reference documents every public name.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 300


def _github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(text: str) -> list[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # no '#' lines of code blocks
    return [m.group(2) for m in re.finditer(r"^(#{1,6}) (.+)$", text, re.M)]


def _prose(text: str) -> str:
    """The text outside code blocks (a link in a code sample is not a link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def test_the_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines < MAX_LINES, f"README.md has {lines} lines; keep it under {MAX_LINES} and move reference text to docs/"


def test_headings_are_unique():
    repeated = sorted(h for h, n in Counter(_github_anchor(h) for h in _headings(README.read_text())).items() if n > 1)
    assert not repeated, f"headings sharing an anchor: {repeated}"


def test_in_page_links_point_at_headings():
    anchors = {_github_anchor(h) for h in _headings(README.read_text())}
    links = set(re.findall(r"\]\(#([^)]+)\)", _prose(README.read_text())))
    assert links <= anchors, f"links to missing headings: {sorted(links - anchors)}"


def test_links_into_the_docs_find_their_page_and_heading():
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", _prose(README.read_text()))
    assert links, "the README links into docs/"
    broken = []
    for page, anchor in links:
        path = ROOT / page
        if not path.is_file():
            broken.append(f"{page}: no such file")
        elif anchor:
            # The site's anchors (Python-Markdown's), which GitHub's agree with for plain headings.
            found = {slugify(re.sub(r"[`*]", "", h), "-") for h in _headings(path.read_text())}
            if anchor not in found:
                broken.append(f"{page}#{anchor}: no such heading")
    assert not broken, f"README links into docs/ that find nothing: {broken}"


def test_the_own_loop_quickstart_is_a_python_block_behind_its_marker():
    # tests/test_package_install.py runs this block from a wheel install, as written.
    text = README.read_text()
    match = re.search(r"^<!-- quickstart: own loop -->\n```python\n(.*?)^```", text, re.M | re.S)
    assert match, "README.md needs the line '<!-- quickstart: own loop -->' directly before a ```python block"
    assert "from gpufeed" in match.group(1)


def test_the_cli_quickstart_config_is_valid_and_reads_what_synth_writes(tmp_path):
    """The quickstarts' train.yaml, as written, against a real `gpufeed synth` folder (their run itself is
    what tests/test_train_loop.py and the demo test do); the serving quickstart's image is in it too."""
    from gpufeed.config import load_config
    from gpufeed.synth import write_synthetic_dataset

    text = README.read_text()
    config = re.search(r"^cat > train\.yaml <<'EOF'\n(.*?)^EOF$", text, re.M | re.S)
    assert config, "the CLI quickstart writes train.yaml with a quoted here-document"
    synth = re.search(r"^gpufeed synth --out (\S+)", text, re.M)
    assert synth and synth.group(1) == "data", "the CLI quickstart starts with `gpufeed synth --out data`"
    write_synthetic_dataset(tmp_path / "data", progress=False)
    (tmp_path / "train.yaml").write_text(config.group(1))
    cfg = load_config(tmp_path / "train.yaml")
    for split in (cfg.data.train, cfg.data.val):
        assert Path(split.root).is_dir() and any(Path(split.root).iterdir()), f"{split.root} holds no class folders"
    images = re.findall(r"--data-binary @(\S+)", text)
    assert images, "the serving quickstart sends an image with curl"
    missing = [image for image in images if not (tmp_path / image).is_file()]
    assert not missing, f"the serving quickstart sends images `gpufeed synth` does not write: {missing}"
