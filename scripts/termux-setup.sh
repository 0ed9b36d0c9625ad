#!/usr/bin/env bash
# Set up edgespec from this checkout in Termux on a 64-bit Android phone or tablet: Termux
# packages, a virtual environment, llama-cpp-python built for this CPU, edgespec, a model pair and
# a quick profile of the device. Safe to run again: every step that is already done is skipped.
# Get the checkout with: pkg install git && git clone <edgespec's repository> && cd edgespec
#
# Usage: scripts/termux-setup.sh [--dry-run] [--target NAME] [--draft NAME]
#   --dry-run        print each step instead of running it; changes nothing (also: DRY_RUN=1)
#   --target NAME    catalogue model to fetch as the target [default: qwen2.5-coder-1.5b, or
#                    qwen2.5-coder-0.5b alone when the device has less than 3 GiB of memory]
#   --draft NAME     catalogue model to fetch as the draft [default: qwen2.5-coder-0.5b if
#                    there is no --target, as for `edgespec run`]
# Environment:
#   EDGESPEC_VENV    where the virtual environment goes [default: <checkout>/.venv, as for `make`]
#   CMAKE_ARGS       llama.cpp build options, replacing the ones chosen below
#   EDGESPEC_UNAME_M, EDGESPEC_LONG_BIT, EDGESPEC_MEM_MIB
#                    pretend `uname -m`, `getconf LONG_BIT` or the memory size said this (tests)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EDGESPEC_VENV:-$REPO/.venv}"
DRY_RUN="${DRY_RUN:-0}"
# Termux is not glibc-based, so pip can use no manylinux wheel and compiles every binary package.
# python-numpy: Termux's prebuilt numpy, which the virtual environment sees (--system-site-packages)
#   so that pip does not compile numpy, slowly and often unsuccessfully.
# cmake, ninja: Termux's own, found on PATH, so that the build does not compile pip's cmake.
SYSTEM_PACKAGES=(python python-numpy clang cmake ninja make git)
# GGML_NATIVE: compile for this very CPU (-mcpu=native: dot-product instructions, and i8mm on
#   recent phones). It is llama.cpp's default, but one that turns itself off when
#   SOURCE_DATE_EPOCH is set, so it is said out loud.
# GGML_OPENMP=OFF: a build with OpenMP links libomp.so, which Android's loader often cannot find
#   at run time ("library libomp.so not found", llama.cpp issue 11979); without it ggml uses its
#   own thread pool.
# LLAVA_BUILD=OFF: skip the multimodal library, which edgespec does not use: a shorter build.
DEFAULT_CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF"
# Below this much memory the 1.5B target and 0.5B draft (1.5 GiB of weights, plus context and
# the OS) do not fit comfortably; the 0.5B alone still does.
SMALL_MEMORY_MIB=3072

say() { printf '==> %s\n' "$*"; }
done_already() { printf '    already done: %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() {
	printf 'error: %s\n' "$*" >&2
	exit 1
}
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }

# Runs a command, or with --dry-run only shows it, quoted so that it can be pasted into a shell.
run() {
	if [[ $DRY_RUN == 1 ]]; then
		printf '    would run:'
		printf ' %q' "$@"
		printf '\n'
	else
		"$@"
	fi
}

check_termux() {
	if [[ ${PREFIX:-} == */com.termux/* ]]; then
		return
	fi
	if [[ $DRY_RUN == 1 ]]; then
		warn "this is not Termux; showing the steps anyway"
	else
		die "this script is for Termux on Android (\$PREFIX is not Termux's). On Debian or" \
			"Raspberry Pi OS use scripts/rpi-setup.sh; elsewhere \`make install\`."
	fi
}

check_64_bit() {
	local machine long_bit
	machine="${EDGESPEC_UNAME_M:-$(uname -m)}"
	long_bit="${EDGESPEC_LONG_BIT:-$(getconf LONG_BIT 2>/dev/null || echo 64)}"
	case "$machine" in
	armv6l | armv7l | armv8l | armhf | i?86) long_bit=32 ;;
	esac
	if [[ $long_bit != 64 ]]; then
		# armv8l: a 64-bit CPU running 32-bit Android, or a 32-bit Termux install.
		die "this is a 32-bit system ($machine). edgespec needs 64-bit Android with 64-bit Termux:" \
			"llama.cpp's fast ARM code paths are 64-bit only, and a 32-bit process can use at most" \
			"about 3 GiB of memory, too little for a target and a draft model."
	fi
}

install_system_packages() {
	local missing=() package
	for package in "${SYSTEM_PACKAGES[@]}"; do
		dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
	done
	if ((${#missing[@]} == 0)); then
		done_already "${SYSTEM_PACKAGES[*]} are installed"
		return
	fi
	# pkg refreshes its package lists first when they are old; no root needed in Termux
	run pkg install -y "${missing[@]}"
}

check_python() {
	if ! command -v python3 >/dev/null; then
		[[ $DRY_RUN == 1 ]] && return # pkg would have installed it
		die "python3 is missing although its package was installed; check pkg's output above"
	fi
	python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
		die "edgespec needs Python 3.10 or newer; this is $(python3 --version 2>&1)." \
			"Update Termux's packages (pkg upgrade) and run this script again."
}

memory_mib() {
	if [[ -n ${EDGESPEC_MEM_MIB:-} ]]; then
		echo "$EDGESPEC_MEM_MIB"
		return
	fi
	local key value _
	while read -r key value _; do
		[[ $key == MemTotal: ]] && echo $((value / 1024)) && return
	done </proc/meminfo
	echo 0
}

main() {
	local target="" draft=""
	while (($#)); do
		case "$1" in
		--dry-run) DRY_RUN=1 ;;
		--target) target="${2:?--target needs a model name}" && shift ;;
		--draft) draft="${2:?--draft needs a model name}" && shift ;;
		-h | --help) usage && exit 0 ;;
		*)
			printf 'error: unknown option %s\n\n' "$1" >&2
			usage >&2
			exit 2
			;;
		esac
		shift
	done
	[[ -f $REPO/pyproject.toml ]] || die "no pyproject.toml in $REPO: run this script from an edgespec checkout"
	[[ $DRY_RUN == 1 ]] && say "dry run: showing the steps, changing nothing"

	say "checking for Termux on a 64-bit system"
	check_termux
	check_64_bit

	say "system packages: ${SYSTEM_PACKAGES[*]}"
	install_system_packages
	check_python

	local python="$VENV/bin/python" edgespec="$VENV/bin/edgespec"
	say "virtual environment: $VENV"
	if [[ -x $python ]]; then
		done_already "$VENV exists"
	else
		run python3 -m venv --system-site-packages "$VENV"
		run "$python" -m pip install --quiet --upgrade pip
	fi

	# The version edgespec pins in pyproject.toml: its low-level API calls are written against it.
	local llama_version installed=""
	llama_version="$(grep -o 'llama-cpp-python==[0-9][0-9.]*' "$REPO/pyproject.toml" | cut -d= -f3 || true)"
	[[ -n $llama_version ]] || die "cannot find the llama-cpp-python version in $REPO/pyproject.toml"
	local cmake_args="${CMAKE_ARGS:-$DEFAULT_CMAKE_ARGS}"
	say "llama-cpp-python $llama_version, built with CMAKE_ARGS=\"$cmake_args\""
	if [[ -x $python ]]; then
		installed="$("$python" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)"
	fi
	if [[ $installed == "$llama_version" ]]; then
		done_already "llama-cpp-python $installed is installed"
	else
		say "this compiles llama.cpp (tens of minutes on a phone; pip is quiet meanwhile)." \
			"Keep Termux in the foreground or hold a wake lock (termux-wake-lock): Android may pause it."
		run env CMAKE_ARGS="$cmake_args" "$python" -m pip install "llama-cpp-python==$llama_version"
	fi

	say "edgespec from $REPO"
	if [[ -x $python ]] && "$python" -c 'import edgespec, sys; sys.exit(not edgespec.__file__.startswith(sys.argv[1]))' "$REPO/" 2>/dev/null; then
		done_already "edgespec is installed from this checkout"
	else
		run env CMAKE_ARGS="$cmake_args" "$python" -m pip install -e "$REPO"
	fi

	local memory
	memory="$(memory_mib)"
	if [[ -z $target ]]; then
		if ((memory > 0 && memory < SMALL_MEMORY_MIB)); then
			say "this device has $memory MiB of memory: too little for the 1.5B target with a draft;" \
				"fetching the 0.5B alone (plain decoding, no speculation)"
			target=qwen2.5-coder-0.5b
		else
			target=qwen2.5-coder-1.5b
			draft="${draft:-qwen2.5-coder-0.5b}"
		fi
	fi
	draft="${draft:-none}" # as in `edgespec run`: a chosen target has no draft unless one is named
	local models=("$target")
	[[ $draft != none ]] && models+=("$draft")

	say "models: ${models[*]}"
	local model
	for model in "${models[@]}"; do
		if [[ -x $edgespec ]] && "$edgespec" models path "$model" >/dev/null 2>&1; then
			done_already "$model is fetched"
		else
			run "$edgespec" models fetch "$model"
		fi
	done

	local pair=(-m "$target")
	[[ $draft != none ]] && pair+=(--draft "$draft")
	# With a draft, also whether LLMCad's pipeline pays here (remembered: where it does, run and
	# chat with the same CPUs use it).
	local measure=(--quick)
	[[ $draft != none ]] && measure+=(--overlap)
	say "a quick profile of this device (how much a verification pass costs here)"
	if [[ $DRY_RUN == 1 && ! -x $edgespec ]]; then
		run "$edgespec" profile "${measure[@]}" "${pair[@]}"
		printf '    (skipped if this edgespec has no profile command)\n'
	elif "$edgespec" profile --help >/dev/null 2>&1; then
		run "$edgespec" profile "${measure[@]}" "${pair[@]}"
	else
		printf '    skipped: this edgespec has no profile command yet\n'
	fi

	say "ready. Try:"
	printf '    %q run' "$edgespec"
	[[ $target != qwen2.5-coder-1.5b || $draft != qwen2.5-coder-0.5b ]] && printf ' %q' "${pair[@]}"
	printf ' -n 64 "Write a haiku about small computers."\n'
	printf '    (or: source %q, then just edgespec ...)\n' "$VENV/bin/activate"
	# A phone shares its memory with Android, which ends apps that take too much of it.
	printf '    On a phone keep the context small: edgespec run -c 1024 ..., or put\n'
	printf '    ctx_size = 1024 into the file that "edgespec config path" prints.\n'
}

main "$@"
