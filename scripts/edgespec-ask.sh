#!/usr/bin/env bash
# Ask edgespec one question from a shell script: the answer goes to stdout, one line of
# statistics to stderr. An example of scripting edgespec through `edgespec run --json`.
#
# Usage: edgespec-ask.sh [-n TOKENS] QUESTION...
#        some-command | edgespec-ask.sh [-n TOKENS]
#   -n TOKENS   tokens to generate at most [default: 256]
# Environment: EDGESPEC, the edgespec command [default: edgespec on PATH]
# When edgespec fails, its one-line `error: ...` shows on stderr and its exit code is returned;
# Ctrl+C stops the answer, shows what came of it so far and exits 130.
set -euo pipefail

# Besides shell builtins this needs edgespec and one JSON reader: python3, or else jq.
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

tokens=256
while (($#)); do
	case "$1" in
	-n)
		[[ ${2:-} =~ ^[1-9][0-9]*$ ]] || fail "-n needs a whole number of tokens, got '${2:-}'" 2
		tokens="$2"
		shift 2
		;;
	-h | --help) usage && exit 0 ;;
	--) shift && break ;;
	-?*) fail "unknown option $1 (see --help)" 2 ;;
	*) break ;;
	esac
done

if (($#)) && [[ $* != - ]]; then
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
# Ctrl+C reaches edgespec too, which stops and still prints the answer so far (exit 130): this
# shell waits for it and shows that answer rather than dying at once and losing it.
trap : INT
status=0
result="$(printf '%s\n' "$question" | "$edgespec" run --json -n "$tokens" -)" || status=$?
((status == 0)) || [[ $status == 130 && -n $result ]] || exit "$status"

if [[ $reader == python3 ]]; then
	python3 -c "$READ_JSON_PY" <<<"$result" || fail "cannot read edgespec's JSON output"
else
	{ jq -r .text <<<"$result" && jq -r "$STATS_JQ" <<<"$result" >&2; } ||
		fail "cannot read edgespec's JSON output"
fi
exit "$status"
