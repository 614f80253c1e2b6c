#!/usr/bin/env bash
# Bootstrap a spare device for Farm: a dedicated virtual environment with Farm and the extras this hardware needs,
# then the node agent installed as a service (systemd on Linux, launchd on macOS) that starts at boot.
#
#   agents/install.sh --head HOST:PORT --token-file FILE --ca-hash sha256:HEX [--name N] [--cpus N] [--user]
#
# A system service runs the agent as root and its Ray, and so every job's code, as the unprivileged farm-ray (or
# --ray-user), which `farm agent install` makes if missing: the environment must be where that user can read it,
# so run as root its default is /opt/farm/venv, not root's private home.
#
# Safe to run twice: an existing environment is reused, Farm is reinstalled only when the source or the extras
# changed (or with --upgrade), and installing the service again rewrites the same files.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: install.sh --head HOST:PORT (--token TOKEN | --token-file FILE) (--ca-hash sha256:HEX | --insecure) [options]

  --head HOST:PORT     the head's gRPC address (what `farm head start` printed)
  --token TOKEN        the join token (visible in `ps` while this runs: prefer --token-file)
  --token-file FILE    a file holding the join token
  --ca-hash sha256:HEX the hash of the head's CA (in the join line): the agent pins the head's CA with it
  --insecure           a head started with --insecure (no TLS)
  --name NAME          the node's name (default: the host name)
  --cpus N             CPU cores to offer (default: all)
  --user               a per-user service (systemd --user, a LaunchAgent); default: a system service (uses sudo)
  --ray-user NAME      a system service: the user the agent's Ray and job code run as (default: farm-ray, made
                       if missing; root accepts that job code can read the agent's tokens and keys)
  --prefix DIR         the virtual environment (default: ~/.farm/venv; /opt/farm/venv for a system service
                       installed as root, which the Ray user must be able to read)
  --from PATH|SPEC     what to install: a source folder or a pip requirement (default: the repository of this script)
  --python PYTHON      the interpreter for the environment (default: python3; 3.11 or newer)
  --no-extras          install Farm alone: no torch, worker, cuda or apple extras (a head-less test, a CI box)
  --no-deps            install Farm without its dependencies (tests only: the agent cannot run)
  --no-service         stop after installing Farm: do not install the agent's service
  --upgrade            reinstall Farm even when the same source and extras are installed
  --dry-run            print what would be done; change nothing
EOF
}

die() { echo "install.sh: error: $*" >&2; exit 2; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PREFIX=""
FROM=$(dirname "$HERE")
PYTHON=python3
HEAD="" TOKEN="" TOKEN_FILE="" NAME="" CPUS="" CA_HASH="" INSECURE=0 RAY_USER=""
USER_SCOPE=0 NO_EXTRAS=0 NO_DEPS=0 NO_SERVICE=0 UPGRADE=0 DRY_RUN=0

while [ $# -gt 0 ]; do
    case "$1" in
        --head|--token|--token-file|--name|--cpus|--prefix|--from|--python|--ca-hash|--ray-user)
            [ $# -ge 2 ] || die "$1 needs a value"
            case "$1" in
                --head) HEAD=$2 ;; --token) TOKEN=$2 ;; --token-file) TOKEN_FILE=$2 ;; --name) NAME=$2 ;;
                --cpus) CPUS=$2 ;; --prefix) PREFIX=$2 ;; --from) FROM=$2 ;; --python) PYTHON=$2 ;;
                --ca-hash) CA_HASH=$2 ;; --ray-user) RAY_USER=$2 ;;
            esac
            shift 2 ;;
        --user) USER_SCOPE=1; shift ;;
        --insecure) INSECURE=1; shift ;;
        --no-extras) NO_EXTRAS=1; shift ;;
        --no-deps) NO_DEPS=1; shift ;;
        --no-service) NO_SERVICE=1; shift ;;
        --upgrade) UPGRADE=1; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

if [ "$NO_SERVICE" = 0 ]; then
    [ -n "$HEAD" ] || die "--head HOST:PORT is required (or --no-service)"
    [[ "$HEAD" == *:* ]] || die "--head $HEAD: expected HOST:PORT"
    if [ -n "$TOKEN" ] && [ -n "$TOKEN_FILE" ]; then die "give --token or --token-file, not both"; fi
    [ -n "$TOKEN" ] || [ -n "$TOKEN_FILE" ] || die "--token or --token-file is required (or --no-service)"
    if [ -n "$TOKEN_FILE" ]; then
        [ -r "$TOKEN_FILE" ] || die "--token-file $TOKEN_FILE: not a readable file"
        TOKEN_FILE=$(cd "$(dirname "$TOKEN_FILE")" && pwd)/$(basename "$TOKEN_FILE")  # sudo may change directory
    fi
    if [ -n "$CA_HASH" ] && [ "$INSECURE" = 1 ]; then die "give --ca-hash or --insecure, not both"; fi
    [ -n "$CA_HASH" ] || [ "$INSECURE" = 1 ] || die "--ca-hash (from the join line) or --insecure is required"
fi
[[ -z "$CPUS" || "$CPUS" =~ ^[1-9][0-9]*$ ]] || die "--cpus $CPUS: expected a positive whole number"
if [ -z "$PREFIX" ]; then
    if [ "$USER_SCOPE" = 0 ] && [ "$NO_SERVICE" = 0 ] && [ "$(id -u)" = 0 ]; then
        PREFIX=/opt/farm/venv  # readable by the Ray user, unlike /root
    else
        PREFIX="$HOME/.farm/venv"
    fi
fi

# Print a command, and run it unless this is a dry run.
run() {
    echo "+ $*"
    [ "$DRY_RUN" = 1 ] || "$@"
}

# Python 3.11 or newer.
command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: install Python 3.11 or newer, or name it with --python"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "Farm needs Python 3.11 or newer ($PYTHON is $("$PYTHON" --version 2>&1))"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
    || die "$PYTHON cannot make virtual environments (on Debian/Ubuntu: apt-get install python3-venv)"

# The extras this hardware needs.
EXTRAS=""
if [ "$NO_EXTRAS" = 0 ]; then
    EXTRAS="worker"
    if command -v nvidia-smi >/dev/null 2>&1; then EXTRAS="$EXTRAS,cuda"; fi
    if [ "$(uname -s)" = Darwin ] && [ "$(uname -m)" = arm64 ]; then EXTRAS="$EXTRAS,apple"; fi
fi

# A folder is installed as a path, anything else as a pip requirement (a wheel, a spec like farm==0.1.0).
if [ -d "$FROM" ]; then
    [ -f "$FROM/pyproject.toml" ] || die "--from $FROM: no pyproject.toml there"
    FROM=$(cd "$FROM" && pwd)
    REQUIREMENT="$FROM${EXTRAS:+[$EXTRAS]}"
else
    REQUIREMENT="$FROM"
    if [ -n "$EXTRAS" ] && [[ "$FROM" != *"["* ]]; then
        # farm==0.1.0 -> farm[worker]==0.1.0: extras go right after the project name
        REQUIREMENT=$(echo "$FROM" | sed -E "s/^([A-Za-z0-9_.-]+)/\\1[$EXTRAS]/")
    fi
fi

VENV_PYTHON="$PREFIX/bin/python"
PIP=("$VENV_PYTHON" -m pip install --quiet --disable-pip-version-check)
if [ -x "$VENV_PYTHON" ]; then
    "$VENV_PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || die "$PREFIX holds a Python older than 3.11: remove it or choose another --prefix"
    echo "using the virtual environment in $PREFIX"
else
    run "$PYTHON" -m venv "$PREFIX"
fi

# torch first and pinned, as scripts/setup does: an unpinned torch (pulled in by the worker extra) resolves to a
# multi-GB build and drifts from what the farm's other nodes run.
if [ -n "$EXTRAS" ] && ! { [ -x "$VENV_PYTHON" ] && "$VENV_PYTHON" -c 'import torch' 2>/dev/null; }; then
    run "${PIP[@]}" "torch==${FARM_TORCH_VERSION:-2.13.0}"
fi

# Farm itself, unless this very source and these extras are installed already (a stamp records them).
STAMP="$PREFIX/farm-install.txt"
WANTED="from=$REQUIREMENT no-deps=$NO_DEPS"
if [ "$UPGRADE" = 0 ] && [ -x "$PREFIX/bin/farm" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANTED" ]; then
    echo "Farm is installed in $PREFIX already ($REQUIREMENT; --upgrade reinstalls it)"
else
    OPTIONS=()
    [ "$NO_DEPS" = 0 ] || OPTIONS+=(--no-deps)
    [ "$UPGRADE" = 0 ] || OPTIONS+=(--upgrade)
    run "${PIP[@]}" ${OPTIONS[@]+"${OPTIONS[@]}"} "$REQUIREMENT"
    if [ "$DRY_RUN" = 0 ]; then echo "$WANTED" > "$STAMP"; fi
    echo "installed Farm ($REQUIREMENT) into $PREFIX"
fi

[ "$NO_SERVICE" = 0 ] || exit 0

ARGS=(agent install --head "$HEAD")
# A --token is handed on standard input (printf is the shell's own: no process shows it in `ps`).
if [ -n "$TOKEN_FILE" ]; then ARGS+=(--token-file "$TOKEN_FILE"); else ARGS+=(--token-file -); fi
[ -z "$NAME" ] || ARGS+=(--name "$NAME")
[ -z "$CPUS" ] || ARGS+=(--cpus "$CPUS")
[ -z "$RAY_USER" ] || ARGS+=(--ray-user "$RAY_USER")
if [ "$INSECURE" = 1 ]; then ARGS+=(--insecure); else ARGS+=(--ca-hash "$CA_HASH"); fi
[ "$USER_SCOPE" = 0 ] || ARGS+=(--user)
[ "$DRY_RUN" = 0 ] || ARGS+=(--dry-run)
SUDO=()
if [ "$USER_SCOPE" = 0 ] && [ "$DRY_RUN" = 0 ] && [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "a system service needs root, and there is no sudo: run as root, or --user"
    SUDO=(sudo)  # the service then runs the agent as this user (farm agent install reads SUDO_USER)
fi
if [ "$DRY_RUN" = 1 ] && [ ! -x "$PREFIX/bin/farm" ]; then
    echo "+ $PREFIX/bin/farm ${ARGS[*]}"
else
    printf '%s\n' "$TOKEN" | ${SUDO[@]+"${SUDO[@]}"} "$PREFIX/bin/farm" "${ARGS[@]}"
fi
