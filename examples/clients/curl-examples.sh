#!/bin/sh
# engine-host from the command line. Start a server first, e.g.
#   engine-host --plugins build/plugins --model model.gguf --port 8080
# then: sh examples/clients/curl-examples.sh [http://127.0.0.1:8080]
set -eu
BASE=${1:-http://127.0.0.1:8080}

echo "== health";        curl -s "$BASE/health"; echo
echo "== capabilities";  curl -s "$BASE/capabilities" | head -c 400; echo
echo "== tokenize";      curl -s "$BASE/tokenize" -H 'Content-Type: application/json' -d '{"text":"Hello world"}'; echo

echo "== execute (SSE; -N turns off curl's buffering)"
curl -sN "$BASE/execute" -H 'Content-Type: application/json' -H 'X-Correlation-Id: demo-1' \
  -d '{"job_id":"demo-1","prompt":"Once upon a time","max_tokens":32,"temperature":0,"stop":["\n\n"]}'

echo "== cancel (idempotent; 202 whether or not the job still runs)"
curl -s "$BASE/cancel" -H 'Content-Type: application/json' -d '{"job_id":"demo-1"}'; echo

echo "== OpenAI chat, not streaming"
curl -s "$BASE/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"any","messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":32}'; echo

echo "== OpenAI chat, streaming with usage"
curl -sN "$BASE/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"any","messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":16,"stream":true,"stream_options":{"include_usage":true}}'

echo "== Anthropic Messages API, not streaming"
curl -s "$BASE/v1/messages" -H 'Content-Type: application/json' \
  -d '{"model":"any","max_tokens":32,"system":"You tell short stories.","messages":[{"role":"user","content":"Tell me a story"}]}'; echo

echo "== Anthropic Messages API, streaming"
curl -sN "$BASE/v1/messages" -H 'Content-Type: application/json' \
  -d '{"model":"any","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"Tell me a story"}]}'

echo "== Anthropic token count"
curl -s "$BASE/v1/messages/count_tokens" -H 'Content-Type: application/json' \
  -d '{"model":"any","messages":[{"role":"user","content":"Tell me a story"}]}'; echo

echo "== metrics";       curl -s "$BASE/metrics" | grep -v '^#' | head -20
