"""The docs hold to the code: the configuration reference is the models' own, the site builds
strictly, the README's links land, and every config key the docs name is one the loader takes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from regen.config.audit import Threshold
from regen.config.publish import PublishConfig
from regen.config.reference import COMMAND, PAGE, _submodel, render
from regen.config.settings import RegenConfig

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _user_pages() -> list[Path]:
    """The README and every hand-written page (the reference is checked against the models)."""
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [p for p in pages if p != ROOT / PAGE]


def test_reference_page_is_the_models() -> None:
    committed = (ROOT / PAGE).read_text(encoding="utf-8")
    assert committed == render(), (
        f"{PAGE} disagrees with the models in regen/config/: regenerate it with `{COMMAND}`"
    )


def _fields(model: type[BaseModel], prefix: str) -> list[tuple[str, str | None]]:
    found = []
    for name, field in model.model_fields.items():
        found.append((prefix + name, field.description))
        sub = _submodel(field.annotation)
        if sub is not None and sub is not Threshold:
            found += _fields(sub, f"{prefix}{name}.")
    return found


def test_every_key_has_a_description() -> None:
    keys = _fields(RegenConfig, "") + _fields(PublishConfig, "publish.")
    missing = [key for key, description in keys if not description]
    assert not missing, f"Fields without a description (the reference shows none): {missing}"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """A broken link or anchor, or a page left out of the nav, fails `mkdocs build --strict`."""
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (site / "reference" / "config" / "index.html").is_file()


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and mkdocs' toc both make it for plain headings."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"\s", "-", text)


def _prose(page: Path) -> str:
    """A page without its code blocks and spans, where a `[x](y)` is an example, not a link."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", _user_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_land(page: Path) -> None:
    """Every relative link of a page names a file that exists, and an anchor its headings have
    (mkdocs checks the site's pages too; this also covers the README, which it never reads)."""
    broken = []
    for target in _LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file.relative_to(ROOT)}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def _keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        keys.add(prefix + name)
        sub = _submodel(field.annotation)
        if sub is not None:
            keys |= _keys(sub, f"{prefix}{name}.")
    return keys


_SECTIONS = {
    name for name, f in RegenConfig.model_fields.items() if _submodel(f.annotation) is not None
}
_SECTION = "|".join(sorted(_SECTIONS))
_KEY = re.compile(rf"`((?:{_SECTION})(?:\.[a-z_]+)+)(?:\.\*)?[`:= ]")
_FILES = {"json", "jsonl", "md", "parquet", "png", "py"}  # `audit.json` is a file, not a key


def test_every_key_the_docs_name_exists() -> None:
    """A tuning the docs tell a user to set is a key the config loader accepts."""
    known = _keys(RegenConfig)
    unknown = []
    for page in _user_pages():
        text = page.read_text(encoding="utf-8")
        named = [k for k in _KEY.findall(text) if k.rsplit(".", 1)[1] not in _FILES]
        unknown += [f"{page.name}: {key}" for key in named if key not in known]
        if "DispatchTuning" in text:
            unknown.append(f"{page.name}: DispatchTuning (no config key sets it)")
    assert not unknown, f"keys the config has not: {sorted(set(unknown))}"
