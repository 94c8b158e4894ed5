#!/usr/bin/env bash
# The CPU seconds a command's whole process tree uses (daemons, their fork servers and workers included), from a
# cgroup v1 cpuacct group of its own: a figure the load of a shared machine hardly moves, unlike wall time.
# Needs root and /sys/fs/cgroup/cpuacct. Example (issue 33's pool against the fork server):
#   bash bench/tree_cpu.sh jobs .venv/bin/python -m pytest -q tests/integration/test_jobs.py -k "mnist or gpt"
set -euo pipefail
name="arceus-$1"; shift
group="/sys/fs/cgroup/cpuacct/$name"
mkdir -p "$group"
echo 0 > "$group/cpuacct.usage"
start=$(date +%s.%N)
rc=0
bash -c 'echo $$ > "$0/tasks"; exec "$@"' "$group" "$@" || rc=$?
end=$(date +%s.%N)
awk -v u="$(cat "$group/cpuacct.usage")" -v s="$start" -v e="$end" -v rc="$rc" \
  'BEGIN { printf "cpu %.1f s, wall %.1f s, exit %d\n", u / 1e9, e - s, rc }'
exit "$rc"
