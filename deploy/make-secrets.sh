#!/usr/bin/env bash
# deploy/make-secrets.sh — generate the secrets a dlock deployment mounts as files, into a
# git-ignored directory (default deploy/secrets/), never into the repository:
#
#   credentials          auth.credentials-file of every service: worker, operator, reader
#                        tokens (C3-extensions E-13), 32 random bytes each, hex
#   executor-token       executor.auth.token-file: the worker token alone
#   grant-signing.key    lock.grants.signing-key-file: the 32-byte Ed25519 seed, base64
#   grant-verify.keys    payment.grants.verify-keys-file and rail.proxy.grants.verify-keys-file:
#                        the matching public key, base64 (public, but shipped with the rest)
#   postgres-password    the PostgreSQL password of role dlock (compose only)
#   paydb-url, lockdb-url  the database URLs with that password (DLOCK_*_DATABASE_URL)
#
# Usage: deploy/make-secrets.sh [DIR] [--kubectl NAMESPACE]
#   --kubectl NS  also prints the `kubectl create secret` commands for deploy/k8s/ (run them).
# Refuses to overwrite an existing DIR: rotate by generating a new one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/deploy/secrets}"
NS=""
[ "${2:-}" = "--kubectl" ] && NS="${3:-dlock}"
command -v openssl >/dev/null || { echo "make-secrets: openssl not found" >&2; exit 1; }
[ -e "$DIR" ] && { echo "make-secrets: $DIR exists; remove it or pick another directory" >&2; exit 1; }
umask 077
mkdir -p "$DIR"
token() { openssl rand -hex 32; }
WORKER=$(token)
printf '# dlock credentials (C3-extensions E-13): <role> <token>\nworker %s\noperator %s\nreader %s\n' \
    "$WORKER" "$(token)" "$(token)" >"$DIR/credentials"
printf '%s\n' "$WORKER" >"$DIR/executor-token"
# The 32-byte seed and public key are the last 32 bytes of the DER encodings.
openssl genpkey -algorithm ed25519 -out "$DIR/grant.pem" 2>/dev/null
openssl pkey -in "$DIR/grant.pem" -outform DER | tail -c 32 | base64 >"$DIR/grant-signing.key"
openssl pkey -in "$DIR/grant.pem" -pubout -outform DER | tail -c 32 | base64 >"$DIR/grant-verify.keys"
rm -f "$DIR/grant.pem"
PG=$(openssl rand -hex 24)
printf '%s\n' "$PG" >"$DIR/postgres-password"
printf 'postgres://dlock:%s@postgres:5432/paydb\n' "$PG" >"$DIR/paydb-url"
printf 'postgres://dlock:%s@postgres:5432/lockdb\n' "$PG" >"$DIR/lockdb-url"
# The compose containers (uid 10001, postgres) read the files through bind mounts of the
# files themselves, so the files are 0644; the directory stays 0700, which keeps other
# users of this host out.
chmod 0644 "$DIR"/*
chmod 0700 "$DIR"
echo "make-secrets: wrote $DIR (keep it out of git; deploy/secrets/ is ignored)"
if [ -n "$NS" ]; then
    cat <<CMDS
kubectl -n $NS create secret generic dlock-auth --from-file=credentials=$DIR/credentials
kubectl -n $NS create secret generic dlock-executor-token --from-file=token=$DIR/executor-token
kubectl -n $NS create secret generic dlock-grant-signing --from-file=signing.key=$DIR/grant-signing.key
kubectl -n $NS create secret generic dlock-grant-verify --from-file=verify.keys=$DIR/grant-verify.keys
kubectl -n $NS create secret generic dlock-db --from-file=paydb-url=$DIR/paydb-url --from-file=lockdb-url=$DIR/lockdb-url
CMDS
fi
