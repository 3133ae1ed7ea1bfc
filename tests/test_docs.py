"""What the docs show stays true: the example configuration, the circuits table in docs/engine.md,
the README's length and every relative link in the README and docs/*.md."""

import re
import subprocess
from pathlib import Path

from cuzk_engine.config import EngineConfig, load_config
from cuzk_engine.vocabulary import DEFAULT_PRIORITIES

README_MAX_LINES = 400

# [text](target) and ![alt](target), with an optional "title" after the target.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCED_CODE = re.compile(r"^ *(```|~~~).*?^ *\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def markdown_files(repo: Path) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def relative_links(text: str) -> list[str]:
    """The relative targets of a page's links and images, without their #anchors. Code blocks
    and code spans are left out: a bracket there is code, not a link."""
    text = INLINE_CODE.sub("", FENCED_CODE.sub("", text))
    targets = []
    for target in LINK.findall(text):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_example_config_loads_and_matches_the_defaults(repo):
    example = load_config(repo / "cuzk.example.toml")
    defaults = EngineConfig()
    assert example.devices == defaults.devices
    assert example.gpu_workers_per_device == defaults.gpu_workers_per_device
    assert example.daemon.listen == defaults.daemon.listen
    assert example.memory.eviction_min_idle == defaults.memory.eviction_min_idle
    assert example.status.retention == defaults.status.retention
    assert example.priorities == DEFAULT_PRIORITIES


def test_engine_docs_circuits_table_is_the_commands_output(repo, python):
    table = subprocess.run([python, "-m", "cuzk_engine", "circuits"], cwd=repo, check=True,
                           capture_output=True, text=True).stdout.strip()
    assert table.count("\n") == 17  # header, rule, 16 circuits
    assert table in (repo / "docs" / "engine.md").read_text()


def test_the_readme_is_at_most_400_lines(repo):
    lines = len((repo / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; move detail into a page under docs/ and link it")


def test_every_relative_link_in_the_readme_and_docs_points_at_a_file(repo):
    root = repo.resolve()
    broken = []
    for page in markdown_files(repo):
        for target in relative_links(page.read_text()):
            path = (page.parent / target).resolve()
            if not path.exists() or not path.is_relative_to(root):
                broken.append(f"{page.relative_to(repo)}: {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_readme_links_every_docs_page(repo):
    readme = (repo / "README.md").read_text()
    linked = {(repo / target).resolve() for target in relative_links(readme)}
    unlinked = [page.name for page in sorted((repo / "docs").glob("*.md"))
                if page.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_the_link_finder_sees_links_and_images_but_not_urls_anchors_or_code():
    text = (
        "See [a](docs/a.md), [b](b.md#part \"Title\") and ![c](c.png).\n"
        "[web](https://example.com/x.md) [top](#top) [mail](mailto:x@example.com)\n"
        "`[not](code.md)`\n"
        "```\n[not](fenced.md)\n```\n"
    )
    assert relative_links(text) == ["docs/a.md", "b.md", "c.png"]
