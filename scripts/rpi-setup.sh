#!/usr/bin/env bash
# Set up edgespec from this checkout on a Raspberry Pi with a 64-bit OS (Raspberry Pi OS or
# Debian, arm64): system packages, a virtual environment, llama-cpp-python built for this CPU,
# edgespec, a model pair and a quick profile of the device. Safe to run again: every step that is
# already done is skipped (but the profile, measured again: the device may have changed).
#
# Usage: scripts/rpi-setup.sh [--dry-run] [--target NAME] [--draft NAME]
#   --dry-run        print each step instead of running it; changes nothing (also: DRY_RUN=1)
#   --target NAME    catalogue model to fetch as the target [default: qwen2.5-coder-1.5b, or
#                    qwen2.5-coder-0.5b alone when the board has less than 3 GiB of memory]
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
SYSTEM_PACKAGES=(python3-venv python3-dev cmake build-essential git)
# GGML_NATIVE: compile for this very CPU (-mcpu=native: dot-product instructions on a Pi 5).
#   It is llama.cpp's default, but one that turns itself off when SOURCE_DATE_EPOCH is set, so it
#   is said out loud. The wheel pip builds and caches is then only for CPUs like this one.
# LLAVA_BUILD=OFF: skip the multimodal library, which edgespec does not use: a shorter build.
DEFAULT_CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF"
# Below this much memory the 1.5B target and 0.5B draft (1.5 GiB of weights, plus context and
# the OS) do not fit comfortably; the 0.5B alone still does.
SMALL_MEMORY_MIB=3072

SCRIPTS="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=setup-common.sh
source "$SCRIPTS/setup-common.sh"

check_64_bit() {
	local machine long_bit
	machine="${EDGESPEC_UNAME_M:-$(uname -m)}"
	long_bit="${EDGESPEC_LONG_BIT:-$(getconf LONG_BIT 2>/dev/null || echo 64)}"
	case "$machine" in
	aarch64 | arm64) ;;
	armv6l | armv7l | armv8l | armhf | i?86)
		die "this is a 32-bit system ($machine). edgespec needs a 64-bit OS: llama.cpp's fast ARM" \
			"code paths are 64-bit only, and a 32-bit process can use at most about 3 GiB of memory," \
			"too little for a target and a draft model. Install Raspberry Pi OS (64-bit) with" \
			"Raspberry Pi Imager (Pi 3, 4, 5 and Zero 2 W can run it) and run this script again."
		;;
	*) warn "this script is written for a Raspberry Pi (aarch64); continuing on $machine" ;;
	esac
	if [[ $long_bit != 64 ]]; then
		die "the kernel is 64-bit ($machine) but the system is 32-bit: this is 32-bit Raspberry" \
			"Pi OS on a 64-bit kernel, and programs built here would be 32-bit (slower ARM code," \
			"at most about 3 GiB of memory). Install Raspberry Pi OS (64-bit) and run this script again."
	fi
}

install_system_packages() {
	local missing
	mapfile -t missing < <(missing_packages)
	if ((${#missing[@]} == 0)); then
		done_already "${SYSTEM_PACKAGES[*]} are installed"
		return
	fi
	local sudo=()
	if ((EUID != 0)); then
		command -v sudo >/dev/null || [[ $DRY_RUN == 1 ]] ||
			die "installing ${missing[*]} needs root: run this script as root, or install sudo"
		sudo=(sudo)
	fi
	run "${sudo[@]}" apt-get update
	run "${sudo[@]}" apt-get install -y "${missing[@]}"
}

main() {
	parse_options "$@"

	say "checking for a 64-bit system"
	check_64_bit

	say "system packages: ${SYSTEM_PACKAGES[*]}"
	install_system_packages
	check_python "Raspberry Pi OS 12 (bookworm) or newer has it."

	install_edgespec "this compiles llama.cpp: minutes on a Pi 5, longer on a Pi 4; pip is quiet meanwhile"
	fetch_and_profile board
}

main "$@"
