#!/bin/sh
# Post-training quantization (issue 26's benchmark): the README's MLP, the
# CNN and the GPT are trained at 2 ranks with their configs, then each
# checkpoint is quantized and evaluated on its test split (`paratrain
# evaluate`): int8 weights per output channel with float, dynamic and static
# (32 calibration batches) int8 activations; int8 per tensor and int4 with
# float activations; for the CNN also 4-bit weights and activations after
# training (PTQ, static) against quantization-aware training at the same
# bits. Prints one JSON object per (model, format): file bytes against the
# float parameters, test accuracy or perplexity, evaluation seconds.
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

quantize_one() {  # MODEL CHECKPOINT LABEL FILE_SUFFIX [quantize flags...]
  model=$1 ckpt=$2 label=$3 suffix=$4
  shift 4
  report=$("$build/paratrain" quantize "$ckpt" -o "$out/$model.$suffix.safetensors" "$@")
  evaluate "$model" "$label" "$out/$model.$suffix.safetensors" "$(echo "$report" | kib 2)"
}

quantize_all() {  # MODEL CHECKPOINT
  model=$1 ckpt=$2
  report=$("$build/paratrain" quantize "$ckpt" -o "$out/$model.tmp.safetensors" --activations none)
  evaluate "$model" float32 "$ckpt" "$(echo "$report" | kib 1)"
  quantize_one "$model" "$ckpt" "int8 per channel, float activations" w8c --activations none
  quantize_one "$model" "$ckpt" "int8 per channel, int8 dynamic activations" w8c-dyn
  quantize_one "$model" "$ckpt" "int8 per channel, int8 static activations (32 batches)" w8c-static --calibrate 32
  quantize_one "$model" "$ckpt" "int8 per tensor, float activations" w8t --activations none --per-tensor
  quantize_one "$model" "$ckpt" "int4 per channel, float activations" w4c --bits 4 --activations none
  quantize_one "$model" "$ckpt" "int4 per tensor, float activations" w4t --bits 4 --activations none --per-tensor
}

newest() { ls -d "$out/$1"/version_0/checkpoints/step_* | sort | tail -1; }

train mlp configs/fashion_mnist_mlp.toml
quantize_all mlp "$(newest mlp)"
train cnn configs/fashion_mnist_cnn.toml
quantize_all cnn "$(newest cnn)"
# 4-bit weights and 4-bit activations: after training, and learned.
quantize_one cnn "$(newest cnn)" "PTQ: int4 weights, int4 static activations (32 batches)" w4a4 --bits 4 \
  --calibrate 32 --activation-bits 4
train cnn_qat configs/fashion_mnist_cnn.toml --set quant.qat=true --set quant.weight_bits=4 \
  --set quant.activation_bits=4 --set quant.start_step=500
quantize_one cnn_qat "$(newest cnn_qat)" "QAT: int4 weights, int4 learned activations" w4a4
train gpt configs/gpt_fortunes.toml --set train.checkpoint_every_steps=0
quantize_all gpt "$(newest gpt)"
