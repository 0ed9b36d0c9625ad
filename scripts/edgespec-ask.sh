#!/usr/bin/env bash
# Ask edgespec one question from a shell script: the answer goes to stdout, one line of
# statistics to stderr. An example of scripting edgespec through `edgespec run --json`.
#
# Usage: edgespec-ask.sh [-n TOKENS] [--] QUESTION...
#        some-command | edgespec-ask.sh [-n TOKENS]
#   -n TOKENS   tokens to generate at most [default: edgespec run's: max_tokens in config.toml
#               or EDGESPEC_MAX_TOKENS, else 256]
#   --          what follows is the question, even if it starts with "-"
# Environment: EDGESPEC, the edgespec command [default: edgespec on PATH]
# When edgespec fails, its one-line `error: ...` shows on stderr and its exit code is returned;
# Ctrl+C or SIGTERM (`kill`, `timeout`) stops the answer, shows what came of it so far and
# exits 130.
set -euo pipefail

# Besides shell builtins, mktemp and rm this needs edgespec and one JSON reader: python3, or jq.
READ_JSON_PY='
import json, sys
result = json.load(sys.stdin)
stats = result["stats"]
line = "%d tokens, %g tok/s, mode %s" % (stats["n_generated"], stats["tokens_per_s"], stats["mode"])
if stats["draft_tokens"]:
    line += ", acceptance %d%%" % round(100 * stats["acceptance_rate"])
print(result["text"])
print(line, file=sys.stderr)
'
STATS_JQ='.stats | "\(.n_generated) tokens, \(.tokens_per_s) tok/s, mode \(.mode)"
  + if .draft_tokens > 0 then ", acceptance \(.acceptance_rate * 100 | round)%" else "" end'

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
fail() {
	printf 'edgespec-ask: %s\n' "$1" >&2
	exit "${2:-1}"
}

limit=() # none: edgespec's own, which config.toml or EDGESPEC_MAX_TOKENS may set
literal=0 # after --: "-" is the question, not stdin
while (($#)); do
	case "$1" in
	-n)
		[[ ${2:-} =~ ^[1-9][0-9]*$ ]] || fail "-n needs a whole number of tokens, got '${2:-}'" 2
		limit=(-n "$2")
		shift 2
		;;
	-h | --help) usage && exit 0 ;;
	--) shift && literal=1 && break ;;
	-?*) fail "unknown option $1 (see --help)" 2 ;;
	*) break ;;
	esac
done

if (($#)) && { ((literal)) || [[ $* != - ]]; }; then
	question="$*"
elif [[ -t 0 ]]; then
	fail "no question: give it as arguments or on stdin (see --help)" 2
else
	question="$(</dev/stdin)"
fi
[[ -n ${question//[[:space:]]/} ]] || fail "the question is empty" 2

edgespec="${EDGESPEC:-edgespec}"
command -v "$edgespec" >/dev/null ||
	fail "$edgespec not found: activate edgespec's virtual environment or set EDGESPEC" 127
# Checked before generating, not after: nobody should wait for an answer that cannot be shown.
if command -v python3 >/dev/null; then
	reader=python3
elif command -v jq >/dev/null; then
	reader=jq
else
	fail "reading edgespec's JSON output needs python3 or jq; neither is on PATH"
fi

# The question travels on stdin ("-"), so that no length or quoting limit of arguments applies.
# edgespec's stderr is not captured: its error line, if any, reaches the caller unchanged.
# edgespec runs in the background so that a SIGTERM sent to this shell alone (`kill`) reaches it
# too, as Ctrl+C does: it stops and still prints the answer so far (exit 130), which this shell
# waits for and shows rather than dying at once and losing it (or leaving edgespec running).
# A background command does not hear Ctrl+C itself, so the trap passes both on as SIGTERM,
# which edgespec takes as Ctrl+C.
answer="$(mktemp)"
trap 'rm -f "$answer"' EXIT
printf '%s\n' "$question" | "$edgespec" run --json ${limit[@]+"${limit[@]}"} - >"$answer" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null || true' INT TERM
while kill -0 "$pid" 2>/dev/null; do
	wait "$pid" || true # returns early when a signal is trapped; edgespec may still be at work
done
status=0
wait "$pid" || status=$? # its exit status, kept by the shell
result="$(<"$answer")"
((status == 0)) || [[ $status == 130 && -n $result ]] || exit "$status"

if [[ $reader == python3 ]]; then
	python3 -c "$READ_JSON_PY" <<<"$result" || fail "cannot read edgespec's JSON output"
else
	{ jq -r .text <<<"$result" && jq -r "$STATS_JQ" <<<"$result" >&2; } ||
		fail "cannot read edgespec's JSON output"
fi
exit "$status"
