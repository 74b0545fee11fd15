#!/usr/bin/env bash
# Runs the inbox-deduplication sample on the embedded default and drives it
# over HTTP: one payment, its duplicate twice, then checks that exactly one
# notification was sent and one processed inbox entry exists per consumer.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp -d)/inbox-deduplication
go build -o "$bin" ./samples/inbox-deduplication
port=18080
"$bin" -listen 127.0.0.1:$port -amqp-url "" -postgres-dsn "" >/tmp/sample-e2e.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
base=http://127.0.0.1:$port
for _ in $(seq 1 100); do curl -fsS $base/health/ready >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS $base/health/ready
resp=$(curl -fsS -X POST "$base/payments?amount=42")
echo "$resp"
mid=$(printf '%s' "$resp" | python3 -c 'import json,sys; print(json.load(sys.stdin)["messageId"])')
pidp=$(printf '%s' "$resp" | python3 -c 'import json,sys; print(json.load(sys.stdin)["paymentId"])')
for _ in 1 2; do curl -fsS -X POST "$base/payments/duplicate?paymentId=$pidp&messageId=$mid&amount=42" >/dev/null; done
# Wait until all 3 deliveries per consumer are settled (6 = 2 processed + 4 duplicates).
for _ in $(seq 1 100); do
  n=$(curl -fsS $base/stats | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["Consumed"]+s["Duplicates"])')
  [ "$n" -ge 6 ] && break; sleep 0.1
done
notes=$(curl -fsS $base/notifications)
inbox=$(curl -fsS "$base/inbox?messageId=$mid")
echo "$notes"; echo "$inbox"
python3 - "$notes" "$inbox" <<'PY'
import json, sys
notes, inbox = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert notes["count"] == 1, f"want 1 notification, got {notes['count']}"
per = {}
for e in inbox["entries"]:
    assert e["processedAt"], f"unprocessed inbox entry {e}"
    per[e["consumerType"]] = per.get(e["consumerType"], 0) + 1
assert per == {"email-notifications": 1, "audit-log": 1}, per
print("sample e2e: 1 notification, one processed inbox entry per consumer: OK")
PY
kill -TERM $pid; wait $pid
echo "sample exited cleanly on SIGTERM"
