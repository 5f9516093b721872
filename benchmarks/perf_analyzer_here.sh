#!/usr/bin/env bash
# NVIDIA's perf_analyzer on a host whose glibc is older than its PyPI wheel needs (2.38; Debian 12 has 2.36).
#
# The wheel's binary is run, unchanged, by the dynamic loader of a newer glibc (Debian 13's libc6, with its
# libstdc++, libgcc, OpenSSL and zlib), all unpacked into .pa/ (ignored by git).  Nothing of the system is touched:
# apt reads Debian 13's package list into .pa/apt with its own state and cache directories, and `apt-get download`
# only fetches the .debs, which `dpkg -x` unpacks without installing them.  Writes the wrapper .pa/bin/perf_analyzer;
# bench_perf_analyzer.py uses it when present.
#
#     bash benchmarks/perf_analyzer_here.sh          # then: .pa/bin/perf_analyzer --version
#
# Where the host's glibc is new enough the wrapper runs the wheel's binary directly.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DEST=$PWD/.pa
VERSION=${PA_VERSION:-2.60.0}
SUITE=${PA_SUITE:-trixie}
mkdir -p "$DEST/bin" "$DEST/wheel"

if [ ! -x "$DEST/wheel/perf_analyzer/bin/perf_analyzer" ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64 --platform any \
    -d "$DEST/dl" "perf-analyzer==$VERSION"
  "$PY" -m zipfile -e "$DEST"/dl/perf_analyzer-"$VERSION"-*.whl "$DEST/wheel"
  chmod +x "$DEST/wheel/perf_analyzer/bin/perf_analyzer"
fi
BIN=$DEST/wheel/perf_analyzer/bin/perf_analyzer

glibc_here=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
if [ "$(printf '%s\n2.38\n' "$glibc_here" | sort -V | head -1)" = "2.38" ]; then
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$BIN" > "$DEST/bin/perf_analyzer"
else
  LIBS=$DEST/root/usr/lib/x86_64-linux-gnu
  if [ ! -x "$LIBS/ld-linux-x86-64.so.2" ]; then
    APT=("-o" "Dir::Etc::SourceList=/dev/null" "-o" "Dir::Etc::SourceParts=$DEST/apt/sources"
         "-o" "Dir::State::Lists=$DEST/apt/lists" "-o" "Dir::State::Status=$DEST/apt/status"
         "-o" "Dir::Cache::Archives=$DEST/apt/archives" "-o" "APT::Sandbox::User=root")
    mkdir -p "$DEST/apt/sources" "$DEST/apt/lists/partial" "$DEST/apt/archives/partial" "$DEST/debs"
    touch "$DEST/apt/status"
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
      "$SUITE" /usr/share/keyrings/debian-archive-keyring.gpg > "$DEST/apt/sources/newer.sources"
    apt-get "${APT[@]}" -q update >/dev/null
    (cd "$DEST/debs" && apt-get "${APT[@]}" -q download libc6 libstdc++6 libgcc-s1 libssl3t64 zlib1g >/dev/null)
    for deb in "$DEST"/debs/*.deb; do dpkg -x "$deb" "$DEST/root"; done
  fi
  printf '#!/bin/sh\nexec "%s" --library-path "%s" "%s" "$@"\n' "$LIBS/ld-linux-x86-64.so.2" "$LIBS" "$BIN" \
    > "$DEST/bin/perf_analyzer"
fi
chmod +x "$DEST/bin/perf_analyzer"
said=$("$DEST/bin/perf_analyzer" 2>&1 || true)  # with no arguments it prints its usage
if [[ $said != Usage:* ]]; then
  echo "$said" | head -5 >&2
  echo "perf_analyzer_here.sh: $DEST/bin/perf_analyzer does not start" >&2
  exit 1
fi
echo "perf_analyzer_here.sh: $DEST/bin/perf_analyzer (host glibc $glibc_here)"
