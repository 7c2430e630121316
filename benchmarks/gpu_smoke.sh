#!/bin/bash
# One-shot offline acceptance check of klsweep's verl trials on ONE GPU box, from the repository root:
#
#   bash benchmarks/gpu_smoke.sh [--dry-run | --prepare-only | --forced-stop]    # env: WORK, STEPS, MODEL_DIR
#
#   --dry-run       print the plan (each step and command) and exit 0; runs nothing
#   --prepare-only  check what needs no GPU (vllm excepted), build the model, data and reward in $WORK, validate the
#                   sweep, and stop: runs on a CPU box
#   --forced-stop   the preconditions, then only the forced stop, on the $WORK an earlier whole run prepared
#
# Preconditions (exit 2 if one is missing; nothing is installed or downloaded, HF_HUB_OFFLINE=1): klsweep, verl,
# vllm, ray and transformers import; flash-attn is installed or the sweep uses the sdpa fallback
# (benchmarks/gpu_smoke.yaml does); a GPU that no other process uses; MODEL_DIR, if given, is a local model dir
# (else a tiny random Qwen2 and its tokenizer are built here with transformers).
# Then two trials of benchmarks/gpu_smoke.yaml (kl_coef 0.001 and 0.01) run at once on the one GPU (0.5 GPU each),
# with a custom reward that varies between samples, so the policy and the KL move.
# Pass (exit 0): both trials COMPLETE; each logged steps 1..STEPS with finite values only; each trial's actor/kl_coef
# equals its swept kl_coef to a relative 1e-9 (verl averages its micro-batches' values with np.mean); the trials
# overlapped in time; after a forced stop (SIGKILL of the sweep driver itself, not of `timeout`, while its two
# trials train and hold the GPU) the GPU has no process and its memory is back to the baseline (+256 MiB) within
# 15 s, by nvidia-smi. A failed check exits 1. Every command runs under `timeout`.
# CI runs all of it on CPU against stand-ins (tests/launchers/test_gpu_smoke.py: tests/standins/ holds a main_ppo
# that logs, checkpoints and sleeps/wakes like verl, and an nvidia-smi that reports the stand-ins' memory).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-}
case $MODE in ""|--dry-run|--prepare-only|--forced-stop) ;; *) echo "usage: $0 [--dry-run | --prepare-only | --forced-stop]" >&2; exit 2 ;; esac
WORK=${WORK:-/tmp/klsweep_gpu_accept}
STEPS=${STEPS:-4}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled
say() { echo "== $*"; }
missing() { echo "MISSING PRECONDITION: $*" >&2; exit 2; }
fail() { echo "FAILED: $*" >&2; exit 1; }
exec 3>&2  # the plan's lines go to the terminal's stderr, also from a command whose output goes to a log (commands
           # get no fd 3: a process that outlives this script would hold the caller's stderr open)
run() {  # run [SECONDS] CMD...: under timeout; --dry-run only prints it
    local limit=$1; shift
    echo "+ timeout $limit $*" >&3
    [[ $MODE == --dry-run ]] || timeout "$limit" "$@" 3>&-
}
gpu_mib() { timeout 10 nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
gpu_pids() { timeout 10 nvidia-smi --query-compute-apps=pid --format=csv,noheader; }

say "preconditions"
NEEDS="klsweep, verl, ray, transformers"
[[ $MODE == --prepare-only ]] || NEEDS+=", vllm"
run 60 python -c "import $NEEDS" || missing "$NEEDS must import (pip install -e '.[gpu]' first; this check installs nothing)"
if ! run 30 python -c "import importlib.util as u, sys; sys.exit(u.find_spec('flash_attn') is None)"; then
    grep -q "attn_implementation: sdpa" benchmarks/gpu_smoke.yaml || missing "flash-attn, or the sdpa fallback in benchmarks/gpu_smoke.yaml"
    echo "flash-attn not installed: the sweep's sdpa fallback is used"
fi
[[ -z ${MODEL_DIR:-} || -f ${MODEL_DIR:-}/config.json ]] || missing "MODEL_DIR=$MODEL_DIR has no config.json"
if [[ $MODE != --prepare-only ]]; then
    run 10 nvidia-smi -L || missing "nvidia-smi lists no GPU"
    [[ $MODE == --dry-run || -z $(gpu_pids) ]] || missing "another process uses the GPU: $(gpu_pids | tr '\n' ' ')"
fi

# 12 CPUs a trial: verl's inner Ray takes 3 per GPU and 9 for TransferQueue, or waits for them silently
SWEEP_ARGS=("budget.max_steps=$STEPS" budget.max_concurrent=2 budget.resources.gpu=0.5 budget.resources.cpu=12
            "overrides.reward.custom_reward_function.path=$WORK/reward.py" overrides.reward.num_workers=2)
BASELINE=0
if [[ $MODE == --forced-stop ]]; then
    [[ -f $WORK/gpu_smoke.yaml ]] || missing "$WORK/gpu_smoke.yaml: run the whole check once first (it prepares $WORK)"
    rm -rf "$WORK/stop"
    BASELINE=$(gpu_mib)
else
say "model, data and reward in $WORK (offline)"
[[ $MODE == --dry-run ]] || { rm -rf "$WORK" && mkdir -p "$WORK/data"; }
MODEL=${MODEL_DIR:-$WORK/model}
run 300 python - "$WORK" "${MODEL_DIR:-}" <<'PY'
"""GSM8K-format parquet data, a reward that varies between samples, and (without MODEL_DIR) a tiny random Qwen2."""
import random, sys
import pandas as pd

work, model_dir = sys.argv[1], sys.argv[2]
def rows(n, seed, split):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        out.append({"data_source": "openai/gsm8k", "ability": "math",
                    "prompt": [{"role": "user", "content": f"Tom has {a} apples and buys {b} more. How many?"}],
                    "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                    "extra_info": {"split": split, "index": i}})
    return pd.DataFrame(out)
train, test = rows(256, 0, "train"), rows(32, 1, "test")
train.to_parquet(f"{work}/data/train.parquet")
test.to_parquet(f"{work}/data/test.parquet")
with open(f"{work}/reward.py", "w") as f:  # verl's reward.custom_reward_function (name compute_score)
    f.write("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
            "    return sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))\n")
if not model_dir:
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([m[0]["content"] for m in train["prompt"]] + ["0123456789 apples"] * 10,
                            vocab_size=512, special_tokens=specials)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tokenizer.save_pretrained(f"{work}/model")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=True, torch_dtype="bfloat16")
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(f"{work}/model")
    text = tokenizer.apply_chat_template(list(train["prompt"][0]), add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text)["input_ids"]
    print(f"tiny Qwen2 in {work}/model: vocab {len(tokenizer)}, a prompt is {len(ids)} tokens")
PY
run 10 sed -n -e "s|@MODEL@|$MODEL|g" -e "s|@DATA@|$WORK/data|g" -e "w $WORK/gpu_smoke.yaml" benchmarks/gpu_smoke.yaml
run 120 sweep validate "$WORK/gpu_smoke.yaml" "${SWEEP_ARGS[@]}" || fail "sweep validate refused the sweep"
[[ $MODE == --prepare-only ]] && { say "prepared; the GPU steps were not run"; exit 0; }

say "two trials at once on one GPU"
[[ $MODE == --dry-run ]] || BASELINE=$(gpu_mib)
LOG=$WORK/sweep.log
[[ $MODE != --dry-run ]] || LOG=/dev/null
run 1800 sweep run "$WORK/gpu_smoke.yaml" "${SWEEP_ARGS[@]}" --out "$WORK/sweep" --quiet > "$LOG" 2>&1 \
    || { tail -40 "$LOG"; fail "sweep run exited non-zero"; }
run 120 python - "$WORK/sweep" "$STEPS" <<'PY' || fail "see the lines above"
"""Both trials COMPLETE, steps 1..N finite, actor/kl_coef = the trial's kl_coef, the two trials overlapped.

verl logs actor/kl_coef as np.mean of one value per micro-batch (verl/workers/utils/losses.py,
verl/utils/metric/utils.py reduce_metrics): 10 values of 0.001 give 0.0010000000000000002, hence the tolerance."""
import json, math, sys
from pathlib import Path
import optuna

out, steps = Path(sys.argv[1]), int(sys.argv[2])
problems = []
(summary,) = optuna.get_all_study_summaries(f"sqlite:///{out}/study.db")
states = [t.state.name for t in optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{out}/study.db").trials]
if states != ["COMPLETE", "COMPLETE"]:
    problems.append(f"trial states {states}, expected two COMPLETE")
spans = []
for trial in sorted(p for p in (out / "tune").iterdir() if (p / "attempt-1").is_dir()):
    lines = [json.loads(x) for a in sorted(trial.glob("attempt-*")) for x in (a / "metrics.jsonl").read_text().splitlines()]
    logged = sorted({x["step"] for x in lines} - {0})
    bad = [(x["step"], k) for x in lines for k, v in x["data"].items()
           if v is None or (isinstance(v, float) and not math.isfinite(v))]  # verl's orjson writes NaN/inf as null
    swept = json.loads((trial / "params.json").read_text())["actor_rollout_ref.actor.kl_loss_coef"]
    coefs = {x["data"]["actor/kl_coef"] for x in lines if "actor/kl_coef" in x["data"]}
    kl = [x["data"].get("actor/kl_loss") or 0.0 for x in lines]
    print(f"{trial.name}: steps {logged}, kl_coef {sorted(coefs)} (swept {swept}), max actor/kl_loss {max(kl):.3g}")
    if logged != list(range(1, steps + 1)):
        problems.append(f"{trial.name}: logged steps {logged}, expected 1..{steps}")
    if bad:
        problems.append(f"{trial.name}: non-finite values at (step, metric) {bad[:5]}")
    if not coefs or not all(math.isclose(c, swept, rel_tol=1e-9) for c in coefs):
        problems.append(f"{trial.name}: actor/kl_coef {sorted(coefs)} is not the swept kl_coef {swept}")
    spans.append(((trial / "attempt-1" / "spec.json").stat().st_mtime, (trial / "attempt-1" / "exit.json").stat().st_mtime))
if len(spans) != 2 or not (spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]):
    problems.append(f"the trials did not run at the same time: (start, end) {spans}")
print("\n".join(["checks passed"] if not problems else problems))
sys.exit(1 if problems else 0)
PY
fi

say "forced stop: SIGKILL of the sweep driver while its trials train; GPU memory back within 15 s"
if [[ $MODE == --dry-run ]]; then
    echo "+ timeout 900 sweep run $WORK/gpu_smoke.yaml ${SWEEP_ARGS[*]} budget.max_steps=400 --out $WORK/stop" \
         "--quiet, SIGKILL of its driver after step 1, nvidia-smi until the GPU is free" >&3
    exit 0
fi
# Both seed trials again, for 400 steps (under verl's 30 epochs of the 256-row data). `exec` keeps the pid bash writes, so $WORK/stop.pid is the sweep driver's
# own pid, not that of `timeout` (a SIGKILL of timeout would leave the driver running, re-parented to init).
timeout 900 bash -c 'echo $$ > "$0"; exec "$@"' "$WORK/stop.pid" \
    sweep run "$WORK/gpu_smoke.yaml" "${SWEEP_ARGS[@]}" budget.max_steps=400 --out "$WORK/stop" --quiet \
    > "$WORK/stop.log" 2>&1 3>&- &
TIMEOUT_PID=$!
STEPPED=
for _ in $(seq 600); do  # up to 10 min for verl's start-up and its first step
    if compgen -G "$WORK/stop/tune/*/attempt-1/metrics.jsonl" > /dev/null \
            && grep -q '"step":1' "$WORK"/stop/tune/*/attempt-1/metrics.jsonl; then
        STEPPED=1
        break
    fi
    kill -0 "$TIMEOUT_PID" 2>/dev/null || { tail -40 "$WORK/stop.log"; fail "the stop trial ended before its first step"; }
    sleep 1
done
[[ -n $STEPPED ]] || { tail -40 "$WORK/stop.log"; fail "no trial of the stop run logged step 1 within 600 s"; }
DRIVER=$(cat "$WORK/stop.pid")
BUSY=$(gpu_pids | tr '\n' ' ')
[[ -n $BUSY ]] || fail "nvidia-smi shows no process on the GPU while the stop run trains: nothing to check"
echo "killing the sweep driver (pid $DRIVER); on the GPU: pids $BUSY, $(gpu_mib) MiB used"
kill -9 "$DRIVER"
KILLED=$SECONDS
wait "$TIMEOUT_PID" || true  # timeout returns the driver's status, 137
! kill -0 "$DRIVER" 2>/dev/null || fail "the sweep driver (pid $DRIVER) still runs after SIGKILL"
while [[ -n $(gpu_pids) || $(gpu_mib) -gt $((BASELINE + 256)) ]]; do
    (( SECONDS - KILLED <= 15 )) || fail "GPU not free $((SECONDS - KILLED)) s after the forced stop: pids $(gpu_pids | tr '\n' ' '), $(gpu_mib) MiB used, baseline $BASELINE MiB"
    sleep 0.5
done
echo "GPU free $((SECONDS - KILLED)) s after the forced stop ($(gpu_mib) MiB used, baseline $BASELINE MiB)"
# What the killed driver's private Ray left (its agents live ~60 s on a dead GCS) ends now, as the next `sweep run`
# in that directory would end it (klsweep/orchestrate/_ray_session.py).
run 60 python -c "import sys; from pathlib import Path; from klsweep.orchestrate._ray_session import end_orphaned_session
end_orphaned_session(Path(sys.argv[1]))" "$WORK/stop"
say "PASS"
