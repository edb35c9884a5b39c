#!/usr/bin/env bash
# hang_guard.sh SECONDS STACKS COMMAND...: runs COMMAND like `timeout
# SECONDS` (SIGTERM to it and what it started, SIGKILL 10 s later, exit
# 124 when it had to be stopped), but first writes
# the stacks of the paratrain processes under it to the file STACKS (gdb,
# where installed): a hang in a CI run then says where it hung, not only
# that it did. check_report.sh's `show LOG` prints LOG.stacks.
set -uo pipefail
limit=${1:?usage: hang_guard.sh SECONDS STACKS COMMAND...}
log=${2:?usage: hang_guard.sh SECONDS STACKS COMMAND...}
shift 2

"$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' INT TERM

# Every process below PID, depth first (COMMAND itself is checked too).
descendants() {
  local p
  for p in $(pgrep -P "$1"); do
    echo "$p"
    descendants "$p"
  done
}

for ((waited = 0; waited < limit; ++waited)); do
  kill -0 "$child" 2>/dev/null || { wait "$child"; exit $?; }
  sleep 1
done

{
  echo "hang_guard: still running after $limit s: $*"
  for p in "$child" $(descendants "$child"); do
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == paratrain ]] || continue
    echo "---- stacks of pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-200)"
    if command -v gdb >/dev/null; then
      # The frames of paratrain, Gloo and c10d; the rest is waiting.
      timeout 60 gdb -p "$p" -batch -ex "thread apply all bt" 2>/dev/null |
        grep -E "^Thread|paratrain::|gloo::|c10d::|std::thread::join" | cut -c1-240 | head -n 150
    else
      echo "(gdb is not installed: no stacks)"
    fi
  done
} >"$log" 2>&1
# As `timeout` signals its whole process group: the command and everything
# under it, then SIGKILL to what is left after 10 s (a wedged launcher
# would otherwise hold the case, and its stacks would never be shown).
tree=("$child" $(descendants "$child"))
kill -TERM "${tree[@]}" 2>/dev/null
for ((waited = 0; waited < 10; ++waited)); do
  kill -0 "$child" 2>/dev/null || break
  sleep 1
done
kill -KILL "${tree[@]}" 2>/dev/null
wait "$child" 2>/dev/null
exit 124
