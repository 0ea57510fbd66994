#!/usr/bin/env bash
# install-redis.sh: make sure redis-server is on PATH for the store/redisstore
# tests. The tests start their own redis-server per run on a free loopback
# port (see store/redisstore/redistest), so the Debian package's own service
# is not needed; if the install started it, it is stopped again so it does not
# linger on 6379. Exits non-zero only if redis-server is still missing.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1; then
	echo "install-redis: redis-server already installed: $(command -v redis-server)"
	exit 0
fi

# port_6379_busy reports whether something accepts connections on 6379.
port_6379_busy() {
	(exec 3<>/dev/tcp/127.0.0.1/6379) >/dev/null 2>&1
}

# stop_package_service stops the Debian package's own redis service, best
# effort: nothing here may fail the script.
stop_package_service() {
	if command -v systemctl >/dev/null 2>&1; then
		systemctl stop redis-server >/dev/null 2>&1 || true
		systemctl disable redis-server >/dev/null 2>&1 || true
	fi
	if command -v service >/dev/null 2>&1; then
		service redis-server stop >/dev/null 2>&1 || true
	fi
	if port_6379_busy && command -v redis-cli >/dev/null 2>&1; then
		redis-cli -h 127.0.0.1 -p 6379 shutdown nosave >/dev/null 2>&1 || true
	fi
}

# Something already listening on 6379 before the install is not ours to stop.
busy_before=0
if port_6379_busy; then
	busy_before=1
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-redis: installing redis-server via apt-get"
apt-get update -qq
apt-get install -y -qq redis-server >/dev/null

if [[ $busy_before -eq 0 ]] && port_6379_busy; then
	echo "install-redis: stopping the package's own redis service on 6379"
	stop_package_service
fi

if ! command -v redis-server >/dev/null 2>&1; then
	echo "install-redis: redis-server is still not on PATH after apt-get install" >&2
	exit 1
fi
echo "install-redis: installed: $(redis-server --version)"
