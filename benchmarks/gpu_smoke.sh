#!/bin/bash
# GPU smoke check of the verl launcher: on ONE GPU machine, from the repository root:
#
#   bash benchmarks/gpu_smoke.sh            # STEPS=4 WORK=/tmp/klsweep_gpu_smoke MODEL_ID=Qwen/Qwen2.5-0.5B-Instruct
#
# 1. installs klsweep[gpu] (verl[vllm]) unless klsweep, verl and vllm already import;
# 2. downloads the model from Hugging Face and writes a small GSM8K-format arithmetic dataset (parquet);
# 3. runs verl alone (python -m verl.trainer.main_ppo) with the overrides of the sweep's first trial;
# 4. runs the 2-trial GRPO sweep benchmarks/gpu_smoke.yaml with klsweep (trainer: verl, 1 GPU per trial);
# 5. prints the mean step time (verl's timing_s/step, first step excluded) with and without klsweep, and the ratio.
#
# About 5-8 minutes on an H100/H200 once installed (each run: ~1-2 min of Ray/vLLM start-up plus STEPS steps).
# Needs network access to PyPI and huggingface.co. It was never run in the session that wrote it (no GPU there).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/klsweep_gpu_smoke}
STEPS=${STEPS:-4}
MODEL_ID=${MODEL_ID:-Qwen/Qwen2.5-0.5B-Instruct}
export RAY_AUTH_MODE=disabled
rm -rf "$WORK" && mkdir -p "$WORK/data"
START=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

if ! python -c "import klsweep, verl, vllm" 2>/dev/null; then
    echo "== installing klsweep[gpu]"
    pip install -q -e '.[gpu]'
fi
echo "== model and data ($((SECONDS - START)) s)"
MODEL=$(python -c "from huggingface_hub import snapshot_download; print(snapshot_download('$MODEL_ID'))")
python - "$WORK/data" <<'PY'
"""Two-step arithmetic word problems in verl's GSM8K format (data_source openai/gsm8k: verl's gsm8k reward)."""
import random, sys
import pandas as pd

def rows(n, seed, split):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b, c = rng.randint(2, 60), rng.randint(2, 60), rng.randint(2, 9)
        question = f"Tom has {a} apples and buys {b} more. He shares them equally among {c} friends and keeps the rest. How many apples does he keep?"
        answer = (a + b) % c
        prompt = question + ' Let\'s think step by step and output the final answer after "####".'
        out.append({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": prompt}], "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": str(answer)},
                    "extra_info": {"split": split, "index": i}})
    return pd.DataFrame(out)

rows(256, 0, "train").to_parquet(f"{sys.argv[1]}/train.parquet")
rows(32, 1, "test").to_parquet(f"{sys.argv[1]}/test.parquet")
PY
sed -e "s|@MODEL@|$MODEL|g" -e "s|@DATA@|$WORK/data|g" benchmarks/gpu_smoke.yaml > "$WORK/gpu_smoke.yaml"

echo "== verl alone ($((SECONDS - START)) s)"
mapfile -t ARGS < <(python - "$WORK/gpu_smoke.yaml" "$WORK/plain" "budget.max_steps=$STEPS" <<'PY'
"""The first trial's command line, as klsweep builds it, minus klsweep: same overrides, same managed keys."""
import sys
from pathlib import Path
from klsweep.launchers.process import trial_command
from klsweep.space import seed_params, trial_overrides
from klsweep.spec.load import load_sweep

sweep = load_sweep(sys.argv[1], sys.argv[3:])
argv, _ = trial_command(trial_overrides(sweep, seed_params(sweep)[0]), trainer="verl", trial_dir=Path(sys.argv[2]))
print("\n".join(argv))
PY
)
mkdir -p "$WORK/plain/attempt-1"
PLAIN_START=$SECONDS
VERL_FILE_LOGGER_PATH="$WORK/plain/attempt-1/metrics.jsonl" "${ARGS[@]}" > "$WORK/plain.log" 2>&1 \
    || { tail -30 "$WORK/plain.log"; exit 1; }
PLAIN_WALL=$((SECONDS - PLAIN_START))

echo "== klsweep sweep, 2 trials ($((SECONDS - START)) s)"
SWEEP_START=$SECONDS
sweep run "$WORK/gpu_smoke.yaml" "budget.max_steps=$STEPS" --out "$WORK/sweep" --quiet > "$WORK/sweep.log" 2>&1 \
    || { tail -30 "$WORK/sweep.log"; exit 1; }
SWEEP_WALL=$((SECONDS - SWEEP_START))

python - "$WORK" "$PLAIN_WALL" "$SWEEP_WALL" <<'PY'
import json, statistics, sys
from pathlib import Path

work, plain_wall, sweep_wall = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def step_times(path):
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [line["data"]["timing_s/step"] for line in lines if "timing_s/step" in line["data"]][1:]

plain = step_times(work / "plain/attempt-1/metrics.jsonl")
trials = sorted(work.glob("sweep/**/attempt-1/metrics.jsonl"))
assert len(trials) == 2, f"expected 2 trials' metrics, found {trials}"
swept = [t for path in trials for t in step_times(path)]
leftovers = []
for proc in Path("/proc").glob("[0-9]*"):
    try:
        if b"verl.trainer.main_ppo" in (proc / "cmdline").read_bytes():
            leftovers.append(proc.name)
    except OSError:
        pass
print(f"verl alone     : {statistics.mean(plain):6.2f} s/step over {len(plain)} steps, {plain_wall} s wall for 1 run")
print(f"with klsweep   : {statistics.mean(swept):6.2f} s/step over {len(swept)} steps, {sweep_wall} s wall for 2 trials")
print(f"ratio (klsweep / verl alone, per step): {statistics.mean(swept) / statistics.mean(plain):.3f}")
print(f"verl processes left after the sweep: {len(leftovers)}")
PY
echo "== done in $((SECONDS - START)) s"
