#!/usr/bin/env bash
# Rebuilds models/tinytales.gguf from nothing but this folder:
#   1. prepare.py  the vocabulary (tokenizer.json; deterministic, the committed
#                  file is its output)
#   2. data.py     68M training tokens and 345K held-out tokens of generated text
#   3. train.py    the model (PyTorch; ~3 minutes on one H100/H200, --seconds)
#   4. engine-host convert   Hugging Face directory -> GGUF (F16)
# Usage: tools/train-default-model/build.sh [train.py options, e.g. --seconds 190]
# Needs python3 with PyTorch and a built build/bin/engine-host; WORK=DIR keeps
# the intermediate files (default: a temporary folder).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${WORK:-$(mktemp -d)}
python3 "$here/prepare.py" --out "$work/tokenizer.json"
cmp -s "$work/tokenizer.json" "$here/tokenizer.json" || echo "build: note: the vocabulary differs from the committed tokenizer.json"
python3 "$here/data.py" --tokenizer "$work/tokenizer.json" --out "$work/data"
python3 "$here/train.py" --tokenizer "$work/tokenizer.json" --data "$work/data" --out "$work/tinytales" "$@"
"$root/build/bin/engine-host" convert --hf "$work/tinytales" --out "$root/models/tinytales.gguf" --type F16
cp "$work/tinytales/train_report.json" "$here/train_report.json"
echo "build: wrote $root/models/tinytales.gguf (intermediate files in $work)"
