#!/usr/bin/env bash
# Builds the AssemblyScript proxy-wasm fixture: ./build.sh OUTPUT.wasm
# Needs only node and npm. Installs the pinned packages from package-lock.json with
# `npm ci` (preferring the npm cache) unless node_modules already matches the lock file.
set -euo pipefail

die() { echo "as_filter build: $*" >&2; exit 1; }

[ $# -eq 1 ] && [ -n "$1" ] || die "usage: $0 OUTPUT.wasm"
out=$1
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

command -v node >/dev/null 2>&1 || die "node not found (install Node.js and npm)"
command -v npm >/dev/null 2>&1 || die "npm not found (install Node.js and npm)"

# node_modules is current when it was installed from this very package.json + lock file.
stamp=node_modules/.wasmesh-install-stamp
want=$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ ! -x node_modules/.bin/asc ]; then
  echo "as_filter build: npm ci" >&2
  npm ci --prefer-offline --no-audit --no-fund --loglevel=error >&2 \
    || die "npm ci failed (is the npm registry or a warm npm cache reachable?)"
  echo "$want" > "$stamp"
fi

mkdir -p build "$(dirname "$out")" || die "cannot create $(dirname "$out")"
# Recompile only when the sources or the installed packages changed since the last build.
wasm=build/as_filter.wasm
if [ ! -s "$wasm" ] || [ -n "$(find assembly package.json package-lock.json "$stamp" -newer "$wasm" -print -quit)" ]; then
  rm -f "$wasm"
  npm run --silent asbuild >&2 || die "asc failed to compile assembly/index.ts (npm run asbuild)"
  [ -s "$wasm" ] || die "asc produced no $wasm"
fi
cp "$wasm" "$out.tmp.$$" && mv -f "$out.tmp.$$" "$out" || die "cannot write $out"
echo "as_filter build: wrote $out ($(wc -c < "$out") bytes)" >&2
