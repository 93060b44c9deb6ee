#!/usr/bin/env bash
# TLS on the TCP data port against plain TCP (bench/ab.sh):
#   [IO_MODE=direct] bench/tls.sh [ROUNDS] [SECONDS] [MiB]
exec "$(dirname "$0")/ab.sh" "plain TCP" "" "TLS data port" "@TLS@ --data-tls" "$@"
