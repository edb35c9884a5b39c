# Sourced by the shell tests of tests/launch (netns_test.sh, slurm_test.sh):
# counting failed checks and showing the log of one. `case` names the check
# in progress; the caller exits non-zero when `failures` > 0.
failures=0

fail() {
  echo "FAIL [$case]: $*" >&2
  failures=$((failures + 1))
}

# Prints the log of a failed check: its errors first (a CI report keeps
# only part of a long output), then its last lines (default 25).
show() {
  echo "---- $1"
  grep -a "error" "$1" | grep -v "^\[[0-9]*\]: \[.*\] \[info\]" | head -n 5 | cut -c1-600 | sed 's/^/  error line: /'
  tail -n "${2:-25}" "$1"
  # Where a hung command hung (hang_guard.sh).
  [[ -s $1.stacks ]] && { echo "---- $1.stacks"; cat "$1.stacks"; }
  return 0
}
