#!/usr/bin/env bash
# What scripts/device-check.sh needs on a GPU machine that has Python 3.12 and torch but none of rqrl's other
# dependencies and no Redis: their cp312 manylinux wheels, and this machine's redis-server with its shared libraries,
# in .whl/ (git-excluded). Run from the repository root, here (the GPU machine reaches no package index); .whl/ then
# travels with the device run (carry it) and device-check.sh installs it into /tmp/site.
set -euo pipefail
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl/redis/lib
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1 \
           manylinux_2_31 manylinux_2_34; do
    platforms+=(--platform "${tag}_x86_64")
done
# rqrl's dependencies the GPU image lacks (its pip list: /work/.library/device/KINDS.md), at versions rqrl takes,
# each with the needs of its own that the image lacks (gymnasium: farama-notifications; rq: croniter)
for package in "gymnasium>=1.1,<2" farama-notifications "rq>=2.12,<2.13" "redis>=7.2.1,<9" "hiredis>=3.2" \
               "zstandard>=0.19" "blake3>=0.3.3" "tensorboardX>=2.6" "ale-py>=0.9" croniter fakeredis py-spy; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d .whl "$package"
done
server=$(command -v redis-server) || { echo "no redis-server on PATH to bundle: install one (apt install redis-server)"; exit 1; }
cp "$server" .whl/redis/redis-server.bin
ldd "$server" | awk '/=>/ {print $3}' | grep -v -E '/lib(c|m)\.so' | xargs -r -I{} cp -L {} .whl/redis/lib/
cat > .whl/redis/redis-server <<'WRAPPER'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib" exec "$here/redis-server.bin" "$@"
WRAPPER
chmod +x .whl/redis/redis-server
.whl/redis/redis-server --version
du -sh .whl
echo "then: the device tool's run with carry [\".whl\"] and the command 'OUT=\$OUT bash scripts/device-check.sh 2>&1'"
