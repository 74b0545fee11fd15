#!/bin/sh
# Builds barewire-bench with the Watermill forwarder scenario compiled in.
# The forwarder needs github.com/ThreeDotsLabs/watermill-amqp/v3, which the
# module's go.mod does not list while no package imports it, so the build
# uses a temporary copy of go.mod/go.sum that adds it (the real ones are
# not touched).
#
#   ./cmd/barewire-bench/build.sh [output]   (default: ./barewire-bench)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-barewire-bench}
GO=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$root/go.mod" "$tmp/bench.mod"
cp "$root/go.sum" "$tmp/bench.sum"
cd "$root"
$GO get -modfile="$tmp/bench.mod" github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp@v3.0.2 >/dev/null 2>&1
$GO vet -modfile="$tmp/bench.mod" -tags watermillamqp ./cmd/barewire-bench/
$GO build -modfile="$tmp/bench.mod" -tags watermillamqp -o "$out" ./cmd/barewire-bench/
