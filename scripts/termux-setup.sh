#!/usr/bin/env bash
# Set up edgespec from this checkout in Termux on a 64-bit Android phone or tablet: Termux
# packages, a virtual environment, llama-cpp-python built for this CPU, edgespec, a model pair and
# a quick profile of the device. Safe to run again: every step that is already done is skipped
# (but the profile, measured again: the device may have changed).
# Get the checkout with: pkg install git && git clone <edgespec's repository> && cd edgespec
#
# Usage: scripts/termux-setup.sh [--dry-run] [--target NAME] [--draft NAME]
#   --dry-run        print each step instead of running it; changes nothing (also: DRY_RUN=1)
#   --target NAME    catalogue model to fetch as the target [default: qwen2.5-coder-1.5b, or
#                    qwen2.5-coder-0.5b alone when the device has less than 3 GiB of memory]
#   --draft NAME     catalogue model to fetch as the draft [default: qwen2.5-coder-0.5b if
#                    there is no --target, as for `edgespec run`]; one of the target's
#                    vocabulary (models/manifest.toml), or the script stops before any step
# Environment:
#   EDGESPEC_VENV    where the virtual environment goes [default: <checkout>/.venv, as for `make`]
#   CMAKE_ARGS       llama.cpp build options, replacing the ones chosen below
#   EDGESPEC_UNAME_M, EDGESPEC_LONG_BIT, EDGESPEC_MEM_MIB, EDGESPEC_NPROC
#                    pretend `uname -m`, `getconf LONG_BIT`, the memory size or `nproc` said
#                    this (tests)
set -euo pipefail

# The physical path (-P): edgespec installed from it is found under it through a symlink too.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
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

SCRIPTS="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=setup-common.sh
source "$SCRIPTS/setup-common.sh"

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
	local missing
	mapfile -t missing < <(missing_packages)
	if ((${#missing[@]} == 0)); then
		done_already "${SYSTEM_PACKAGES[*]} are installed"
		return
	fi
	# pkg refreshes its package lists first when they are old; no root needed in Termux
	run pkg install -y "${missing[@]}"
}

main() {
	parse_options "$@"

	say "checking for Termux on a 64-bit system"
	check_termux
	check_64_bit

	say "system packages: ${SYSTEM_PACKAGES[*]}"
	install_system_packages
	check_python "Update Termux's packages (pkg upgrade) and run this script again."

	# --system-site-packages: Termux's prebuilt numpy (see SYSTEM_PACKAGES)
	install_edgespec "this compiles llama.cpp (tens of minutes on a phone; pip is quiet meanwhile). Keep Termux in the foreground or hold a wake lock (termux-wake-lock): Android may pause it." \
		--system-site-packages
	fetch_and_profile device
	# A phone shares its memory with Android, which ends apps that take too much of it.
	printf '    On a phone keep the context small: edgespec run -c 1024 ..., or put\n'
	printf '    ctx_size = 1024 into the file that "edgespec config path" prints.\n'
}

main "$@"
