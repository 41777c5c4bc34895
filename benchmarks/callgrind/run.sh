#!/usr/bin/env bash
# Instructions per eager step under callgrind, dumped around N steps of each case (step.py).
#   ROOT=<checkout to measure> [CASES="..."] [N=40] [BATCH=0: the case's small batch] run.sh OUT
# STEP: another step script with the same protocol (default: callgrind/step.py).
# Writes OUT/counts.tsv: case, batch, method, instructions per step. Needs valgrind.
# Instrumentation is on only between a start and an end mark (--instr-atstart=no): the import of
# torch and each case's set-up run at valgrind's base cost, ~10x faster than instrumented.
set -u
out="$(mkdir -p "$1" && cd "$1" && pwd)"; rm -f "$out"/cg.out* "$out"/req "$out"/labels.txt
here="$(cd "$(dirname "$0")" && pwd)"
root="${ROOT:-$(cd "$here/../.." && pwd)}"
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/cg.out" python "${STEP:-$here/step.py}" "$root" "$out" \
  > "$out/valgrind.log" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  if [ -f "$out/req" ]; then
    label=$(cat "$out/req")
    if [ "$label" != finished ]; then
      callgrind_control -d "$label" "$pid" > /dev/null 2>&1 && echo "$label" >> "$out/labels.txt"
      case "$label" in
        start\|*) callgrind_control -i on "$pid" > /dev/null 2>&1 ;;
        end\|*) callgrind_control -i off "$pid" > /dev/null 2>&1 ;;
      esac
    fi
    rm -f "$out/req"
  fi
  sleep 0.2
done
python - "$out" "${N:-40}" <<'PY'
import glob, re, sys
out, steps = sys.argv[1], int(sys.argv[2])
# callgrind keeps only the label's first word in the dump: pair dumps and labels by order
labels = [line.strip() for line in open(f"{out}/labels.txt") if "|" in line]
dumps = sorted(glob.glob(f"{out}/cg.out.*"), key=lambda path: int(path.rsplit(".", 1)[1]))
rows = []
for label, path in zip(labels, dumps):
    kind, case, batch, method = label.split("|")
    if kind == "end":
        total = int(re.search(r"^summary: (\d+)", open(path).read(), re.M).group(1))
        rows.append(f"{case}\t{batch}\t{method}\t{total / steps:.0f}")
open(f"{out}/counts.tsv", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
