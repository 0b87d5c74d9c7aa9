#!/usr/bin/env bash
# `make test`'s parts, timed: run_parts.sh LANE [LANE ...] [-- LANE [LANE ...]] ..., each LANE a
# space-separated list of make targets as target:label, `--` separating stages. A stage's lanes
# run side by side, a lane's parts one after the other; a lane stops at its first failing part
# while the other lanes go on (one run shows every failure), and a failed stage ends the run.
# With more than one lane, each line a part prints is prefixed with its label. At the end: each
# part's seconds, in the order given, and the total; the exit status is the first failure's.
#
# Why lanes: on the 2-core machine make test is written for, pytest alone leaves a core idle
# much of the time (one process, often waiting on servers and subprocesses), so parts that do
# not depend on each other share the time instead of adding up.
set -uo pipefail

make_cmd=${MAKE:-make}
times_dir=$(mktemp -d)
trap 'rm -rf "$times_dir"' EXIT
begin=$(date +%s)

run_lane() {  # run_lane INDEX "target:label target:label ..."
  local index=$1 part target label start status
  local -i n=0
  for part in $2; do
    target=${part%%:*} label=${part#*:} start=$(date +%s)
    if [ "$lanes" -gt 1 ]; then
      "$make_cmd" --no-print-directory "$target" 2>&1 | sed -u "s|^|[$label] |"
    else
      "$make_cmd" --no-print-directory "$target"
    fi
    status=$?
    printf '  %-11s %5d s%s\n' "$label" $(($(date +%s) - start)) "$([ $status -ne 0 ] && echo ' (failed)')" \
      > "$times_dir/$index.$n"
    n+=1
    [ $status -eq 0 ] || return $status
  done
}

run_stage() {  # run_stage STAGE LANE...: the lanes side by side
  local stage=$1 lane pid status=0 index=0
  shift
  lanes=$#
  local pids=()
  for lane in "$@"; do
    run_lane "$stage.$index" "$lane" &
    pids+=($!)
    index=$((index + 1))
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || { [ $status -ne 0 ] || status=$?; }
  done
  return $status
}

status=0 stage=0 lanes_of_stage=()
for arg in "$@" --; do
  if [ "$arg" != -- ]; then
    lanes_of_stage+=("$arg")
    continue
  fi
  [ ${#lanes_of_stage[@]} -gt 0 ] || continue
  run_stage $((stage++)) "${lanes_of_stage[@]}" || status=$?
  lanes_of_stage=()
  [ $status -eq 0 ] || break
done
echo "==> make test: seconds per part (the parts of a stage side by side, stages one after the other)"
cat "$times_dir"/* 2>/dev/null
printf '  %-11s %5d s\n' total $(($(date +%s) - begin))
exit $status
