"""The shell scripts: lint-clean, safe to try with --dry-run on any machine, and honest on failure.

The setup scripts are meant for a phone (Termux) and a Raspberry Pi; here they run with --dry-run,
which shows each step and changes nothing, and with `uname -m` overridden to play a 32-bit board.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import hear_ctrl_c

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
SETUP_SCRIPTS = ("termux-setup.sh", "rpi-setup.sh")
SETUP_COMMON = "setup-common.sh"  # the steps both share, sourced by each
ASK = "edgespec-ask.sh"
INSTALL_LLAMA = "install-llama-cpp.sh"  # the Makefile's install step
BASH = shutil.which("bash") or "/bin/bash"

ANSWER = "A palindrome reads the same both ways."
STATS = {"n_generated": 2, "tokens_per_s": 35.5, "draft_tokens": 4, "acceptance_rate": 0.9}
FAKE_RESULT = json.dumps({"text": ANSWER, "tokens": [1, 2], "stats": {**STATS, "mode": "chain"}})
# A stand-in for edgespec: records its arguments and stdin, then prints FAKE_RESULT, or fails like
# edgespec does when FAKE_EXIT is set. Only shell builtins, so that it runs with a bare PATH.
FAKE_EDGESPEC = f"""#!/bin/sh
printf '%s\\n' "$*" > "$FAKE_DIR/args"
while IFS= read -r line; do printf '%s\\n' "$line" >> "$FAKE_DIR/stdin"; done
if [ -n "${{FAKE_EXIT:-}}" ]; then
    printf 'error: model file not found: nope.gguf\\n' >&2
    exit "$FAKE_EXIT"
fi
printf '%s\\n' '{FAKE_RESULT}'
"""


def run_script(
    script: str, *args: str, env: dict[str, str], stdin: str = "", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs scripts/<script> with exactly `env`; stdin is a pipe, never the terminal."""
    return subprocess.run(
        [BASH, str(SCRIPTS / script), *args],
        env=env,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def files_under(root: Path) -> set[Path]:
    return set(root.rglob("*"))


@pytest.fixture
def sandbox(tmp_path) -> dict[str, str]:
    """An environment whose HOME, virtual environment and edgespec home are fresh and empty, on
    this machine's own architecture (a Pi script only warns on x86_64), with 8 GiB of memory."""
    (tmp_path / "home").mkdir()
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "EDGESPEC_VENV": str(tmp_path / "venv"),
        "EDGESPEC_HOME": str(tmp_path / "edgespec"),
        "EDGESPEC_MEM_MIB": "8192",
    }


# shellcheck


@pytest.mark.skipif(
    shutil.which("shellcheck") is None,
    reason="shellcheck is not installed (Debian: apt-get install shellcheck)",
)
@pytest.mark.parametrize("script", [*SETUP_SCRIPTS, SETUP_COMMON, ASK, INSTALL_LLAMA])
def test_each_script_passes_shellcheck(script):
    checked = subprocess.run(
        ["shellcheck", str(SCRIPTS / script)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout


@pytest.mark.parametrize("script", [*SETUP_SCRIPTS, ASK, INSTALL_LLAMA])
def test_each_script_is_executable(script):
    assert os.access(SCRIPTS / script, os.X_OK)


# the llama-cpp-python build (scripts/install-llama-cpp.sh, the Makefile's install step)

XEON_WITH_AMX = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8
processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8
"""
ZEN_5 = """processor\t: 0
model name\t: AMD EPYC Processor
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni
"""
ZEN_3 = """processor\t: 0
model name\t: AMD EPYC Processor
flags\t\t: fpu sse2 avx2
"""


def llama_build(sandbox: dict[str, str], tmp_path: Path, cpuinfo: str, **env: str) -> str:
    """The steps the install script would take on a CPU that /proc/cpuinfo says is `cpuinfo`."""
    info = tmp_path / f"cpuinfo-{abs(hash(cpuinfo))}"
    info.write_text(cpuinfo)
    done = run_script(
        INSTALL_LLAMA,
        "--dry-run",
        "venv/bin/python",
        env={**sandbox, "EDGESPEC_CPUINFO": str(info), **env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def wheel_dir(steps: str) -> str:
    """Where the install step takes llama-cpp-python's wheel from."""
    words = next(line.split() for line in steps.splitlines() if "--find-links" in line)
    return words[words.index("--find-links") + 1]


def test_a_llama_build_is_kept_for_the_cpu_it_was_compiled_for(sandbox, tmp_path):
    """A native build on one CPU may not run on another (AVX-512 on a Zen 3: Illegal
    instruction), so a kept wheel is found again only on a CPU of the same instruction sets."""
    xeon = wheel_dir(llama_build(sandbox, tmp_path, XEON_WITH_AMX))
    assert wheel_dir(llama_build(sandbox, tmp_path, XEON_WITH_AMX)) == xeon
    zen_5 = wheel_dir(llama_build(sandbox, tmp_path, ZEN_5))
    zen_3 = wheel_dir(llama_build(sandbox, tmp_path, ZEN_3))
    assert len({xeon, zen_5, zen_3}) == 3
    assert xeon.startswith(f"{sandbox['EDGESPEC_HOME']}/wheels/llama-cpp-python-")


def test_the_build_compiles_from_source_never_taking_pips_cached_wheel(sandbox, tmp_path):
    # pip keys a built wheel by its source alone: one compiled on another CPU would come back.
    steps = llama_build(sandbox, tmp_path, ZEN_5)
    build = next(line for line in steps.splitlines() if "pip wheel" in line)
    assert "--no-cache-dir" in build and "--no-binary llama-cpp-python" in build
    install = next(line for line in steps.splitlines() if "--find-links" in line)
    assert "--no-index" in install and "--force-reinstall" in install


def test_a_build_kept_for_this_cpu_is_installed_without_compiling_again(sandbox, tmp_path):
    kept = Path(wheel_dir(llama_build(sandbox, tmp_path, ZEN_5)))
    kept.mkdir(parents=True)
    (kept / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_bytes(b"")

    steps = llama_build(sandbox, tmp_path, ZEN_5)

    assert f"already done: built for this CPU: {kept}" in steps
    assert "pip wheel" not in steps
    assert "--find-links" in steps


def test_a_cpu_with_amx_is_built_so_that_its_tile_kernels_are_configured(sandbox, tmp_path):
    """GCC 12 drops the stores that fill llama.cpp's AMX tile configuration (dead-store
    elimination): every batch of tokens then stopped with "Illegal instruction" on this Xeon."""
    assert 'CMAKE_ARGS="-DCMAKE_CXX_FLAGS=-fno-dse"' in llama_build(
        sandbox, tmp_path, XEON_WITH_AMX
    )
    assert 'CMAKE_ARGS=""' in llama_build(sandbox, tmp_path, ZEN_5)


def test_cmake_args_asked_for_replace_the_chosen_ones_and_key_the_build(sandbox, tmp_path):
    chosen = llama_build(sandbox, tmp_path, XEON_WITH_AMX)
    asked = llama_build(sandbox, tmp_path, XEON_WITH_AMX, CMAKE_ARGS="-DGGML_NATIVE=OFF")
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF"' in asked and "-fno-dse" not in asked
    assert wheel_dir(asked) != wheel_dir(chosen)


def test_the_install_script_asks_for_the_python_it_installs_into(sandbox):
    done = run_script(INSTALL_LLAMA, "--dry-run", env=sandbox)
    assert done.returncode == 2
    assert "PYTHON is missing" in done.stderr


# A verification pass of 32 tokens against the same tokens one at a time: the argmax of each row.
BATCH_AGAINST_STEPS = """
import sys
from edgespec.backend import Context, Model
model = Model(sys.argv[1])
text = "def binary_search(items, target):\\n    lo, hi = 0, len(items)\\n    while lo < hi:\\n"
tokens = model.tokenize(text + "        mid = (lo + hi) // 2\\n", add_special=True)[:32]
# Each context named: a view of logits lives only as long as its context (and its next call).
batched = Context(model, n_ctx=256, n_threads=2, n_batch=64)
batch = batched.verify(tokens, 0).argmax(axis=1)
steps = Context(model, n_ctx=256, n_threads=2, n_batch=64)
one_at_a_time = [int(steps.decode([t], i).argmax()) for i, t in enumerate(tokens)]
print(sum(int(a) == b for a, b in zip(batch, one_at_a_time)), len(tokens))
"""


def test_the_llama_cpp_installed_here_decodes_a_batch_on_this_cpu(smol_path):
    """Verification passes are batches: with the AMX build's bug, the first one killed the
    process (SIGILL), so it is run in a child process that can die alone."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            BATCH_AGAINST_STEPS,
            str(smol_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    died = f"killed by {signal.Signals(-child.returncode).name}" if child.returncode < 0 else ""
    assert child.returncode == 0, (died or child.returncode, child.stderr[-2000:])
    same, rows = map(int, child.stdout.split())
    assert rows >= 16 and same >= rows - 1  # a near tie may part one row (batch numerics)


# setup scripts


@pytest.mark.parametrize("script", SETUP_SCRIPTS)
def test_a_dry_run_shows_every_step_and_changes_nothing(script, sandbox, tmp_path):
    before = files_under(tmp_path)

    done = run_script(script, "--dry-run", env=sandbox)

    assert done.returncode == 0, done.stderr
    steps = done.stdout
    venv = sandbox["EDGESPEC_VENV"]
    assert "would run: python3 -m venv" in steps
    assert "-DGGML_NATIVE=ON" in steps
    assert f"{venv}/bin/python -m pip install llama-cpp-python==" in steps
    assert f"{venv}/bin/python -m pip install -e {SCRIPTS.parent}" in steps
    assert f"{venv}/bin/edgespec models fetch qwen2.5-coder-1.5b" in steps
    assert f"{venv}/bin/edgespec models fetch qwen2.5-coder-0.5b" in steps
    # The default pair unnamed: the draft profiled is the one `edgespec run` uses (its fastest form)
    assert f"{venv}/bin/edgespec profile --quick --overlap\n" in steps
    assert files_under(tmp_path) == before


def test_dry_run_is_also_asked_for_by_the_environment(sandbox):
    done = run_script("rpi-setup.sh", env={**sandbox, "DRY_RUN": "1"})
    assert done.returncode == 0, done.stderr
    assert "would run:" in done.stdout


@pytest.mark.parametrize("value", ["true", "yes", "ON"])
def test_dry_run_in_words_is_a_dry_run_too(sandbox, tmp_path, value):
    before = files_under(tmp_path)
    done = run_script("rpi-setup.sh", env={**sandbox, "DRY_RUN": value})
    assert done.returncode == 0, done.stderr
    assert "would run:" in done.stdout and files_under(tmp_path) == before


def test_a_dry_run_value_that_means_nothing_is_refused(sandbox):
    done = run_script("rpi-setup.sh", env={**sandbox, "DRY_RUN": "maybe"})
    assert done.returncode == 1
    assert done.stderr == "error: DRY_RUN must be 1 or 0 (got maybe)\n" and done.stdout == ""


@pytest.mark.parametrize("script", SETUP_SCRIPTS)
@pytest.mark.parametrize("flag", ["--target", "--draft"])
def test_a_model_not_in_the_catalogue_is_refused_before_any_step(script, flag, sandbox, tmp_path):
    before = files_under(tmp_path)
    done = run_script(script, flag, "qwen-7b", env=sandbox)  # not a dry run: nothing may start
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"error: {flag} qwen-7b: no such model in the catalogue (it has")
    assert "qwen2.5-coder-0.5b" in done.stderr and files_under(tmp_path) == before


@pytest.mark.parametrize("script", SETUP_SCRIPTS)
@pytest.mark.parametrize(
    "args, refused",
    [
        (
            ["--draft", "smollm2-135m"],
            "smollm2-135m cannot draft for qwen2.5-coder-1.5b (the "
            "default target): their vocabularies differ (smollm2, qwen2.5)",
        ),
        (
            ["--target", "gemma3-270m", "--draft", "qwen2.5-coder-0.5b"],
            "qwen2.5-coder-0.5b "
            "cannot draft for gemma3-270m: their vocabularies differ (qwen2.5, gemma3)",
        ),
    ],
)
def test_a_draft_of_another_vocabulary_is_refused_before_any_step(
    script, args, refused, sandbox, tmp_path
):
    """Found out at the first run, the mismatch would come after half an hour of building."""
    before = files_under(tmp_path)
    done = run_script(script, *args, env=sandbox)  # not a dry run: nothing may start
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"error: --draft {refused}\n" and files_under(tmp_path) == before


@pytest.mark.parametrize("script", SETUP_SCRIPTS)
@pytest.mark.parametrize(
    "args", [["--draft", "qwen2.5-coder-0.5b"], ["--target", "smollm2-135m", "--draft", "none"]]
)
def test_a_draft_of_the_targets_vocabulary_passes_the_check(script, args, sandbox):
    done = run_script(script, "--dry-run", *args, env=sandbox)
    assert "vocabularies differ" not in done.stderr and "would run:" in done.stdout


def test_the_termux_build_turns_openmp_off(sandbox):
    done = run_script("termux-setup.sh", "--dry-run", env=sandbox)
    assert "-DGGML_OPENMP=OFF" in done.stdout
    assert "--system-site-packages" in done.stdout  # for Termux's prebuilt numpy


def test_the_termux_script_refuses_to_really_run_outside_termux(sandbox):
    done = run_script("termux-setup.sh", env={**sandbox, "PREFIX": "/usr"})
    assert done.returncode != 0
    assert "this script is for Termux" in done.stderr
    assert "would run" not in done.stdout


@pytest.mark.parametrize("script", SETUP_SCRIPTS)
@pytest.mark.parametrize("machine", ["armv7l", "armv6l", "armv8l"])
def test_a_32_bit_machine_is_refused_with_the_reason(script, machine, sandbox):
    # --dry-run as well: were the check broken, nothing would be installed on this machine
    done = run_script(script, "--dry-run", env={**sandbox, "EDGESPEC_UNAME_M": machine})
    assert done.returncode == 1
    assert f"32-bit system ({machine})" in done.stderr
    assert "64-bit" in done.stderr
    assert "would run" not in done.stdout


def test_the_pi_script_refuses_32_bit_raspberry_pi_os_on_a_64_bit_kernel(sandbox):
    board = {**sandbox, "EDGESPEC_UNAME_M": "aarch64", "EDGESPEC_LONG_BIT": "32"}
    done = run_script("rpi-setup.sh", "--dry-run", env=board)
    assert done.returncode == 1
    assert "the kernel is 64-bit (aarch64) but the system is 32-bit" in done.stderr


@pytest.mark.parametrize("script", SETUP_SCRIPTS)
def test_with_little_memory_only_the_small_model_is_fetched(script, sandbox):
    done = run_script(script, "--dry-run", env={**sandbox, "EDGESPEC_MEM_MIB": "1900"})
    assert done.returncode == 0, done.stderr
    assert "models fetch qwen2.5-coder-0.5b" in done.stdout
    assert "models fetch qwen2.5-coder-1.5b" not in done.stdout
    assert "profile --quick -m qwen2.5-coder-0.5b\n" in done.stdout


def test_with_little_memory_a_named_draft_that_is_the_small_model_is_left_out(sandbox):
    small = {**sandbox, "EDGESPEC_MEM_MIB": "1900"}
    done = run_script("rpi-setup.sh", "--dry-run", "--draft", "qwen2.5-coder-0.5b", env=small)
    assert done.returncode == 0, done.stderr
    assert "plain decoding, no speculation" in done.stdout
    assert "models: qwen2.5-coder-0.5b\n" in done.stdout
    assert "profile --quick -m qwen2.5-coder-0.5b\n" in done.stdout


@pytest.mark.parametrize("script", SETUP_SCRIPTS)
def test_with_little_memory_no_draft_asked_for_is_said_as_such(script, sandbox):
    """It said "the 0.5B is the target, none its draft"."""
    small = {**sandbox, "EDGESPEC_MEM_MIB": "1900"}
    done = run_script(script, "--dry-run", "--draft", "none", env=small)
    assert done.returncode == 0, done.stderr
    assert "fetching the 0.5B alone" in done.stdout and "none its draft" not in done.stdout


def test_a_target_chosen_alone_has_no_draft_as_in_edgespec_run(sandbox):
    done = run_script("rpi-setup.sh", "--dry-run", "--target", "smollm2-135m", env=sandbox)
    assert done.returncode == 0, done.stderr
    assert "models fetch smollm2-135m" in done.stdout
    assert "models fetch qwen" not in done.stdout
    assert "profile --quick -m smollm2-135m\n" in done.stdout


def test_a_draft_can_be_chosen_too(sandbox):
    pair = ("--target", "qwen2.5-coder-0.5b", "--draft", "qwen2.5-coder-0.5b")  # a self-draft
    done = run_script("termux-setup.sh", "--dry-run", *pair, env=sandbox)
    assert done.returncode == 0, done.stderr
    measured = "profile --quick --overlap -m qwen2.5-coder-0.5b --draft qwen2.5-coder-0.5b\n"
    assert measured in done.stdout
    assert "run -m qwen2.5-coder-0.5b --draft qwen2.5-coder-0.5b -n 64" in done.stdout


def test_the_default_pair_named_is_measured_and_run_as_run_uses_it(sandbox):
    pair = ("--target", "qwen2.5-coder-1.5b", "--draft", "qwen2.5-coder-0.5b")
    done = run_script("termux-setup.sh", "--dry-run", *pair, env=sandbox)
    assert done.returncode == 0, done.stderr
    assert "profile --quick --overlap\n" in done.stdout
    assert "run -n 64" in done.stdout


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests do not run in a venv")
def test_steps_already_done_are_skipped(sandbox, tmp_path):
    # This test's own virtual environment has llama-cpp-python and edgespec from this checkout.
    sandbox["EDGESPEC_VENV"] = sys.prefix
    done = run_script("rpi-setup.sh", "--dry-run", env=sandbox)
    assert done.returncode == 0, done.stderr
    assert "already done: llama-cpp-python" in done.stdout
    assert "already done: edgespec is installed from this checkout" in done.stdout
    assert "pip install" not in done.stdout
    # EDGESPEC_HOME is empty: the models are still to fetch
    assert "models fetch qwen2.5-coder-1.5b" in done.stdout


def test_run_from_the_checkout_an_empty_venv_still_gets_edgespec(sandbox, tmp_path):
    # As the README says to run it: from the checkout's root, where `import edgespec` in any
    # Python finds ./edgespec whether or not the venv has it.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = run_script("rpi-setup.sh", "--dry-run", env=sandbox, cwd=SCRIPTS.parent)
    assert done.returncode == 0, done.stderr
    assert "already done: edgespec" not in done.stdout
    assert f"pip install -e {SCRIPTS.parent}" in done.stdout


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests do not run in a venv")
def test_a_checkout_reached_through_a_link_is_still_the_one_installed(sandbox, tmp_path):
    """edgespec's files are found under the checkout's real path: through a link the install
    was made again at every run."""
    (tmp_path / "link").symlink_to(SCRIPTS.parent)
    sandbox["EDGESPEC_VENV"] = sys.prefix
    linked = tmp_path / "link" / "scripts" / "rpi-setup.sh"
    done = subprocess.run(
        [BASH, str(linked), "--dry-run"], env=sandbox, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "already done: edgespec is installed from this checkout" in done.stdout


def test_on_one_cpu_the_pipeline_is_not_measured(sandbox):
    """It gives the draft CPUs of its own: `profile --overlap` refuses one CPU, and the set-up
    ended with that error after everything was done."""
    done = run_script("rpi-setup.sh", "--dry-run", env={**sandbox, "EDGESPEC_NPROC": "1"})
    assert done.returncode == 0, done.stderr
    assert "profile --quick\n" in done.stdout and "--overlap" not in done.stdout


def test_a_model_that_is_its_own_draft_is_fetched_once(sandbox):
    pair = ("--target", "smollm2-135m", "--draft", "smollm2-135m")
    done = run_script("rpi-setup.sh", "--dry-run", *pair, env=sandbox)
    assert done.returncode == 0, done.stderr
    assert "models: smollm2-135m\n" in done.stdout
    assert done.stdout.count("models fetch smollm2-135m") == 1


@pytest.mark.parametrize("script", SETUP_SCRIPTS)
@pytest.mark.parametrize("args", [["--target"], ["--draft", "--dry-run"]])
def test_a_model_flag_without_a_name_is_a_usage_error(script, args, sandbox):
    done = run_script(script, *args, env=sandbox)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"error: {args[0]} needs a model name\n")
    assert "Usage:" in done.stderr


@pytest.mark.parametrize("script", SETUP_SCRIPTS)
def test_an_unknown_option_is_a_usage_error(script, sandbox):
    done = run_script(script, "--fast", env=sandbox)
    assert done.returncode == 2
    assert "unknown option --fast" in done.stderr and "Usage:" in done.stderr


# edgespec-ask.sh


@pytest.fixture
def fake(tmp_path) -> dict[str, str]:
    """An environment where `edgespec` is FAKE_EDGESPEC, first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "edgespec").write_text(FAKE_EDGESPEC)
    (bin_dir / "edgespec").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path)}


def test_ask_prints_the_answer_and_a_line_of_statistics(fake, tmp_path):
    done = run_script(ASK, "-n", "32", "What", "is", "a", "palindrome?", env=fake)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ANSWER + "\n"
    assert done.stderr == "2 tokens, 35.5 tok/s, mode chain, acceptance 90%\n"
    assert (tmp_path / "args").read_text() == "run --json -n 32 -\n"
    assert (tmp_path / "stdin").read_text() == "What is a palindrome?\n"


def test_ask_takes_a_dash_after_two_dashes_as_the_question(fake, tmp_path):
    """Its usage says what follows -- is the question: "-" was taken as stdin all the same."""
    done = run_script(ASK, "--", "-", env=fake, stdin="not this\n")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "stdin").read_text() == "-\n"


def test_ask_reads_the_question_from_stdin(fake, tmp_path):
    done = run_script(ASK, env=fake, stdin="Why is the sky blue?\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ANSWER + "\n"
    # No -n: edgespec's own limit, which config.toml or EDGESPEC_MAX_TOKENS may set.
    assert (tmp_path / "args").read_text() == "run --json -\n"
    assert (tmp_path / "stdin").read_text() == "Why is the sky blue?\n"


@pytest.mark.parametrize("exit_code", [1, 2])
def test_ask_passes_on_edgespecs_error_line_and_exit_code(fake, exit_code):
    done = run_script(ASK, "hello", env={**fake, "FAKE_EXIT": str(exit_code)})
    assert done.returncode == exit_code
    assert done.stdout == ""
    assert done.stderr == "error: model file not found: nope.gguf\n"


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed")
def test_ask_reads_the_json_with_jq_when_there_is_no_python3(fake, tmp_path):
    # A PATH of the fake edgespec, jq and the file for the answer's mktemp and rm: the script
    # needs nothing else.
    for command in ("jq", "mktemp", "rm"):
        (tmp_path / "bin" / command).symlink_to(shutil.which(command))
    done = run_script(ASK, "hello", env={**fake, "PATH": str(tmp_path / "bin")})
    assert done.returncode == 0, done.stderr
    assert done.stdout == ANSWER + "\n"
    assert done.stderr == "2 tokens, 35.5 tok/s, mode chain, acceptance 90%\n"


def test_ask_without_edgespec_says_so(tmp_path):
    done = run_script(ASK, "hello", env={"PATH": str(tmp_path)})
    assert done.returncode == 127
    assert done.stderr.startswith("edgespec-ask: edgespec not found")


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["-n", "many", "hello"], "", "-n needs a whole number of tokens, got 'many'"),
        ([], "  \n", "the question is empty"),
        (["--loud", "hello"], "", "unknown option --loud"),
    ],
)
def test_ask_usage_errors_exit_2(fake, args, stdin, message):
    done = run_script(ASK, *args, env=fake, stdin=stdin)
    assert done.returncode == 2
    assert message in done.stderr


# Stands in for edgespec interrupted mid-answer: says it is generating, then on Ctrl+C prints
# the answer so far and exits 130, as `edgespec run --json` does.
INTERRUPTED_EDGESPEC = f"""#!{sys.executable}
import json, os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.default_int_handler)  # as edgespec takes it
pathlib.Path(os.environ["FAKE_DIR"], "pid").write_text(str(os.getpid()))
pathlib.Path(os.environ["FAKE_DIR"], "generating").touch()
try:
    time.sleep(60)
except KeyboardInterrupt:
    stats = {{**{STATS!r}, "mode": "auto", "finish_reason": "interrupted"}}
    print(json.dumps({{"text": "A palindrome", "tokens": [1], "stats": stats}}))
    print("interrupted", file=sys.stderr)
    sys.exit(130)
"""


@pytest.mark.parametrize("how", ["ctrl+c", "sigterm"])
def test_ask_interrupted_shows_the_answer_so_far_and_exits_130(fake, tmp_path, how):
    """Ctrl+C signals the script and edgespec together (the terminal's process group); a
    SIGTERM (`kill`, `timeout`) the script alone, which lost the answer and left edgespec
    running on."""
    (tmp_path / "bin" / "edgespec").write_text(INTERRUPTED_EDGESPEC)
    # Its own process group, as a terminal's Ctrl+C signals the script and edgespec together.
    script = subprocess.Popen(
        [BASH, str(SCRIPTS / ASK), "hello"],
        env=fake,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=hear_ctrl_c,
    )
    deadline = time.monotonic() + 30
    while not (tmp_path / "generating").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if how == "ctrl+c":
        os.killpg(script.pid, signal.SIGINT)
    else:
        script.send_signal(signal.SIGTERM)
    out, err = script.communicate(timeout=30)
    assert script.returncode == 130, err
    assert out == "A palindrome\n"
    assert err.startswith("interrupted\n")
    with pytest.raises(ProcessLookupError):  # edgespec ended too
        os.kill(int((tmp_path / "pid").read_text()), 0)
