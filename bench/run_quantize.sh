#!/bin/sh
# Post-training quantization (issue 26's benchmark, weights-only part): the
# README's MLP, the CNN and the GPT are trained at 2 ranks with their configs,
# then each checkpoint is quantized to int8 and int4, per output channel and
# per tensor, and evaluated on its test split (`paratrain evaluate`). Prints
# one JSON object per (model, format): file bytes against the float
# parameters, test accuracy or perplexity, evaluation seconds.
# usage: bench/run_quantize.sh [BUILD_DIR] [OUT_DIR]
set -eu
build=${1:-build}
out=${2:-/tmp/paratrain-quantize-bench}
rm -rf "$out"
mkdir -p "$out"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

train() {  # NAME CONFIG [--set ...]
  name=$1 config=$2
  shift 2
  "$build/paratrain" launch --nproc-per-node 2 -- "$build/paratrain" train -c "$config" \
    --set run.output_dir="$out" --set run.name="$name" --set log.progress=off "$@" > "$out/$name.log" 2>&1
}

evaluate() {  # MODEL FORMAT FILE KIB
  start=$(date +%s.%N)
  line=$("$build/paratrain" evaluate --checkpoint "$3")
  end=$(date +%s.%N)
  python3 - "$1" "$2" "$4" "$line" "$start" "$end" <<'PY'
import json, re, sys
model, fmt, kib, line, start, end = sys.argv[1:7]
out = {"model": model, "format": fmt, "kib": float(kib), "eval_s": round(float(end) - float(start), 2)}
m = re.search(r"accuracy ([0-9.]+)%", line)
if m: out["test_accuracy"] = float(m.group(1))
m = re.search(r"perplexity ([0-9.]+)", line)
if m: out["perplexity"] = float(m.group(1))
print(json.dumps(out))
PY
}

# The parameters and buffers in KiB before (field 1) and after (field 2), from
# quantize's report line: "..., A KiB of parameters and buffers -> B KiB (...)".
kib() { sed -E 's/.*, ([0-9.]+) KiB of parameters and buffers -> ([0-9.]+) KiB.*/\1 \2/' | cut -d' ' -f"$1"; }

quantize_all() {  # MODEL CHECKPOINT
  model=$1 ckpt=$2
  for bits in 8 4; do
    for g in channel tensor; do
      flag=""
      [ $g = tensor ] && flag=--per-tensor
      report=$("$build/paratrain" quantize "$ckpt" -o "$out/$model.int$bits.$g.safetensors" --bits $bits $flag)
      if [ $bits = 8 ] && [ $g = channel ]; then
        evaluate "$model" float32 "$ckpt" "$(echo "$report" | kib 1)"
      fi
      evaluate "$model" "int$bits per $g" "$out/$model.int$bits.$g.safetensors" "$(echo "$report" | kib 2)"
    done
  done
}

newest() { ls -d "$out/$1"/version_0/checkpoints/step_* | sort | tail -1; }

train mlp configs/fashion_mnist_mlp.toml
quantize_all mlp "$(newest mlp)"
train cnn configs/fashion_mnist_cnn.toml
quantize_all cnn "$(newest cnn)"
train gpt configs/gpt_fortunes.toml --set train.checkpoint_every_steps=0
quantize_all gpt "$(newest gpt)"
