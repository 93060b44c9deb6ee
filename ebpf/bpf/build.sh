#!/usr/bin/env sh
# Compiles the BPF programs exactly as the checked-in objects were built.
# The prefix map keeps the build directory out of the debug info, so the
# object is the same wherever the repository lives.
set -eu
cd "$(dirname "$0")"
OUT=${1:-.}
for src in *.bpf.c; do
    clang -target bpf -g -O2 -I../include -I/usr/include/x86_64-linux-gnu \
        -fdebug-prefix-map="$(pwd)"=. -c "$src" -o "$OUT/${src%.c}.o"
done
