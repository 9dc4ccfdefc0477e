#!/usr/bin/env bash
# Black-box tests of the engine-host command line: exit codes, messages,
# JSON shapes. Usage: cli_test.sh ENGINE_HOST TEST_PLUGIN_DIR TESTDATA_DIR
source "$(dirname "$0")/testlib.sh"
eh=$1 plugins=$2 testdata=$3

expect help 0 'engine-host plugins \[--plugins DIR\]' -- "$eh" --help
expect version 0 '^engine-host [0-9]+\.[0-9]+\.[0-9]+ \(plugin ABI 1\.[0-9]+\)' -- "$eh" --version
expect unknown-command 2 "unknown command 'frobnicate'" -- "$eh" frobnicate
expect plugins-help 0 'Usage: engine-host plugins' -- "$eh" plugins --help
expect plugins-empty-arg 2 "the required argument for option '--plugins' is missing" -- "$eh" plugins --plugins
expect plugins-bad-option 2 "unrecognised option '--colour'|unrecognized option '--colour'" -- "$eh" plugins --plugins "$plugins/good" --colour
# No prefix guessing: --plugin is not read as --plugins (that failed later as a directory, exit 3).
expect serve-prefix-not-guessed 2 "unrecognised option '--plugin'|unrecognized option '--plugin'" -- "$eh" serve --plugin good --model /no/such.gguf
expect plugins-missing-dir 3 "plugin directory '/no/such/dir' does not exist" -- "$eh" plugins --plugins /no/such/dir
expect plugins-good 0 'test-engine +1\.0\.0 +cpu +accepted' -- "$eh" plugins --plugins "$plugins/good"
expect plugins-json 0 '"accepted": true' -- "$eh" plugins --plugins "$plugins/good" --json
expect plugins-only-rejected 3 'REJECTED +plugin crashed with signal 11' -- "$eh" plugins --plugins "$plugins/crash"

model=$testdata/models/stories260K.gguf
expect inspect-text 0 'architecture +llama' -- "$eh" inspect --model "$model"
expect inspect-tokenizer 0 'kind +gguf-spm' -- "$eh" inspect --model "$model"
expect inspect-chat-template 0 'chat_template +none \(chat requests get' -- "$eh" inspect --model "$model"
expect inspect-plugin 0 'serves it +test-engine 1\.0\.0' -- "$eh" inspect --model "$model" --plugins "$plugins/good"
expect inspect-json 0 '"quant_kind": ?"F32"' -- "$eh" inspect --model "$model" --json
expect inspect-no-plugin 3 'no accepted plugin can serve this model' -- "$eh" inspect --model "$testdata/vocab/ggml-vocab-gpt-2.gguf" --plugins "$plugins/good"
printf 'GGUF\x03\x00\x00\x00' >"$scratch/truncated.gguf"
expect inspect-truncated 4 "^error: GGUF '.*truncated.gguf'.*\[MODEL_LOAD_FAILED\]" -- "$eh" inspect --model "$scratch/truncated.gguf"
# Serve refuses a file whose tokenizer does not load (exit 4): so does
# inspect, saying why (issue 26: it exited 0). A same-length key rename keeps
# the GGUF valid.
LC_ALL=C perl -pe 's/tokenizer\.ggml\.tokens/tokenizer.ggml.tokenz/g' "$model" >"$scratch/no-tokens.gguf"
expect inspect-tokenizer-refused 4 "why +tokenizer: missing metadata 'tokenizer.ggml.tokens' \[MODEL_LOAD_FAILED\]" -- "$eh" inspect --model "$scratch/no-tokens.gguf"
expect serve-tokenizer-refused 4 "tokenizer: missing metadata 'tokenizer.ggml.tokens'" -- timeout 20 "$eh" --model "$scratch/no-tokens.gguf" --plugins "$plugins/good" --port 0 --log-level off
expect inspect-json-refused 4 '"exit_code": ?4' -- "$eh" inspect --model "$scratch/no-tokens.gguf" --json
expect inspect-serves 0 'verdict +yes, as far as checked' -- "$eh" inspect --model "$model" --plugins "$plugins/good"
expect inspect-no-plugin-verdict 3 'verdict +no: serve refuses this file' -- "$eh" inspect --model "$testdata/vocab/ggml-vocab-gpt-2.gguf" --plugins "$plugins/good"
expect inspect-missing 4 'MODEL_LOAD_FAILED|NOT_FOUND' -- "$eh" inspect --model "$scratch/absent.gguf"

# Hostile files (issue 26 item 3): a FIFO or device as the model, and a FIFO
# named as a manifest, are refused at once (they blocked for ever).
mkfifo "$scratch/fifo.gguf"
expect inspect-fifo 4 "is not a regular file.*MODEL_LOAD_FAILED" -- timeout 10 "$eh" inspect --model "$scratch/fifo.gguf"
expect inspect-device 4 "is not a regular file" -- timeout 10 "$eh" inspect --model /dev/zero
mkdir "$scratch/fifo-plugins"
cp "$plugins/good/"* "$scratch/fifo-plugins/"
mkfifo "$scratch/fifo-plugins/evil.manifest.json"
expect plugins-fifo-manifest 0 'evil\.manifest\.json.*REJECTED +manifest .* is not a regular file' -- timeout 10 "$eh" plugins --plugins "$scratch/fifo-plugins"
expect serve-fifo-model 4 "is not a regular file" -- timeout 10 "$eh" --plugins "$plugins/good" --model "$scratch/fifo.gguf" --port 0 --log-level off

# ABI 1.4: a plugin with the batched step and no session calls serves the
# chat command through the step, with the ids the session-only engine gives;
# bench runs its step path and refuses the session path by name.
greedy_good=$("$eh" chat -m "$model" --plugins "$plugins/good" -p "Once upon" -n 12 --temp 0 2>&1 | od -c)
greedy_step=$("$eh" chat -m "$model" --plugins "$plugins/step-only" -p "Once upon" -n 12 --temp 0 2>&1 | od -c)
[[ -n "$greedy_good" && "$greedy_step" == "$greedy_good" ]]
check step-only-chat-same-ids $? "session engine: $greedy_good / step-only: $greedy_step"
expect step-only-bench 0 '\| fixture-step-only +\| step +\|' -- "$eh" bench --plugins "$plugins/step-only" --model "$model" -p 64 -n 8 -r 1
# --engine-options reach the load (the test engine refuses one that asks it to)
expect bench-engine-options 1 'fixture: the load options ask for a refusal' -- "$eh" bench --plugins "$plugins/step-only" --model "$model" -p 64 -n 8 -r 1 --engine-options '{"refuse_load":true}'
expect step-only-bench-session 1 'has no session calls \(ABI 1.4, step only\)' -- "$eh" bench --plugins "$plugins/step-only" --model "$model" -p 64 -n 8 -r 1 --path session
finish
