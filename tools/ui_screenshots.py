"""Screenshots of what a person sees of a rehearsal in the Prefect UI, in a real browser.

Issue 38 asks for the run page, the artifact cards, the audit artifact with its plots, and a
failed run's page and logs, before and after a change. This script starts a real `prefect
server` (its own PREFECT_HOME in a temporary directory, a free loopback port), runs two small
`regen rehearse`s against it — a clean one and the canary stop (the emulator's empty-answer
incident fault) — finds their flow runs and artifacts through the Prefect API, and has
headless Chromium (Debian's, driven by Playwright) take the pages:

- `<run>-run.png`: the flow run page (state, graph of the task runs, the logs tab);
- `<run>-details.png`: its Details tab (the state message in full);
- `<run>-artifacts-tab.png`: its Artifacts tab;
- `<run>-logs-newest.png`: its logs newest first (the last lines the run wrote);
- `artifacts-cards.png`: the Artifacts page (the latest card of each key);
- `<run>-artifact-<key>.png`: each artifact of the run, the whole page (plots included).

It writes the PNGs and an index.md (what ran, from which code, each picture's URL) to `--out`
(default `benches/results/ui/<label>/`). `--code DIR` runs the rehearsals from another
checkout (a `git worktree` of an older commit): every process the script starts gets
`PYTHONPATH=DIR` first, which wins over the editable install, and index.md records the
`flows.__file__` those processes import.

It is a tool for a person, not a test nor a bench: nothing collects or runs it in CI. It needs
Debian's `chromium` (`apt-get install -y chromium`) and Playwright in a venv of its own
(`--setup` makes it; Playwright's own browser download is never used):

    .venv/bin/python tools/ui_screenshots.py --setup
    .venv/bin/python tools/ui_screenshots.py --label after
    git worktree add /tmp/before 47bedbc
    .venv/bin/python tools/ui_screenshots.py --label before --code /tmp/before
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # support (this checkout's, whatever --code says)

BROWSER_VENV = Path.home() / ".cache" / "regen" / "ui-venv"
PLAYWRIGHT = "playwright==1.65.2"
CHROMIUM = "/usr/bin/chromium"
FAULT = "empty-answer=0.87"  # the incident: a canary stop in seconds (README, live gate)
# Figures that need room: the audit's plots, a long table. A page taller than this is cut.
MAX_PAGE_PX = 6000
# A PNG over this is cut to 256 colours (a third of the bytes; text and plots stay sharp).
QUANTIZE_OVER_BYTES = 60_000


@dataclass
class Shot:
    """One picture: the page, the file, and what to do on it before the screenshot."""

    name: str
    url: str
    what: str
    full_page: bool = False
    tab: str | None = None
    """A tab of the flow run page to click (the UI reads no `?tab=` on a fresh load)."""
    logs_newest_first: bool = False


@dataclass
class Rehearsal:
    """One `regen rehearse` against the server, and the flow run it made."""

    slug: str
    args: list[str]
    exit_code: int = -1
    seconds: float = 0.0
    output_tail: list[str] = field(default_factory=list)
    flow_run_id: str = ""
    flow_run_name: str = ""
    state: str = ""
    state_message: str = ""
    artifacts: list[dict[str, str]] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="current", help="names the default --out folder")
    parser.add_argument("--out", type=Path, help="default benches/results/ui/<label>/")
    parser.add_argument(
        "--code", type=Path, help="checkout the rehearsals import (PYTHONPATH); default this one"
    )
    parser.add_argument("--prompts", type=int, default=600, help="prompts in each rehearsal")
    parser.add_argument("--shard-size", type=int, default=100)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=1200)
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--browser-python", type=Path, default=BROWSER_VENV / "bin" / "python")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--setup", action="store_true", help=f"make the venv with {PLAYWRIGHT}")
    parser.add_argument("--shoot", type=Path, help=argparse.SUPPRESS)  # the browser side
    args = parser.parse_args()
    if args.shoot:
        return shoot(json.loads(args.shoot.read_text()))
    if args.setup:
        return setup(args.browser_python)
    for needed, how in (
        (args.chromium, "apt-get install -y chromium"),
        (str(args.browser_python), "tools/ui_screenshots.py --setup"),
    ):
        if not Path(needed).exists():
            print(f"ui_screenshots: {needed} is missing: {how}", file=sys.stderr)
            return 2
    out = args.out or REPO / "benches" / "results" / "ui" / args.label
    return run(args, out)


def setup(python: Path) -> int:
    """A venv of its own for Playwright (its driver only: the browser is Debian's)."""
    venv = python.parent.parent
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", PLAYWRIGHT], check=True)
    print(f"ui_screenshots: {PLAYWRIGHT} in {venv}")
    return 0


def run(args: argparse.Namespace, out: Path) -> int:
    from support.prefect import prefect_server

    tmp = Path(tempfile.mkdtemp(prefix="regen-ui-"))
    try:
        config = write_inputs(tmp, args.prompts, args.shard_size)
        with prefect_server(tmp / "prefect-home", startup_timeout=240) as server:
            env = dict(server.env)
            if args.code:
                env["PYTHONPATH"] = str(args.code.resolve())
            imported = imports(env, tmp)
            print(f"ui_screenshots: the rehearsals import {imported}")
            common = ["--config", str(config), "--servers", str(args.servers), "--out"]
            runs = [
                Rehearsal("clean", [*common, str(tmp / "rehearsal" / "clean")]),
                Rehearsal(
                    "failed", [*common, str(tmp / "rehearsal" / "failed"), "--emu-fault", FAULT]
                ),
            ]
            for rehearsal in runs:
                rehearse(rehearsal, env, tmp, server)
            shots = plan_shots(server.api_url.removesuffix("/api"), runs)
            out.mkdir(parents=True, exist_ok=True)
            for old in out.glob("*.png"):
                old.unlink()
            plan = {
                "chromium": args.chromium,
                "width": args.width,
                "height": args.height,
                "out": str(out),
                "shots": [asdict(s) for s in shots],
            }
            (tmp / "plan.json").write_text(json.dumps(plan, indent=1))
            # A page that failed is named there and `missing` in index.md; the rest stay.
            shot_ok = (
                subprocess.run(
                    [str(args.browser_python), __file__, "--shoot", str(tmp / "plan.json")],
                    check=False,
                    timeout=1200,
                ).returncode
                == 0
            )
        for png in sorted(out.glob("*.png")):
            shrink(png)
        write_index(out, args, imported, runs, shots)
        print(f"ui_screenshots: {len(list(out.glob('*.png')))} of {len(shots)} pictures in {out}")
        return 0 if shot_ok else 1
    finally:
        if args.keep:
            print(f"ui_screenshots: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def write_inputs(tmp: Path, prompts: int, shard_size: int) -> Path:
    """A prompt file of `prompts` distinct questions and the rehearsal's config; the config
    path. Small shards so the graph has a few shard boxes; live figures every few seconds so
    a run of a minute has a throughput history."""
    lines = [
        json.dumps(
            {
                "id": f"ui-{i:05d}",
                "messages": [{"role": "user", "content": question(i)}],
            }
        )
        for i in range(prompts)
    ]
    (tmp / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    config = tmp / "rehearsal.yaml"
    config.write_text(
        f"prompts: {tmp / 'prompts.jsonl'}\n"
        f"work_dir: {tmp / 'work'}\n"
        f"shard_size: {shard_size}\n"
        "generation:\n"
        "  live_interval_s: 3\n"
        "  progress_interval_s: 1\n"
    )
    return config


def question(i: int) -> str:
    a, b = 17 + 7 * i, 23 + 3 * (i % 97)
    kinds = (
        f"What is {a} times {b}? Show your work.",
        f"Find the greatest common divisor of {a} and {b}, and explain each step.",
        f"Write a short poem about the number {a}.",
        f"Explain in two paragraphs why {b} people might disagree about a shared budget.",
    )
    return kinds[i % len(kinds)]


def imports(env: dict[str, str], cwd: Path) -> str:
    """Where the processes the script starts import `flows` from (PYTHONPATH over the
    editable install): the proof that a before set ran the old code."""
    done = subprocess.run(
        [sys.executable, "-c", "import flows; print(flows.__file__)"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def rehearse(rehearsal: Rehearsal, env: dict[str, str], tmp: Path, server: Any) -> None:
    """Run one rehearsal to its end (a failed one exits 1: that is its point), then read
    its flow run and artifacts from the API."""
    regen = str(Path(sys.executable).parent / "regen")
    before = set(top_level_runs(server))
    started = time.monotonic()
    done = subprocess.run(
        [regen, "rehearse", *rehearsal.args],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    rehearsal.seconds = round(time.monotonic() - started, 1)
    rehearsal.exit_code = done.returncode
    rehearsal.output_tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
    (tmp / f"{rehearsal.slug}.log").write_text(done.stdout + done.stderr)
    print(
        f"ui_screenshots: {rehearsal.slug} rehearsal exited {done.returncode} "
        f"in {rehearsal.seconds} s"
    )
    new = [run for run_id, run in top_level_runs(server).items() if run_id not in before]
    if not new:
        raise SystemExit(
            f"ui_screenshots: the {rehearsal.slug} rehearsal made no flow run:\n"
            + "\n".join(rehearsal.output_tail)
        )
    run = new[0]
    rehearsal.flow_run_id = str(run.id)
    rehearsal.flow_run_name = run.name
    rehearsal.state = run.state.name if run.state else ""
    rehearsal.state_message = (run.state.message or "") if run.state else ""
    rehearsal.artifacts = latest_artifacts(server, run.id)


def top_level_runs(server: Any) -> dict[str, Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentTaskRunId

    only_top = FlowRunFilter(parent_task_run_id=FlowRunFilterParentTaskRunId(is_null_=True))
    with server.client() as client:
        return {str(r.id): r for r in client.read_flow_runs(flow_run_filter=only_top)}


def latest_artifacts(server: Any, flow_run_id: uuid.UUID) -> list[dict[str, str]]:
    """The run's artifacts, the latest of each key (a report rewritten through the run keeps
    its key), oldest key first."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.client.schemas.sorting import ArtifactSort

    with server.client() as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])),
            sort=ArtifactSort.CREATED_DESC,
        )
    latest: dict[str, dict[str, str]] = {}
    for artifact in found:
        key = artifact.key or f"unkeyed-{artifact.type}-{str(artifact.id)[:8]}"
        latest.setdefault(
            key,
            {
                "key": key,
                "id": str(artifact.id),
                "type": str(artifact.type),
                "description": artifact.description or "",
            },
        )
    return list(reversed(latest.values()))


def plan_shots(ui: str, runs: list[Rehearsal]) -> list[Shot]:
    shots = [Shot("artifacts-cards", f"{ui}/artifacts", "the Artifacts page: every key's card")]
    for r in runs:
        page = f"{ui}/runs/flow-run/{r.flow_run_id}"
        shots += [
            Shot(f"{r.slug}-run", page, f"the {r.slug} run's page: state, task graph, logs"),
            Shot(
                f"{r.slug}-details",
                page,
                f"the {r.slug} run's Details tab (its state message)",
                full_page=True,
                tab="Details",
            ),
            Shot(
                f"{r.slug}-artifacts-tab",
                page,
                f"the {r.slug} run's Artifacts tab",
                full_page=True,
                tab="Artifacts",
            ),
            Shot(
                f"{r.slug}-logs-newest",
                page,
                f"the {r.slug} run's logs, newest first (its last lines)",
                logs_newest_first=True,
            ),
        ]
        for artifact in r.artifacts:
            shots.append(
                Shot(
                    f"{r.slug}-artifact-{short_key(artifact['key'])}",
                    f"{ui}/artifacts/artifact/{artifact['id']}",
                    f"the {r.slug} run's artifact {artifact['key']} ({artifact['type']})",
                    full_page=True,
                )
            )
    return shots


def short_key(key: str) -> str:
    """An artifact key without the dataset slug every key ends with (`-rehearsal-failed`)."""
    for suffix in ("-rehearsal-clean", "-rehearsal-failed"):
        if suffix in key:
            return key[: key.index(suffix)]
    return key[:60]


def shrink(png: Path) -> None:
    """Cut a large PNG to 256 colours, so a set stays a few MB in git."""
    if png.stat().st_size <= QUANTIZE_OVER_BYTES:
        return
    from PIL import Image

    with Image.open(png) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(png, optimize=True)


def write_index(
    out: Path, args: argparse.Namespace, imported: str, runs: list[Rehearsal], shots: list[Shot]
) -> None:
    code = (args.code or REPO).resolve()
    head = subprocess.run(
        ["git", "-C", str(code), "log", "-1", "--format=%h %cI %s"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(code), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    lines = [
        f"# Prefect UI screenshots: {args.label}",
        "",
        f"Taken {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        "`tools/ui_screenshots.py`: a real `prefect server`, headless Chromium "
        f"{args.width}x{args.height}.",
        "",
        f"- code: `{code}` at `{head[:160]}`"
        + (f", with {len(dirty.splitlines())} uncommitted file(s)" if dirty else ""),
        f"- the rehearsals imported `{imported}`",
        f"- each rehearsal: {args.prompts} prompts, shards of {args.shard_size}, "
        f"{args.servers} emulators; the failed one with `--emu-fault {FAULT}`",
        "",
    ]
    for r in runs:
        lines += [
            f"## {r.slug}: `regen rehearse {' '.join(strip_tmp(a) for a in r.args)}`",
            "",
            f"exit {r.exit_code} in {r.seconds} s; flow run `{r.flow_run_name}` "
            f"({r.flow_run_id}), state **{r.state}**",
            "",
            "state message:",
            "",
            "```",
            r.state_message or "(none)",
            "```",
            "",
            "last lines of its output:",
            "",
            "```",
            *(strip_tmp(line) for line in r.output_tail),
            "```",
            "",
            "| artifact | type | description |",
            "|---|---|---|",
            *(
                f"| {a['key']} | {a['type']} | {a['description'].replace('|', '/')} |"
                for a in r.artifacts
            ),
            "",
        ]
    lines += ["## Pictures", "", "| file | what | KB |", "|---|---|---|"]
    for s in shots:
        png = out / f"{s.name}.png"
        size = f"{png.stat().st_size // 1024}" if png.exists() else "missing"
        lines.append(f"| [{s.name}.png]({s.name}.png) | {s.what} | {size} |")
    (out / "index.md").write_text("\n".join(lines) + "\n")


def strip_tmp(text: str) -> str:
    """Paths under the temporary directory, shortened (they name nothing after the run)."""
    return text.replace(tempfile.gettempdir() + "/", "$TMP/")


# The browser side: runs in the Playwright venv, imports nothing of regen or Prefect.


def shoot(plan: dict[str, Any]) -> int:
    sync_api = importlib.import_module("playwright.sync_api")
    out = Path(plan["out"])
    failed = 0
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=plan["chromium"],
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        for raw in plan["shots"]:
            shot = Shot(**raw)
            viewport = {"width": plan["width"], "height": plan["height"]}
            page = browser.new_page(viewport=viewport)
            started = time.monotonic()
            try:
                render(page, shot)
                if shot.full_page:
                    grow(page, plan["width"], plan["height"])
                page.screenshot(path=str(out / f"{shot.name}.png"))
                print(f"ui_screenshots: {shot.name}.png ({time.monotonic() - started:.0f} s)")
            except Exception as error:  # one bad page must not lose the others
                failed += 1
                print(f"ui_screenshots: {shot.name}: {error}", file=sys.stderr)
            finally:
                page.close()
        browser.close()
    return 1 if failed else 0


def render(page: Any, shot: Shot) -> None:
    """Load the SPA and wait until it has drawn: the network quiet, no loading marker."""
    page.goto(shot.url, wait_until="domcontentloaded", timeout=60_000)
    settle(page)
    if shot.tab:
        page.locator("li.p-tab", has_text=shot.tab).first.click(timeout=15_000)
        settle(page)
    if shot.logs_newest_first:
        # The sort is a popover select that opens on no synthetic click; its keyboard works.
        sort = page.locator(".logs-sort button").first
        sort.focus(timeout=15_000)
        page.keyboard.press("ArrowDown")
        page.keyboard.press("Enter")
        if sort.get_attribute("modelvalue") != "TIMESTAMP_DESC":
            raise RuntimeError("the logs' sort did not turn to newest first")
        settle(page)


def settle(page: Any) -> None:
    # A page that polls never goes quiet: the wait below still lets it draw.
    with contextlib.suppress(Exception):
        page.wait_for_load_state("networkidle", timeout=5_000)
    page.wait_for_timeout(2_000)


def grow(page: Any, width: int, height: int) -> None:
    """Make the viewport as tall as the page's scrolling content (the UI scrolls an inner
    element, so Playwright's full_page sees only the window), up to MAX_PAGE_PX."""
    tall = page.evaluate(
        "() => Math.max(...[document.documentElement, document.body,"
        " ...document.querySelectorAll('*')].map(e => e.scrollHeight || 0))"
    )
    if tall > height:
        page.set_viewport_size({"width": width, "height": min(int(tall) + 40, MAX_PAGE_PX)})
        page.wait_for_timeout(1_500)


if __name__ == "__main__":
    raise SystemExit(main())
