#!/usr/bin/env bash
# Installs llama-cpp-python, at the version pyproject.toml pins, compiled for this very CPU, into
# the virtual environment of PYTHON (the Makefile's install step):
#
#   scripts/install-llama-cpp.sh [--dry-run] PYTHON
#
# The compiled wheel is kept in $EDGESPEC_HOME/wheels (default ~/.cache/edgespec/wheels) under a
# key of the version, the build options and this CPU (its model and instruction sets), and built
# when no wheel of that key is there (about 6 minutes on 2 cores). pip's own cache keys a built
# wheel by its source alone: it hands back one compiled for another CPU (a wheel built for AVX-512
# stops with "Illegal instruction" on a CPU without it) or with other build options, unasked.
#
# Environment:
#   CMAKE_ARGS        llama.cpp build options, replacing the ones chosen below
#   EDGESPEC_CPUINFO  read instead of /proc/cpuinfo (tests)
#   DRY_RUN=1         as --dry-run: show each step, change nothing
set -euo pipefail

REPO="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
DRY_RUN="${DRY_RUN:-0}"
# shellcheck source=setup-common.sh
source "$REPO/scripts/setup-common.sh"

python=""
for arg in "$@"; do
	case "$arg" in
	--dry-run) DRY_RUN=1 ;;
	-h | --help)
		usage
		exit 0
		;;
	-*) usage_error "unknown option: $arg" ;;
	*)
		[[ -z $python ]] || usage_error "one PYTHON only, not also $arg"
		python="$arg"
		;;
	esac
done
[[ -n $python ]] || usage_error "which Python's environment? (PYTHON is missing)"

version="$(pinned_llama_version)"

cpuinfo="${EDGESPEC_CPUINFO:-/proc/cpuinfo}"
# What a native build depends on: the CPU's name and what it can execute (x86 "flags", Arm
# "Features" and "CPU part"), one line each, as the first CPU lists them.
cpu_signature() {
	[[ -r $cpuinfo ]] || return 0
	awk -F': *' '/^(model name|flags|Features|CPU part|CPU implementer)[[:space:]]*:/ && !seen[$1]++' "$cpuinfo"
}
signature="$(cpu_signature)"

# GCC 12 at -O2 and above drops the stores that fill in llama.cpp's AMX tile configuration (its
# dead-store elimination does not see that ldtilecfg reads them), so on a CPU with AMX (Intel Xeon
# since Sapphire Rapids) the first batch of a few tokens stops with "Illegal instruction". Without
# that pass the tiles are configured, and a pass verifying 8 tokens costs about 2.2 plain steps
# here where the build without AMX takes about 3.2.
default_cmake_args=""
if grep -qw amx_int8 <<<"$signature"; then
	default_cmake_args="-DCMAKE_CXX_FLAGS=-fno-dse"
fi
cmake_args="${CMAKE_ARGS-$default_cmake_args}"

key="$(printf '%s\n' "$version" "$cmake_args" "$(uname -m)" "$signature" | sha256sum | cut -c1-16)"
wheels="${EDGESPEC_HOME:-$HOME/.cache/edgespec}/wheels/llama-cpp-python-$version-$key"

say "llama-cpp-python $version for this CPU, built with CMAKE_ARGS=\"$cmake_args\""
if compgen -G "$wheels/*.whl" >/dev/null; then
	done_already "built for this CPU: $wheels"
else
	say "compiling llama.cpp (about 6 minutes on 2 cores), once for this CPU, into $wheels"
	run rm -rf "$wheels" "$wheels.partial"
	run env CMAKE_ARGS="$cmake_args" "$python" -m pip wheel --quiet --no-deps --no-cache-dir \
		--no-binary llama-cpp-python -w "$wheels.partial" "llama-cpp-python==$version"
	run mv "$wheels.partial" "$wheels" # only a finished build is ever found
fi
# Whatever llama-cpp-python the environment has: this one replaces it (its dependencies come with
# edgespec's install).
run "$python" -m pip install --quiet --no-deps --force-reinstall --no-index --find-links "$wheels" \
	"llama-cpp-python==$version"
