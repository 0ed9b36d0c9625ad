# shellcheck shell=bash
# The steps scripts/termux-setup.sh and scripts/rpi-setup.sh share, sourced by both. Each of them
# sets REPO, VENV, DRY_RUN, SYSTEM_PACKAGES, DEFAULT_CMAKE_ARGS and SMALL_MEMORY_MIB and brings
# its own checks of the device and its own way of installing system packages.

say() { printf '==> %s\n' "$*"; }
done_already() { printf '    already done: %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() {
	printf 'error: %s\n' "$*" >&2
	exit 1
}
# The running script's header comment, from its second line to `set -euo`.
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

usage_error() {
	printf 'error: %s\n\n' "$1" >&2
	usage >&2
	exit 2
}

# CPUs this process may run on (EDGESPEC_NPROC pretends, for tests).
cpu_count() { echo "${EDGESPEC_NPROC:-$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN)}"; }

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

# check_model FLAG NAME: NAME is in the catalogue (models/manifest.toml), or FLAG fails now, not
# at the fetch after half an hour of building.
check_model() {
	local flag="$1" name="$2" known
	[[ $flag == --draft && $name == none ]] && return 0
	grep -qxF "[\"$name\"]" "$REPO/models/manifest.toml" && return 0
	known="$(sed -n 's/^\["\(.*\)"\]$/\1/p' "$REPO/models/manifest.toml" | paste -sd, - | sed 's/,/, /g')"
	die "$flag $name: no such model in the catalogue (it has $known)"
}

# vocabulary_of NAME: the vocabulary of the catalogue's model NAME (one check_model passed).
vocabulary_of() {
	sed -n "/^\[\"$1\"\]\$/,/^\[/s/^vocabulary = \"\(.*\)\"\$/\1/p" "$REPO/models/manifest.toml"
}

# check_pair: a --draft can draft for the target (the one named, else the default pair's, whose
# vocabulary the 0.5B taken on a small device shares) only with its vocabulary; else it fails
# now, not at the first run after half an hour of building.
check_pair() {
	local target="${TARGET:-qwen2.5-coder-1.5b}" draft_vocabulary target_vocabulary
	[[ -z $DRAFT || $DRAFT == none ]] && return 0
	draft_vocabulary="$(vocabulary_of "$DRAFT")"
	target_vocabulary="$(vocabulary_of "$target")"
	[[ $draft_vocabulary == "$target_vocabulary" ]] && return 0
	[[ -n $TARGET ]] || target="$target (the default target)"
	die "--draft $DRAFT cannot draft for $target: their vocabularies differ" \
		"($draft_vocabulary, $target_vocabulary)"
}

# Sets TARGET and DRAFT (empty unless given) and DRY_RUN from the command line.
parse_options() {
	TARGET="" DRAFT=""
	case "${DRY_RUN,,}" in # DRY_RUN=true is a dry run too, not a real one
	1 | true | yes | on) DRY_RUN=1 ;;
	0 | false | no | off | "") DRY_RUN=0 ;;
	*) die "DRY_RUN must be 1 or 0 (got $DRY_RUN)" ;;
	esac
	while (($#)); do
		case "$1" in
		--dry-run) DRY_RUN=1 ;;
		--target | --draft)
			[[ -n ${2:-} && ${2} != -* ]] || usage_error "$1 needs a model name"
			if [[ $1 == --target ]]; then TARGET="$2"; else DRAFT="$2"; fi
			shift
			;;
		-h | --help) usage && exit 0 ;;
		*) usage_error "unknown option $1" ;;
		esac
		shift
	done
	[[ -f $REPO/pyproject.toml ]] || die "no pyproject.toml in $REPO: run this script from an edgespec checkout"
	[[ -n $TARGET ]] && check_model --target "$TARGET"
	[[ -n $DRAFT ]] && check_model --draft "$DRAFT"
	check_pair
	[[ $DRY_RUN == 1 ]] && say "dry run: showing the steps, changing nothing"
	return 0
}

# The SYSTEM_PACKAGES that dpkg does not have as installed, one a line.
missing_packages() {
	local package
	for package in "${SYSTEM_PACKAGES[@]}"; do
		dpkg -s "$package" >/dev/null 2>&1 || printf '%s\n' "$package"
	done
}

# check_python HINT: python3 is there and new enough; HINT says how to get a newer one.
check_python() {
	if ! command -v python3 >/dev/null; then
		[[ $DRY_RUN == 1 ]] && return # the package manager would have installed it
		die "python3 is missing although its package was installed; check the output above"
	fi
	python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
		die "edgespec needs Python 3.10 or newer; this is $(python3 --version 2>&1). $1"
}

# The llama-cpp-python version edgespec pins in pyproject.toml: its low-level API calls are
# written against it.
pinned_llama_version() {
	local version
	version="$(grep -o 'llama-cpp-python==[0-9][0-9.]*' "$REPO/pyproject.toml" | cut -d= -f3 || true)"
	[[ -n $version ]] || die "cannot find the llama-cpp-python version in $REPO/pyproject.toml"
	echo "$version"
}

# install_edgespec BUILD_NOTICE [VENV_OPTION...]: the virtual environment, llama-cpp-python built
# for this CPU (BUILD_NOTICE says how long that takes here) and edgespec from this checkout.
install_edgespec() {
	local build_notice="$1" python="$VENV/bin/python"
	shift
	say "virtual environment: $VENV"
	if [[ -x $python ]]; then
		done_already "$VENV exists"
	else
		run python3 -m venv "$@" "$VENV"
		run "$python" -m pip install --quiet --upgrade pip
	fi

	local llama_version installed=""
	llama_version="$(pinned_llama_version)"
	local cmake_args="${CMAKE_ARGS:-$DEFAULT_CMAKE_ARGS}"
	say "llama-cpp-python $llama_version, built with CMAKE_ARGS=\"$cmake_args\""
	if [[ -x $python ]]; then
		installed="$("$python" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)"
	fi
	if [[ $installed == "$llama_version" ]]; then
		done_already "llama-cpp-python $installed is installed"
	else
		say "$build_notice"
		run env CMAKE_ARGS="$cmake_args" "$python" -m pip install "llama-cpp-python==$llama_version"
	fi

	say "edgespec from $REPO"
	# Asked from / : run from the checkout, Python would import its ./edgespec whatever the venv has.
	if [[ -x $python ]] && (cd / && "$python" -c 'import edgespec, sys; sys.exit(not edgespec.__file__.startswith(sys.argv[1]))' "$REPO/" 2>/dev/null); then
		done_already "edgespec is installed from this checkout"
	else
		run env CMAKE_ARGS="$cmake_args" "$python" -m pip install -e "$REPO"
	fi
}

# fetch_and_profile DEVICE: the model pair (the 0.5B alone where memory is short; DEVICE names
# the machine in that message), then a quick profile of this device, then how to start.
fetch_and_profile() {
	local device="$1" edgespec="$VENV/bin/edgespec" memory target="$TARGET" draft="$DRAFT"
	memory="$(memory_mib)"
	if [[ -z $target ]]; then
		if ((memory > 0 && memory < SMALL_MEMORY_MIB)); then
			target=qwen2.5-coder-0.5b
			if [[ -z $draft || $draft == "$target" || $draft == none ]]; then # itself: it gains nothing
				say "this $device has $memory MiB of memory: too little for the 1.5B target with a draft;" \
					"fetching the 0.5B alone (plain decoding, no speculation)"
				draft=none
			else
				say "this $device has $memory MiB of memory: too little for the 1.5B target with a draft;" \
					"the 0.5B is the target, $draft its draft"
			fi
		else
			target=qwen2.5-coder-1.5b
			draft="${draft:-qwen2.5-coder-0.5b}"
		fi
	fi
	draft="${draft:-none}" # as in `edgespec run`: a chosen target has no draft unless one is named
	local models=("$target")
	[[ $draft != none && $draft != "$target" ]] && models+=("$draft")

	say "models: ${models[*]}"
	local model
	for model in "${models[@]}"; do
		if [[ -x $edgespec ]] && "$edgespec" models path "$model" >/dev/null 2>&1; then
			done_already "$model is fetched"
		else
			run "$edgespec" models fetch "$model"
		fi
	done

	local pair=(-m "$target") default_pair=0
	[[ $draft != none ]] && pair+=(--draft "$draft")
	[[ $target == qwen2.5-coder-1.5b && $draft == qwen2.5-coder-0.5b ]] && default_pair=1
	# With a draft, also whether LLMCad's pipeline pays here (remembered: where it does, run and
	# chat with the same CPUs use it). The default pair unnamed, as `run` is told to use it below:
	# then the draft profiled is the one run uses, the default one in its fastest form here (made
	# now, once), not the file fetched.
	# The pipeline gives the draft CPUs of its own: a device with one CPU has none to give.
	local measure=(--quick)
	[[ $draft != none ]] && (($(cpu_count) >= 2)) && measure+=(--overlap)
	((default_pair)) || measure+=("${pair[@]}")
	say "a quick profile of this device (how much a verification pass costs here)"
	if [[ $DRY_RUN == 1 && ! -x $edgespec ]]; then
		run "$edgespec" profile "${measure[@]}"
		printf '    (skipped if this edgespec has no profile command)\n'
	elif "$edgespec" profile --help >/dev/null 2>&1; then
		run "$edgespec" profile "${measure[@]}"
	else
		printf '    skipped: this edgespec has no profile command yet\n'
	fi

	say "ready. Try:"
	printf '    %q run' "$edgespec"
	((default_pair)) || printf ' %q' "${pair[@]}"
	printf ' -n 64 "Write a haiku about small computers."\n'
	printf '    (or: source %q, then just edgespec ...)\n' "$VENV/bin/activate"
}
