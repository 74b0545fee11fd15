#!/usr/bin/env bash
# Depends on BareWire from a checkout, the way README.md and
# docs/getting-started.md ("Install") tell a new user to, in a scratch
# module next to nothing else: a replace directive, go mod tidy, then build
# and run examples/embedded-minimal's program there. The module is not
# published on a proxy yet, so `go get github.com/barewire-go/barewire`
# cannot work; CI runs this script so that the documented way keeps working.
#
#   scripts/use-from-checkout.sh [checkout]   # default: this checkout
set -euo pipefail
checkout="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
mkdir orders && cd orders
cp "$checkout/examples/embedded-minimal/main.go" main.go

# The commands the docs give, word for word (with the checkout's path):
go mod init example.com/orders
go mod edit -replace github.com/barewire-go/barewire="$checkout"
go mod tidy

go build -o orders .
out="$(./orders)"
echo "$out"
case "$out" in
*hello*) echo "use-from-checkout: ok (a module with a replace directive to $checkout builds and runs)" ;;
*) echo "use-from-checkout: the program did not print its greeting" >&2; exit 1 ;;
esac
