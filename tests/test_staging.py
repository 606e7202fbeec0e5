"""Model staging from a directory, a real S3 API (moto) and a loopback Hugging Face Hub into a tmp
dir standing in for /dev/shm: identical content, marker last, idempotent, partial copies
repaired, refusals named."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psutil
import pytest

from regen.display.figures import byte_size
from regen.errors import UserError
from regen.staging import MARKER_NAME, StageMarker, StageResult, check_space, stage_model
from regen.staging.layout import HUB_DOWNLOAD
from support.s3 import MotoS3
from tests.support.hub import hub_settings

MODEL_FILES = {
    "config.json": b'{"architectures": ["Qwen3ForCausalLM"]}',
    "tokenizer.json": b'{"model": {}}',
    "tokenizer_config.json": b"{}",
    "model-00001-of-00002.safetensors": os.urandom(300_000),
    "model-00002-of-00002.safetensors": os.urandom(200_000),
    "model.safetensors.index.json": json.dumps(
        {
            "weight_map": {
                "a": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors",
            }
        }
    ).encode(),
    "original/params.json": b"{}",
}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    root = tmp_path / "model"
    for name, data in MODEL_FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.fixture
def s3_model(moto: MotoS3) -> str:
    bucket = moto.create_bucket()
    client = moto.client()
    for name, data in MODEL_FILES.items():
        client.put_object(Bucket=bucket, Key=f"models/qwen/{name}", Body=data)
    return f"s3://{bucket}/models/qwen"


def _assert_staged(target: Path) -> None:
    staged = {
        p.relative_to(target).as_posix(): p.read_bytes()
        for p in target.rglob("*")
        if p.is_file() and p.name != MARKER_NAME
    }
    assert staged == MODEL_FILES
    marker = StageMarker.model_validate_json((target / MARKER_NAME).read_bytes())
    assert {f.name: f.size for f in marker.files} == {k: len(v) for k, v in MODEL_FILES.items()}


def test_stage_local_then_restage_is_a_no_op(model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "shm" / "qwen"
    seen: list[tuple[int, int]] = []
    first = stage_model(str(model_dir), target, progress=lambda d, t: seen.append((d, t)))
    _assert_staged(target)
    total = sum(len(v) for v in MODEL_FILES.values())
    assert not first.skipped and first.copied_files == len(MODEL_FILES)
    assert first.bytes == total and max(seen) == (total, total)
    second = stage_model(str(model_dir), target)
    assert second.skipped and second.copied_bytes == 0


def test_stage_from_s3_checks_etags_and_repairs(
    s3_model: str, moto: MotoS3, tmp_path: Path
) -> None:
    target = tmp_path / "shm" / "qwen"
    first = stage_model(s3_model, target, s3_client_factory=moto.client)
    _assert_staged(target)
    assert first.copied_files == len(MODEL_FILES) and first.throughput > 0
    assert stage_model(s3_model, target, s3_client_factory=moto.client).skipped

    (target / "model-00002-of-00002.safetensors").unlink()
    with (target / "model-00001-of-00002.safetensors").open("r+b") as fh:
        fh.truncate(1000)
    repaired = stage_model(s3_model, target, s3_client_factory=moto.client)
    assert not repaired.skipped and repaired.copied_files == 2
    _assert_staged(target)


def test_s3_source_from_the_environment(
    s3_model: str, moto: MotoS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in moto.env.items():
        monkeypatch.setenv(name, value)
    stage_model(s3_model, tmp_path / "t")
    _assert_staged(tmp_path / "t")


def test_partial_copy_without_marker_is_completed(model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "t"
    stage_model(str(model_dir), target)
    # What an interrupted run leaves: some files, a half-written part file, no marker.
    (target / MARKER_NAME).unlink()
    (target / "tokenizer.json").unlink()
    (target / ".tokenizer.json.regen-part").write_bytes(b"half")
    result = stage_model(str(model_dir), target)
    assert not result.skipped and result.copied_files == 1
    _assert_staged(target)
    assert not list(target.rglob("*.regen-part"))


def test_changed_source_file_is_recopied(model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "t"
    stage_model(str(model_dir), target)
    config = model_dir / "config.json"
    config.write_bytes(config.read_bytes().replace(b"Qwen3", b"Qwen4"))
    result = stage_model(str(model_dir), target)
    assert result.copied_files == 1
    assert (target / "config.json").read_bytes() == config.read_bytes()


def test_a_different_revision_is_not_the_same_staging(model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "t"
    stage_model(str(model_dir), target, revision="v1")
    result = stage_model(str(model_dir), target, revision="v2")
    assert not result.skipped and result.copied_files == len(MODEL_FILES)


def test_too_small_target_is_refused_with_both_figures(model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "t"
    model = byte_size(sum(len(v) for v in MODEL_FILES.values()))
    with pytest.raises(
        UserError, match=rf"needs {model} \+ 1\.00 PB margin, only [\d.,]+ [KMGT]?B free on /"
    ):
        stage_model(str(model_dir), target, margin_bytes=10**15)
    assert not target.exists()


def test_ram_disk_must_fit_in_ram() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    free = shutil.disk_usage(shm).free
    available = psutil.virtual_memory().available
    if free <= available:
        pytest.skip("/dev/shm is smaller than available RAM: the disk check refuses first")
    # Fits the tmpfs, not the RAM behind it: a tmpfs may be sized beyond what is free.
    need = (free + available) // 2
    with pytest.raises(UserError, match=r"is a RAM disk: staging needs [\d.,]+ [KMGT]?B .* of RAM"):
        check_space(shm / "regen-test-never-created", need, 0)
    check_space(shm / "regen-test-never-created", 1 << 20, 0)


def test_missing_model_files_are_named(model_dir: Path, tmp_path: Path) -> None:
    (model_dir / "config.json").unlink()
    (model_dir / "tokenizer_config.json").unlink()
    with pytest.raises(UserError, match=r"missing config\.json, tokenizer_config\.json$") as caught:
        stage_model(str(model_dir), tmp_path / "t")
    assert str(model_dir) in str(caught.value)
    for shard in model_dir.glob("*.safetensors"):
        shard.unlink()
    with pytest.raises(UserError, match=r"weights \(\*\.safetensors or \*\.bin\)"):
        stage_model(str(model_dir), tmp_path / "t")


def test_index_naming_an_absent_shard_is_refused(model_dir: Path, tmp_path: Path) -> None:
    (model_dir / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UserError, match=r"names missing model-00002-of-00002\.safetensors"):
        stage_model(str(model_dir), tmp_path / "t")
    assert not (tmp_path / "t" / MARKER_NAME).exists()


def test_bad_sources_are_user_errors(tmp_path: Path, moto: MotoS3) -> None:
    with pytest.raises(UserError, match=r"/nowhere: model directory does not exist"):
        stage_model(str(tmp_path / "nowhere"), tmp_path / "t")
    with pytest.raises(UserError, match=r"ftp://x: unsupported model source"):
        stage_model("ftp://x", tmp_path / "t")
    # At once: each S3 call sent once, the missing bucket not retried as an outage would be
    # (again and again until the storage's deadline).
    calls: list[str] = []
    with pytest.raises(UserError, match=r"s3://regen-no-such-models: bucket does not exist"):
        stage_model(
            "s3://regen-no-such-models/m", tmp_path / "t",
            s3_client_factory=lambda: moto.counting_client(calls),
        )  # fmt: skip
    assert calls and len(set(calls)) == len(calls), calls


# --- the Hugging Face Hub, as a loopback server speaking the Hub's HTTP API ---------------------

HUB_REPO = "org/qwen"
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"
# Weights are LFS files (the Hub lists their sha256); the small JSON files are plain git blobs.
HUB_LFS = {name for name in MODEL_FILES if name.endswith(".safetensors")}


class FakeHub(ThreadingHTTPServer):
    """Serves MODEL_FILES as `org/qwen` at one commit: the model info, the file tree and the
    resolve URLs `huggingface_hub` calls; counts the file bodies it sends."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.files = dict(MODEL_FILES)
        self.refused: set[str] = set()
        self.sent: list[str] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def entry(self, name: str, sha_key: str = "sha256") -> dict[str, Any]:
        data = MODEL_FILES[name]  # what the listing promises; `files` is what is sent
        lfs = {sha_key: hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 130}
        oid = hashlib.sha1(data, usedforsecurity=False).hexdigest()
        return {
            "path": name,
            "size": len(data),
            "oid": oid,
            "lfs": lfs if name in HUB_LFS else None,
        }


class _HubHandler(BaseHTTPRequestHandler):
    server: FakeHub

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = urlparse(self.path).path
        info = f"/api/models/{HUB_REPO}"
        resolve = f"/{HUB_REPO}/resolve/{HUB_COMMIT}/"
        hub = self.server
        if path in (info, f"{info}/revision/main"):
            siblings = [
                {"rfilename": e["path"], "size": e["size"], "blobId": e["oid"], "lfs": e["lfs"]}
                for e in map(hub.entry, MODEL_FILES)
            ]
            self._json({"id": HUB_REPO, "sha": HUB_COMMIT, "siblings": siblings})
        elif path == f"{info}/tree/{HUB_COMMIT}":
            # The tree calls an LFS file's sha256 `oid` where the model info says `sha256`.
            self._json([{"type": "file", **hub.entry(name, "oid")} for name in MODEL_FILES])
        elif path.startswith(resolve) and (name := path.removeprefix(resolve)) not in hub.refused:
            entry, data = hub.entry(name), hub.files[name]
            self.send_response(200)
            self.send_header("X-Repo-Commit", HUB_COMMIT)
            self.send_header(
                "ETag", f'"{entry["lfs"]["sha256"] if entry["lfs"] else entry["oid"]}"'
            )
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                hub.sent.append(name)
                self.wfile.write(data)
        else:
            self.send_error(404)

    def _json(self, value: object) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeHub]:
    """The Hub, and huggingface_hub in this process pointed at it with its own home."""
    server = FakeHub()
    # shutdown() waits for the serving loop's next poll: 0.5 s by default, per test.
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        hub_settings(monkeypatch, server.endpoint, tmp_path / "hf-home")
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _stage_from_hub(target: Path) -> StageResult:
    """A staging from the `hub` fixture's Hub, in this process (its settings point there)."""
    return stage_model("hf://org/qwen", target, workers=2)


def test_stage_from_the_hub_fetches_only_what_is_missing(hub: FakeHub, tmp_path: Path) -> None:
    target = tmp_path / "shm" / "qwen"
    first = _stage_from_hub(target)
    _assert_staged(target)
    assert not first.skipped and first.copied_files == len(MODEL_FILES)
    assert sorted(hub.sent) == sorted(MODEL_FILES)
    assert not (target / HUB_DOWNLOAD).exists()

    hub.sent.clear()
    assert _stage_from_hub(target).skipped and hub.sent == []

    (target / "model-00002-of-00002.safetensors").unlink()
    with (target / "config.json").open("r+b") as fh:
        fh.truncate(3)
    repaired = _stage_from_hub(target)
    assert not repaired.skipped and repaired.copied_files == 2
    assert sorted(hub.sent) == ["config.json", "model-00002-of-00002.safetensors"]
    _assert_staged(target)


def test_hub_bytes_unlike_the_listing_are_refused_then_fetched_again(
    hub: FakeHub, tmp_path: Path
) -> None:
    shard = "model-00001-of-00002.safetensors"
    hub.files[shard] = bytes(len(MODEL_FILES[shard]))  # the right size, the wrong bytes
    target = tmp_path / "t"
    with pytest.raises(UserError, match=rf"hf://org/qwen/{shard}: sha256 does not match"):
        _stage_from_hub(target)
    assert not (target / MARKER_NAME).exists() and not (target / shard).exists()
    # The refused bytes are not kept for a resumed download to trust.
    hub.files[shard], hub.sent = MODEL_FILES[shard], []
    _stage_from_hub(target)
    _assert_staged(target)
    assert shard in hub.sent


def test_interrupted_hub_download_resumes_with_what_is_missing(
    hub: FakeHub, tmp_path: Path
) -> None:
    shard = "model-00002-of-00002.safetensors"
    hub.refused.add(shard)
    target = tmp_path / "t"
    with pytest.raises(
        UserError, match=rf"hf://org/qwen: not found on the Hub \(HTTP 404 .*{shard}"
    ):
        _stage_from_hub(target)
    assert not (target / MARKER_NAME).exists()
    # Downloads run in parallel: the refusal may cancel others, which the resume then fetches.
    kept = {name for name in MODEL_FILES if (target / HUB_DOWNLOAD / name).is_file()}
    assert kept, "nothing was downloaded before the refusal"
    hub.refused.clear()
    hub.sent.clear()
    resumed = _stage_from_hub(target)
    assert shard in hub.sent and not kept & set(hub.sent), (kept, hub.sent)
    assert resumed.copied_files == len(MODEL_FILES)
    _assert_staged(target)


def test_a_remote_models_tokenizer_is_fetched_alone_where_nothing_is_staged(
    s3_model: str, tmp_path: Path, moto: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    from regen.config import ModelConfig
    from regen.run import resolve_tokenizer

    for key, value in moto.env.items():
        monkeypatch.setenv(key, value)
    model = ModelConfig(source=s3_model, served_name="m", stage_dir=tmp_path / "never-staged")
    found = resolve_tokenizer(model, tmp_path / "tok")
    assert found == tmp_path / "tok"
    names = {p.name for p in found.iterdir() if p.name != MARKER_NAME}
    assert names == {"tokenizer.json", "tokenizer_config.json"}, "the weights stay remote"
    # Once the model is staged on this machine, its directory is the answer.
    (tmp_path / "never-staged").mkdir()
    assert resolve_tokenizer(model, tmp_path / "tok") == tmp_path / "never-staged"
    pinned = model.model_copy(update={"tokenizer_path": tmp_path / "mine"})
    assert resolve_tokenizer(pinned, None) == tmp_path / "mine"


def test_a_dress_rehearsal_fetches_the_tokenizer_files_and_no_weight(
    hub: FakeHub, tmp_path: Path
) -> None:
    """The twin of a Hub model needs its tokenizer and template only: not one byte of weights."""
    from regen.rehearsal.dress import fetch_tokenizer

    target = fetch_tokenizer("hf://org/qwen", None, tmp_path / "tok", None)
    assert sorted(p.name for p in target.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert sorted(hub.sent) == ["tokenizer.json", "tokenizer_config.json"]
