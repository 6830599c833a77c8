#!/bin/sh
# Base images made without a container registry, from Debian's packages (debootstrap), for hosts
# that reach Debian's mirror and PyPI but no registry. Run as root (debootstrap chroots):
#   sh docker/base-image.sh
# It imports two local images (no container is run, so it works before podman can run one):
#   localhost/clusterenv-base:bookworm   Debian bookworm (minbase) with python3 (3.11) in a venv at
#                                        /opt/venv, first on PATH: the Dockerfile's BASE
#   localhost/clusterenv-redis:bookworm  the same plus Debian's redis-server and redis-cli (7.0),
#                                        run as the redis user: compose.yaml's REDIS_IMAGE
# ENGINE (podman) does the imports; DEBIAN_MIRROR (deb.debian.org) is debootstrap's and apt's.
set -eu
ENGINE=${ENGINE:-podman}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=localhost/clusterenv-base:bookworm
REDIS=localhost/clusterenv-redis:bookworm
PATH_IN=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

root=$(mktemp -d /var/tmp/clusterenv-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT

# minbase: essential and required packages only, plus what pip and useradd need.
debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates,passwd \
    bookworm "$root" "$MIRROR"
# pip refuses the system Python (PEP 668, EXTERNALLY-MANAGED): images install into a venv.
chroot "$root" python3 -m venv /opt/venv
chroot "$root" /opt/venv/bin/pip --version

import_as() {  # the rootfs as TAG, the rest are --change lines
    tag=$1
    shift
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar --numeric-owner -C "$root" -c . | "$ENGINE" import \
        --change "ENV PATH=$PATH_IN" --change 'ENV LANG=C.UTF-8' "$@" - "$tag"
}
import_as "$BASE" --change 'CMD ["python3"]'

# Redis in place of redis:7.4-alpine: compose.yaml's command starts with `redis-server`, which is
# this image's PATH; USER redis, as the official image's entrypoint drops root to it.
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"  # no service starts in the chroot
chmod +x "$root/usr/sbin/policy-rc.d"
chroot "$root" apt-get update
chroot "$root" apt-get install -y --no-install-recommends redis-server
rm "$root/usr/sbin/policy-rc.d"
import_as "$REDIS" --change 'USER redis' --change 'WORKDIR /var/lib/redis' \
    --change 'CMD ["redis-server"]'

"$ENGINE" images --filter reference=localhost/clusterenv-base \
    --filter reference=localhost/clusterenv-redis
