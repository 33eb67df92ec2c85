#!/usr/bin/env bash
# Instructions per event on the relay's hot path (decode → map → produce), counted by
# valgrind's callgrind inside `relay_path` only, so setup and librdkafka's own threads drop out:
# the 100-row shape is run K=2 and K=6 times and the difference is divided by the events of
# the 4 extra runs. Repeatable whatever else the machine is doing.
#
#   bash scripts/callgrind-hot-path.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v valgrind >/dev/null || { echo "callgrind-hot-path: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
cargo bench --bench hot_path --no-run --message-format=json 2>/dev/null >/tmp/hot_path-build.json
bin=$(python3 -c '
import json, sys
for line in open("/tmp/hot_path-build.json"):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "hot_path" and m.get("executable"):
        print(m["executable"])
')
[ -n "$bin" ] || { echo "callgrind-hot-path: no hot_path bench binary" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
count() {
  valgrind --tool=callgrind --toggle-collect='hot_path::relay_path' --callgrind-out-file="$dir/out.$1" \
    "$bin" --repeat "$1" >"$dir/stdout.$1" 2>"$dir/stderr.$1"
  local ir events
  ir=$(grep -m1 '^summary:' "$dir/out.$1" | awk '{print $2}')
  events=$(awk '/^events /{print $2}' "$dir/stdout.$1")
  echo "$ir $events"
}
read -r ir2 ev2 < <(count 2)
read -r ir6 ev6 < <(count 6)
python3 -c "
ir2, ev2, ir6, ev6 = $ir2, $ev2, $ir6, $ev6
print(f'instructions per event (decode → map → produce, 100-row transactions): {(ir6 - ir2) / (ev6 - ev2):.0f}')
print(f'  K=2: {ir2} instructions, {ev2} events; K=6: {ir6} instructions, {ev6} events')
"
