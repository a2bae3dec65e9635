#!/usr/bin/env bash
# Two zeroth binaries on the same training config, alternating, in one run: the median tokens/s
# of each run (first step excluded), the ratio per round, and whether the two give the same
# losses, gradient norms and learning rates bit for bit.
#   tools/ab-train.sh OLD_BINARY NEW_BINARY [CONFIG] [ROUNDS] [STEPS]
# Defaults: the README's config, 3 rounds, 60 steps. Nothing else should run meanwhile.
set -euo pipefail
old=${1:?"usage: tools/ab-train.sh OLD_BINARY NEW_BINARY [CONFIG] [ROUNDS] [STEPS]"}
new=${2:?"usage: tools/ab-train.sh OLD_BINARY NEW_BINARY [CONFIG] [ROUNDS] [STEPS]"}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
config=${3:-$root/configs/gpt-fortunes-zero3-bf16.json}
rounds=${4:-3}
steps=${5:-60}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for ((r = 0; r < rounds; r++)); do
  order=(old new)
  ((r % 2 == 1)) && order=(new old)
  for side in "${order[@]}"; do
    bin=$old
    [[ $side == new ]] && bin=$new
    "$bin" train "$config" --set run.steps="$steps" --set run.eval_interval=0 --set run.eval_batches=1 \
      --set run.output_dir="$out/$side$r" > /dev/null
  done
done

python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(path):
    steps = [json.loads(l) for l in open(path) if '"step"' in l and '"loss"' in l]
    return steps, statistics.median(s["tokens_per_s"] for s in steps[1:])
med = {"old": [], "new": []}
same = True
for r in range(rounds):
    a, ma = load(f"{out}/old{r}/metrics.jsonl")
    b, mb = load(f"{out}/new{r}/metrics.jsonl")
    med["old"].append(ma)
    med["new"].append(mb)
    key = lambda s: (s["step"], s["loss"], s["grad_norm"], s["lr"])
    same = same and [key(s) for s in a] == [key(s) for s in b]
    print(f"round {r}: old {ma:.0f} tokens/s, new {mb:.0f} tokens/s, new/old {mb / ma:.3f}")
print(f"median: old {statistics.median(med['old']):.0f}, new {statistics.median(med['new']):.0f} tokens/s; "
      f"ratios {min(n / o for n, o in zip(med['new'], med['old'])):.3f} .. {max(n / o for n, o in zip(med['new'], med['old'])):.3f}")
print("losses, grad norms, lr: " + ("bit-identical" if same else "DIFFERENT"))
EOF
