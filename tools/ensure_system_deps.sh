#!/usr/bin/env bash
# Install the system tools the pip path needs, if missing: cmake and g++ (to build msg/ srv/),
# libssl-dev (Fast DDS headers), liburdfdom-tools (check_urdf, used by the URDF tests).
# Idempotent; uses apt-get only when something is missing and we are root.
set -euo pipefail
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
[ -e /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
[ -x /usr/bin/check_urdf ] || missing+=(liburdfdom-tools)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "robot_wm: missing system packages: ${missing[*]} (install them with your package manager)" >&2
  # check_urdf alone is optional: the venv carries urdfdom's check_urdf too
  [ "${missing[*]}" = "liburdfdom-tools" ] && exit 0
  exit 1
fi
echo "robot_wm: installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null || echo "robot_wm: apt-get update failed; trying the cached package lists" >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
