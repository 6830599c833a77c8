#!/bin/sh
# Base images made without a container registry, from Debian's packages (debootstrap), for hosts
# that reach Debian's mirror and PyPI but no registry. Run as root (debootstrap chroots):
#   sh docker/base-image.sh
# It makes two local images:
#   localhost/clusterenv-base:bookworm   Debian bookworm (minbase), python3 (3.11) in a venv at
#                                        /opt/venv that is first on PATH: the Dockerfile's BASE
#   localhost/clusterenv-redis:bookworm  the base plus Debian's redis-server and redis-cli, for
#                                        compose.yaml's redis service (REDIS_IMAGE)
# ENGINE (podman) does the import and build; DEBIAN_MIRROR (deb.debian.org) is debootstrap's.
set -eu
ENGINE=${ENGINE:-podman}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=localhost/clusterenv-base:bookworm
REDIS=localhost/clusterenv-redis:bookworm

root=$(mktemp -d /var/tmp/clusterenv-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT

# minbase: essential and required packages only, plus what pip and useradd need.
debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates,passwd \
    bookworm "$root" "$MIRROR"
# pip refuses the system Python (PEP 668, EXTERNALLY-MANAGED): images install into a venv.
chroot "$root" python3 -m venv /opt/venv
chroot "$root" /opt/venv/bin/pip --version
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*

tar --numeric-owner -C "$root" -c . | "$ENGINE" import \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$BASE"

# Debian's redis-server (7.0 in bookworm) in place of redis:7.4-alpine. Its entrypoint is
# redis-server itself, run as the redis user, so compose.yaml's `redis-server ...` command works.
"$ENGINE" build --network host -t "$REDIS" -f - <<EOF
FROM $BASE
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \\
    && rm -rf /var/lib/apt/lists/*
USER redis
WORKDIR /var/lib/redis
EOF
"$ENGINE" images --filter reference=localhost/clusterenv-base --filter reference=localhost/clusterenv-redis
